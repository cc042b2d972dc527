//! The llama's LoRA adapters (`[model.lora]`, `model::lora`): each block's, in the block after
//! its own parameters (`layers.3.lora.q_proj.lora_a.weight`), named as PEFT names them
//! (`layers.3.self_attn.q_proj.lora_A.weight`, which Hugging Face's names prefix with
//! `model.` and PEFT's with `base_model.model.model.`).

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::{Block, Llama};
use crate::model::lora::{Lora, LoraSpec};

/// The modules a llama's adapters may target, in a block's order, with the submodule that holds
/// each (transformers' `self_attn` and `mlp`).
pub const TARGETS: [(&str, &str); 7] = [
    ("q_proj", "self_attn"),
    ("k_proj", "self_attn"),
    ("v_proj", "self_attn"),
    ("o_proj", "self_attn"),
    ("gate_proj", "mlp"),
    ("up_proj", "mlp"),
    ("down_proj", "mlp"),
];

/// PEFT's default `target_modules` for llama (and Mistral, Qwen2).
pub const DEFAULT: [&str; 2] = ["q_proj", "v_proj"];

/// One block's adapters, those of the targeted modules.
#[derive(Module, Debug)]
pub struct BlockLora<B: Backend> {
    pub q_proj: Option<Lora<B>>,
    pub k_proj: Option<Lora<B>>,
    pub v_proj: Option<Lora<B>>,
    pub o_proj: Option<Lora<B>>,
    pub gate_proj: Option<Lora<B>>,
    pub up_proj: Option<Lora<B>>,
    pub down_proj: Option<Lora<B>>,
}

impl Llama {
    /// Each adaptable module's `(name, in, out)`.
    pub(super) fn adaptable(&self) -> [(&'static str, usize, usize); 7] {
        let (d, f) = (self.dim, self.ffn_dim);
        let kv = self.kv_heads * self.head_dim();
        [
            ("q_proj", d, d),
            ("k_proj", d, kv),
            ("v_proj", d, kv),
            ("o_proj", d, d),
            ("gate_proj", d, f),
            ("up_proj", d, f),
            ("down_proj", f, d),
        ]
    }

    /// A block's adapters, when `[model.lora]` asks for them.
    pub(super) fn block_lora<B: Backend>(&self, device: &B::Device) -> Option<BlockLora<B>> {
        let s = self.lora.as_ref()?;
        let [q, k, v, o, g, u, dn] = self
            .adaptable()
            .map(|(name, i, out)| s.build::<B>(name, i, out, device));
        Some(BlockLora {
            q_proj: q,
            k_proj: k,
            v_proj: v,
            o_proj: o,
            gate_proj: g,
            up_proj: u,
            down_proj: dn,
        })
    }

    /// Block `b`'s adapter of the module `pick` takes, with the spec it runs with.
    pub(super) fn adapter<'a, B: Backend>(
        &'a self,
        b: &'a Block<B>,
        pick: fn(&BlockLora<B>) -> &Option<Lora<B>>,
    ) -> Option<(&'a Lora<B>, &'a LoraSpec)> {
        Some((pick(b.lora.as_ref()?).as_ref()?, self.lora.as_ref()?))
    }

    /// The adapters' parameters of the sizes, counted before anything is built.
    pub(super) fn adapter_count(&self) -> u128 {
        self.lora.as_ref().map_or(0, |s| {
            s.params_per_block(&self.adaptable()) * self.layers as u128
        })
    }
}

/// PyTorch's (PEFT's) name of an adapter's parameter at kiln path `path`
/// (`layers.3.lora.q_proj.lora_a.weight` -> `layers.3.self_attn.q_proj.lora_A.weight`); `None`
/// for any other path.
pub fn torch_name(path: &str) -> Option<String> {
    let (block, rest) = path.split_once(".lora.")?;
    let (module, rest) = rest.split_once('.')?;
    let (_, owner) = TARGETS.iter().find(|(m, _)| *m == module)?;
    let rest = rest
        .replacen("lora_a.", "lora_A.", 1)
        .replacen("lora_b.", "lora_B.", 1);
    Some(format!("{block}.{owner}.{module}.{rest}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn adapter_names_are_pefts() {
        assert_eq!(
            super::torch_name("layers.3.lora.q_proj.lora_a.weight").as_deref(),
            Some("layers.3.self_attn.q_proj.lora_A.weight")
        );
        assert_eq!(
            super::torch_name("layers.0.lora.down_proj.lora_b.weight").as_deref(),
            Some("layers.0.mlp.down_proj.lora_B.weight")
        );
        assert_eq!(super::torch_name("layers.0.self_attn.q_proj.weight"), None);
    }
}
