//! The llama's LoRA adapters (`[model.lora]`, `model::lora`): each block's, in the block after
//! its own parameters (`layers.3.lora.q_proj.lora_a.weight`), named as PEFT names them
//! (`layers.3.self_attn.q_proj.lora_A.weight`, which Hugging Face's names prefix with
//! `model.` and PEFT's with `base_model.model.model.`).

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::{Arch, Block, Llama};
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
    /// Each adaptable module's `(name, in, out)`: the architecture's own Linear layers (not
    /// Phi-3's fused ones, nor Mixtral's experts).
    pub(super) fn adaptable(&self) -> Vec<(&'static str, usize, usize)> {
        let (d, f) = (self.dim, self.ffn_dim);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let all = [
            ("q_proj", d, q),
            ("k_proj", d, kv),
            ("v_proj", d, kv),
            ("o_proj", q, d),
            ("gate_proj", d, f),
            ("up_proj", d, f),
            ("down_proj", f, d),
        ];
        let has = |name: &str| match self.arch {
            Arch::Phi3 => matches!(name, "o_proj" | "down_proj"),
            Arch::Mixtral => matches!(name, "q_proj" | "k_proj" | "v_proj" | "o_proj"),
            _ => true,
        };
        all.into_iter().filter(|(n, ..)| has(n)).collect()
    }

    /// A block's adapters, when `[model.lora]` asks for them.
    pub(super) fn block_lora<B: Backend>(&self, device: &B::Device) -> Option<BlockLora<B>> {
        let s = self.lora.as_ref()?;
        let layers = self.adaptable();
        let one = |name: &str| {
            layers
                .iter()
                .find(|(n, ..)| *n == name)
                .and_then(|&(n, i, o)| s.build::<B>(n, i, o, device))
        };
        Some(BlockLora {
            q_proj: one("q_proj"),
            k_proj: one("k_proj"),
            v_proj: one("v_proj"),
            o_proj: one("o_proj"),
            gate_proj: one("gate_proj"),
            up_proj: one("up_proj"),
            down_proj: one("down_proj"),
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
