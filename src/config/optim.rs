//! `[optim]`: the optimizer (PyTorch semantics).

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// Optimizer algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimKind {
    Sgd,
    Adam,
    Adamw,
}

/// `[optim]` (PyTorch semantics for every algorithm).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// sgd, adam or adamw. Default: `"sgd"`.
    pub kind: OptimKind,
    /// Peak learning rate. Default: `0.01`.
    pub lr: f64,
    /// sgd: momentum factor in [0, 1). Default: `0.0`.
    pub momentum: f64,
    /// sgd: Nesterov momentum (needs momentum > 0). Default: `false`.
    pub nesterov: bool,
    /// L2 penalty (sgd, adam) or decoupled decay (adamw). Default: `0.0`.
    pub weight_decay: f64,
    /// adam/adamw: (beta1, beta2). Default: `[0.9, 0.999]`.
    pub betas: [f64; 2],
    /// adam/adamw: denominator epsilon. Default: `1e-8`.
    pub eps: f64,
    /// Clip the global gradient norm to this value. Default: unset (no clipping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_clip_norm: Option<f64>,
    /// Which parameters `weight_decay` applies to: `"matrices"` (those of two or more
    /// dimensions: weights and embeddings, not biases or norms; nanoGPT's and torchtitan's
    /// rule) or `"all"`. Default: `"matrices"` for gpt, `"all"` for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay: Option<DecayRule>,
}

/// `optim.decay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayRule {
    Matrices,
    All,
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            kind: OptimKind::Sgd,
            lr: 0.01,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            betas: [0.9, 0.999],
            eps: 1e-8,
            grad_clip_norm: None,
            decay: None,
        }
    }
}

impl OptimConfig {
    /// Rates and coefficients in their ranges; Nesterov only with SGD momentum.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        let o = self;
        in_range(r, "optim.lr", o.lr, o.lr >= 0.0, "at least 0")?;
        in_range(
            r,
            "optim.momentum",
            o.momentum,
            (0.0..1.0).contains(&o.momentum),
            "in [0, 1)",
        )?;
        in_range(
            r,
            "optim.weight_decay",
            o.weight_decay,
            o.weight_decay >= 0.0,
            "at least 0",
        )?;
        in_range(r, "optim.eps", o.eps, o.eps > 0.0, "greater than 0")?;
        for (i, b) in o.betas.iter().enumerate() {
            in_range(
                r,
                "optim.betas",
                *b,
                (0.0..1.0).contains(b),
                &format!("in [0, 1) (betas[{i}])"),
            )?;
        }
        if let Some(g) = o.grad_clip_norm {
            in_range(r, "optim.grad_clip_norm", g, g > 0.0, "greater than 0")?;
        }
        if o.nesterov && (o.kind != OptimKind::Sgd || o.momentum <= 0.0) {
            return Err(r.key_error(
                "optim.nesterov",
                "`optim.nesterov` = true needs `optim.kind` = \"sgd\" and `optim.momentum` > 0"
                    .into(),
                None,
            ));
        }

        Ok(())
    }
}
