//! Optimizers over flat host `f32` buffers with PyTorch semantics (SGD with momentum/dampening 0 and
//! Nesterov, Adam with L2 weight decay, AdamW with decoupled decay). Working on flat buffers means
//! the same code updates a whole model (single, dp, ddp) or one rank's shard (fsdp), and its state
//! is plain vectors that checkpoint and reshard trivially. `device.rs` has the same optimizers as
//! Burn tensor ops for parameters kept on a device; one test holds the two equal.

use crate::checkpoint::OptState;
use crate::config::{OptimConfig, OptimKind};

#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    pub kind: OptimKind,
    pub momentum: f32,
    pub nesterov: bool,
    pub weight_decay: f32,
    pub betas: [f32; 2],
    pub eps: f32,
    /// Steps taken so far.
    pub steps: u64,
    /// SGD momentum buffer, or Adam's first moment. Empty until the first step.
    pub m: Vec<f32>,
    /// Adam's second moment. Empty for SGD.
    pub v: Vec<f32>,
}

impl Optimizer {
    pub fn new(c: &OptimConfig) -> Self {
        Optimizer {
            kind: c.kind,
            momentum: c.momentum as f32,
            nesterov: c.nesterov,
            weight_decay: c.weight_decay as f32,
            betas: [c.betas[0] as f32, c.betas[1] as f32],
            eps: c.eps as f32,
            steps: 0,
            m: Vec::new(),
            v: Vec::new(),
        }
    }

    /// The state to checkpoint.
    pub fn export(&self) -> OptState {
        OptState {
            steps: self.steps,
            m: self.m.clone(),
            v: self.v.clone(),
        }
    }

    /// Takes the state of `o` restricted to `range` (zero-padded to `len` elements).
    pub fn import(&mut self, o: &OptState, range: std::ops::Range<usize>, len: usize) {
        let take = |v: &[f32]| -> Vec<f32> {
            if v.is_empty() {
                return Vec::new();
            }
            let mut out = v[range.clone()].to_vec();
            out.resize(len, 0.0);
            out
        };
        self.steps = o.steps;
        self.m = take(&o.m);
        self.v = take(&o.v);
    }

    /// Takes the whole state of `o`.
    pub fn import_whole(&mut self, o: &OptState) {
        let n = o.m.len().max(o.v.len());
        self.import(o, 0..n, n);
    }

    /// Bytes of optimizer state held.
    pub fn state_bytes(&self) -> usize {
        (self.m.len() + self.v.len()) * std::mem::size_of::<f32>()
    }

    /// One update of `params` by `grads` at learning rate `lr`.
    pub fn step(&mut self, params: &mut [f32], grads: &[f32], lr: f64) {
        debug_assert_eq!(params.len(), grads.len());
        let lr = lr as f32;
        let wd = self.weight_decay;
        self.steps += 1;
        match self.kind {
            OptimKind::Sgd => {
                if self.momentum == 0.0 {
                    for (p, g) in params.iter_mut().zip(grads) {
                        *p -= lr * (g + wd * *p);
                    }
                    return;
                }
                let mu = self.momentum;
                let first = self.m.is_empty();
                if first {
                    self.m = vec![0.0; params.len()];
                }
                for ((p, g), b) in params.iter_mut().zip(grads).zip(self.m.iter_mut()) {
                    let d = g + wd * *p;
                    *b = if first { d } else { mu * *b + d };
                    let upd = if self.nesterov { d + mu * *b } else { *b };
                    *p -= lr * upd;
                }
            }
            OptimKind::Adam | OptimKind::Adamw => {
                if self.m.is_empty() {
                    self.m = vec![0.0; params.len()];
                    self.v = vec![0.0; params.len()];
                }
                let [b1, b2] = self.betas;
                let t = self.steps as i32;
                let bc1 = 1.0 - b1.powi(t);
                let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
                let step_size = lr / bc1;
                let decoupled = self.kind == OptimKind::Adamw;
                for (((p, g), m), v) in params
                    .iter_mut()
                    .zip(grads)
                    .zip(self.m.iter_mut())
                    .zip(self.v.iter_mut())
                {
                    let g = if decoupled {
                        *p *= 1.0 - lr * wd;
                        *g
                    } else {
                        g + wd * *p
                    };
                    *m = b1 * *m + (1.0 - b1) * g;
                    *v = b2 * *v + (1.0 - b2) * g * g;
                    let denom = v.sqrt() / bc2_sqrt + self.eps;
                    *p -= step_size * *m / denom;
                }
            }
        }
    }
}

/// Sum of squares of a gradient buffer (f64 accumulation).
pub fn sum_squares(grads: &[f32]) -> f64 {
    grads.iter().map(|g| f64::from(*g) * f64::from(*g)).sum()
}

/// torch `clip_grad_norm_`'s factor for gradients whose global norm is `total_norm`: `None` when
/// they are within `max_norm` already. Every clipping path (host, device, sharded) uses this.
pub fn clip_coef(total_norm: f64, max_norm: f64) -> Option<f64> {
    let coef = max_norm / (total_norm + 1e-6);
    (coef < 1.0).then_some(coef)
}

/// torch `clip_grad_norm_`: scales `grads` so the global norm is at most `max_norm`, given the
/// global norm computed over every shard. Returns the norm before clipping.
pub fn clip_by_norm(grads: &mut [f32], total_norm: f64, max_norm: f64) -> f64 {
    if let Some(coef) = clip_coef(total_norm, max_norm) {
        let c = coef as f32;
        grads.iter_mut().for_each(|g| *g *= c);
    }
    total_norm
}

/// Clips by the global norm of whole (already synchronised) gradients, then steps.
pub fn clip_and_step(
    opt: &mut Optimizer,
    params: &mut [f32],
    grads: &mut [f32],
    lr: f64,
    clip: Option<f64>,
) {
    if let Some(max_norm) = clip {
        let norm = sum_squares(grads).sqrt();
        clip_by_norm(grads, norm, max_norm);
    }
    opt.step(params, grads, lr);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(kind: OptimKind, momentum: f64, nesterov: bool, wd: f64) -> Optimizer {
        Optimizer::new(&OptimConfig {
            kind,
            lr: 0.1,
            momentum,
            nesterov,
            weight_decay: wd,
            ..OptimConfig::default()
        })
    }

    #[test]
    fn sgd_momentum_matches_torch_by_hand() {
        // torch: buf = g (first), then buf = mu*buf + g; p -= lr*buf
        let mut o = opt(OptimKind::Sgd, 0.9, false, 0.0);
        let mut p = vec![1.0f32];
        o.step(&mut p, &[0.5], 0.1);
        assert!((p[0] - 0.95).abs() < 1e-7);
        o.step(&mut p, &[0.5], 0.1);
        // buf = 0.9*0.5 + 0.5 = 0.95
        assert!((p[0] - (0.95 - 0.095)).abs() < 1e-6);
    }

    #[test]
    fn adam_first_step_is_lr_sized() {
        let mut o = opt(OptimKind::Adam, 0.0, false, 0.0);
        let mut p = vec![0.0f32, 0.0];
        o.step(&mut p, &[3.0, -0.001], 0.1);
        assert!((p[0] + 0.1).abs() < 1e-5, "{}", p[0]);
        assert!((p[1] - 0.1).abs() < 1e-3, "{}", p[1]);
        assert_eq!(o.state_bytes(), 16);
    }

    #[test]
    fn adamw_decays_decoupled() {
        let mut o = opt(OptimKind::Adamw, 0.0, false, 0.5);
        let mut p = vec![2.0f32];
        o.step(&mut p, &[0.0], 0.1);
        // p *= 1 - 0.1*0.5, zero gradient moves nothing else
        assert!((p[0] - 1.9).abs() < 1e-6);
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let mut g = vec![3.0f32, 4.0];
        let n = sum_squares(&g).sqrt();
        clip_by_norm(&mut g, n, 1.0);
        assert!((sum_squares(&g).sqrt() - 1.0).abs() < 1e-5);
    }
}
