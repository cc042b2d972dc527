//! The llama family's checks of its sizes and of what each architecture takes, before anything
//! is built: every error names its key.

use super::{Arch, Llama, LlamaKeys};
use crate::config::Resolved;
use crate::model::api::ModelError;
use crate::model::sizing::{check_token_data, sized_for_this_machine};

impl Llama {
    /// Every size in range and consistent, the data token windows of `block + 1`.
    pub(super) fn check(
        &self,
        r: &Resolved,
        k: &LlamaKeys,
        input: &[usize],
    ) -> Result<(), ModelError> {
        let explicit_head_dim = k.head_dim.is_some();
        let err = |key: &str, message: String, help: &str| -> ModelError {
            r.key_error(key, message, Some(help.to_string())).into()
        };
        let range = |key: &str, message: String, help: &str| -> ModelError {
            r.range_error(key, message, Some(help.to_string())).into()
        };
        for (key, v) in [
            ("model.block_size", self.block),
            ("model.layers", self.layers),
            ("model.heads", self.heads),
            ("model.kv_heads", self.kv_heads),
            ("model.dim", self.dim),
            ("model.ffn_dim", self.ffn_dim),
            ("model.vocab_size", self.vocab),
        ] {
            if v == 0 {
                return Err(range(
                    key,
                    format!("`{key}` = 0 is out of range: must be at least 1"),
                    "a llama needs at least one of each",
                ));
            }
        }
        sized_for_this_machine(
            r,
            "llama",
            self.param_count(),
            &[
                ("model.layers", self.layers, 4),
                ("model.dim", self.dim, 128),
                ("model.ffn_dim", self.ffn_dim, 352),
                ("model.vocab_size", self.vocab, 256),
            ],
        )?;
        let mut pairs = vec![(
            "model.heads",
            self.heads,
            "model.kv_heads",
            self.kv_heads,
            "each key/value head serves heads / kv_heads query heads",
        )];
        if !explicit_head_dim {
            pairs.push((
                "model.dim",
                self.dim,
                "model.heads",
                self.heads,
                "every head gets dim / heads channels (or set `model.head_dim`)",
            ));
        }
        for (a, va, b, vb, why) in pairs {
            if va % vb != 0 {
                return Err(err(
                    a,
                    format!("`{a}` = {va} is not a multiple of `{b}` = {vb}"),
                    &format!("{why}; change one of them"),
                ));
            }
        }
        if !self.head_dim.is_multiple_of(2) || self.head_dim == 0 {
            let (key, help) = if explicit_head_dim {
                ("model.head_dim", "choose an even head_dim")
            } else {
                ("model.heads", "choose heads so that dim / heads is even")
            };
            return Err(err(
                key,
                format!(
                    "the heads' width (`model.dim` / `model.heads` = {} / {}, or `model.head_dim`) = {} is odd or 0, but rotary embeddings rotate channel pairs",
                    self.dim, self.heads, self.head_dim
                ),
                help,
            ));
        }
        self.check_arch(r, k)?;
        for (key, v) in [
            ("model.rope_theta", self.rope_theta),
            ("model.norm_eps", self.norm_eps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(range(
                    key,
                    format!("`{key}` = {v} is out of range: must be above 0"),
                    "Llama's are 10000 (500000 for Llama 3) and 1e-5",
                ));
            }
        }
        if let Some(s) = &self.rope_scaling {
            if let Some(why) = rope_scaling_fault(s, self.arch) {
                return Err(range(
                    "model.rope_scaling",
                    format!("`model.rope_scaling` = {s:?}: {why}"),
                    "Llama 3.1's: { rope_type = \"llama3\", factor = 8, low_freq_factor = 1, high_freq_factor = 4, original_max_position_embeddings = 8192 }; Gemma 3's: { rope_type = \"linear\", factor = 8 }",
                ));
            }
        }
        check_token_data(r, "llama", self.vocab, self.block, input)
    }

    /// The parameters its sizes give, counted before anything is built (u128: no size
    /// overflows it).
    pub(super) fn param_count(&self) -> u128 {
        let (d, v, f, l) = (
            self.dim as u128,
            self.vocab as u128,
            self.ffn_dim as u128,
            self.layers as u128,
        );
        let hd = self.head_dim as u128;
        let (q, kv) = (self.heads as u128 * hd, self.kv_heads as u128 * hd);
        let bias = if self.attn_bias { q + 2 * kv } else { 0 };
        let qk_norm = if self.arch.qk_norm() { 2 * hd } else { 0 };
        let norms = if self.arch == Arch::Gemma3 {
            4 * d
        } else {
            2 * d
        };
        let mlp = match &self.moe {
            Some(m) => m.experts as u128 * (3 * d * f + d),
            None => 3 * d * f,
        };
        let block = 2 * d * q + 2 * d * kv + bias + qk_norm + norms + mlp;
        let head = if self.tie { 0 } else { v * d };
        v * d + l * block + d + head + self.adapter_count()
    }

    /// The keys only some architectures read, set for another; Gemma 3's and Mixtral's numbers
    /// in range; the layer types one per layer.
    fn check_arch(&self, r: &Resolved, k: &LlamaKeys) -> Result<(), ModelError> {
        let kind = self.arch.kind();
        let only = [
            ("attn_bias", k.attn_bias.is_some_and(|b| b), Arch::Llama),
            (
                "rope_local_theta",
                k.rope_local_theta.is_some(),
                Arch::Gemma3,
            ),
            (
                "query_pre_attn_scalar",
                k.query_pre_attn_scalar.is_some(),
                Arch::Gemma3,
            ),
            ("experts", k.experts.is_some(), Arch::Mixtral),
            (
                "experts_per_token",
                k.experts_per_token.is_some(),
                Arch::Mixtral,
            ),
            (
                "router_aux_loss_coef",
                k.router_aux_loss_coef.is_some(),
                Arch::Mixtral,
            ),
        ];
        for (key, set, arch) in only {
            if set && self.arch != arch {
                let dotted = format!("model.{key}");
                return Err(r
                    .key_error(
                        &dotted,
                        format!("`{dotted}` is {}'s; this model is `{kind}`", arch.kind()),
                        Some(format!(
                            "remove it, or set `model.kind = \"{}\"`",
                            arch.kind()
                        )),
                    )
                    .into());
            }
        }
        let range = |key: &str, message: String, help: &str| -> ModelError {
            r.range_error(key, message, Some(help.to_string())).into()
        };
        if let Some(types) = &k.layer_types {
            if types.len() != self.layers {
                return Err(range(
                    "model.layer_types",
                    format!(
                        "`model.layer_types` has {} entries for {} layers",
                        types.len(),
                        self.layers
                    ),
                    "give one per layer",
                ));
            }
        }
        // transformers' Mistral, Phi-3 and Mixtral slide every layer or none
        let mixed = self.sliding.contains(&true) && self.sliding.contains(&false);
        let takes = matches!(self.arch, Arch::Qwen3 | Arch::Gemma3)
            || (self.arch == Arch::Llama && self.attn_bias);
        if mixed && self.sliding_window.is_some() && !takes {
            let theirs = match self.arch {
                Arch::Phi3 => "Phi-3",
                Arch::Mixtral => "Mixtral",
                _ => "Mistral",
            };
            return Err(range(
                "model.layer_types",
                format!("`model.layer_types` mixes sliding and full layers, which transformers' {theirs} does not compute (it slides every layer)"),
                "make every layer \"sliding_attention\", or leave `model.sliding_window` out",
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(range(
                "model.sliding_window",
                "`model.sliding_window` = 0 is out of range: must be at least 1".into(),
                "a position attends at least to itself",
            ));
        }
        for (key, v) in [
            ("model.rope_local_theta", self.rope_local_theta),
            (
                "model.query_pre_attn_scalar",
                k.query_pre_attn_scalar.unwrap_or(1.0),
            ),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(range(
                    key,
                    format!("`{key}` = {v} is out of range: must be above 0"),
                    "Gemma 3's are 10000 and its head_dim",
                ));
            }
        }
        if let Some(m) = &self.moe {
            if m.experts == 0 || m.top_k == 0 || m.top_k > m.experts {
                return Err(range(
                    "model.experts_per_token",
                    format!(
                        "`model.experts_per_token` = {} with `model.experts` = {}: must be 1 to experts",
                        m.top_k, m.experts
                    ),
                    "Mixtral routes each token to 2 of 8 experts",
                ));
            }
            if !(m.aux_coef.is_finite() && m.aux_coef >= 0.0) {
                return Err(range(
                    "model.router_aux_loss_coef",
                    format!(
                        "`model.router_aux_loss_coef` = {} is out of range: must be 0 or above",
                        m.aux_coef
                    ),
                    "Mixtral's is 0.001 (0 leaves the load-balancing loss out)",
                ));
            }
        }
        Ok(())
    }
}

/// What is wrong with a rope scaling of `arch`, if anything: llama3 takes all four numbers,
/// linear `factor` alone; every number in range; Phi-3 takes none (transformers' Phi-3 takes
/// longrope alone, so an export would not load).
fn rope_scaling_fault(s: &super::RopeScaling, arch: Arch) -> Option<String> {
    if arch == Arch::Phi3 {
        return Some("transformers' Phi-3 computes no llama3 or linear scaling (it takes longrope alone, which kiln does not compute): leave it out for kind phi3".into());
    }
    let llama3 = [
        ("low_freq_factor", s.low_freq_factor.is_some()),
        ("high_freq_factor", s.high_freq_factor.is_some()),
        (
            "original_max_position_embeddings",
            s.original_max_position_embeddings.is_some(),
        ),
    ];
    if !(s.factor.is_finite() && s.factor > 0.0) {
        return Some("factor must be above 0".into());
    }
    match s.rope_type {
        super::RopeType::Linear => llama3
            .iter()
            .find(|(_, set)| *set)
            .map(|(k, _)| format!("`{k}` is llama3's: linear scaling takes `factor` alone")),
        super::RopeType::Llama3 => {
            if let Some((k, _)) = llama3.iter().find(|(_, set)| !*set) {
                return Some(format!("rope_type \"llama3\" needs `{k}` too"));
            }
            let (low, high) = (
                s.low_freq_factor.unwrap_or(0.0),
                s.high_freq_factor.unwrap_or(0.0),
            );
            (!(low > 0.0 && high > low && s.original_max_position_embeddings > Some(0))).then(|| {
                "out of range: low_freq_factor must be above 0, high_freq_factor above low_freq_factor, original_max_position_embeddings at least 1".into()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Arch, RopeScaling};

    fn rope_scaling_fault(s: &RopeScaling) -> Option<String> {
        super::rope_scaling_fault(s, Arch::Llama)
    }

    #[test]
    fn a_rope_scaling_takes_its_types_numbers_alone() {
        assert_eq!(rope_scaling_fault(&RopeScaling::linear(8.0)), None);
        assert_eq!(
            rope_scaling_fault(&RopeScaling::llama3(8.0, 1.0, 4.0, 8192)),
            None
        );
        let mut linear = RopeScaling::linear(8.0);
        linear.low_freq_factor = Some(1.0);
        let mut llama3 = RopeScaling::llama3(8.0, 1.0, 4.0, 8192);
        llama3.original_max_position_embeddings = None;
        for (s, says) in [
            (RopeScaling::linear(0.0), "factor must be above 0"),
            (RopeScaling::linear(f64::NAN), "factor must be above 0"),
            (linear, "`low_freq_factor` is llama3's"),
            (llama3, "needs `original_max_position_embeddings`"),
            (RopeScaling::llama3(8.0, 4.0, 1.0, 8192), "out of range"),
        ] {
            let why = rope_scaling_fault(&s).unwrap_or_default();
            assert!(why.contains(says), "{s:?}: {why}");
        }
    }
}
