//! The gpt's LoRA adapters (`[model.lora]`, `model::lora`): each block's, in the block after
//! its own parameters (`blocks.3.lora.c_attn.lora_a.weight`), named as PEFT names GPT-2's
//! (`transformer.h.3.attn.c_attn.lora_A.weight`). PEFT's `c_proj` target is both the
//! attention's and the MLP's projection (it matches module names by their last part).

use burn::module::Module;
use burn::tensor::backend::Backend;

use super::{BlockModule, Gpt};
use crate::model::lora::{Lora, LoraSpec};

/// The target names a gpt's adapters take (GPT-2's module names).
pub const TARGETS: [&str; 3] = ["c_attn", "c_proj", "c_fc"];

/// PEFT's default `target_modules` for GPT-2.
pub const DEFAULT: [&str; 1] = ["c_attn"];

/// One block's adapters, those of the targeted modules: kiln's `c_attn`, `c_proj`, `mlp_fc`
/// (GPT-2's `mlp.c_fc`) and `mlp_proj` (`mlp.c_proj`).
#[derive(Module, Debug)]
pub struct BlockLora<B: Backend> {
    pub c_attn: Option<Lora<B>>,
    pub c_proj: Option<Lora<B>>,
    pub mlp_fc: Option<Lora<B>>,
    pub mlp_proj: Option<Lora<B>>,
}

impl Gpt {
    /// Each adaptable module's `(target name, in, out)`, in kiln's order.
    pub(super) fn adaptable(&self) -> [(&'static str, usize, usize); 4] {
        let d = self.dim;
        [
            ("c_attn", d, 3 * d),
            ("c_proj", d, d),
            ("c_fc", d, 4 * d),
            ("c_proj", 4 * d, d),
        ]
    }

    /// A block's adapters, when `[model.lora]` asks for them.
    pub(super) fn block_lora<B: Backend>(&self, device: &B::Device) -> Option<BlockLora<B>> {
        let s = self.lora.as_ref()?;
        let [a, p, f, m] = self
            .adaptable()
            .map(|(name, i, out)| s.build::<B>(name, i, out, device));
        Some(BlockLora {
            c_attn: a,
            c_proj: p,
            mlp_fc: f,
            mlp_proj: m,
        })
    }

    /// Block `b`'s adapter of the module `pick` takes, with the spec it runs with.
    pub(super) fn adapter<'a, B: Backend>(
        &'a self,
        b: &'a BlockModule<B>,
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

/// The module path an adapter at kiln path `path` adapts and the rest of its path
/// (`blocks.3.lora.mlp_fc.lora_a.weight` -> (`blocks.3.mlp_fc`, `lora_A.weight`)); `None` for
/// any other path.
pub fn adapted_module(path: &str) -> Option<(String, String)> {
    let (block, rest) = path.split_once(".lora.")?;
    let (module, rest) = rest.split_once('.')?;
    let rest = rest
        .replacen("lora_a.", "lora_A.", 1)
        .replacen("lora_b.", "lora_B.", 1);
    Some((format!("{block}.{module}"), rest))
}
