//! `[model]`: the model family and its sizes.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// Activation between hidden layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Gelu,
    Tanh,
    Sigmoid,
}

/// `model.gelu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluKind {
    Exact,
    Tanh,
}

/// `model.init_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitFormat {
    Auto,
    Kiln,
    HfGpt2,
    Nanogpt,
}

/// `[model]`. Keys kiln does not know are kept in `extra`: a model family registered by the
/// user's own binary reads them with `Resolved::model_keys`; for kiln's own families they are
/// unknown keys (an error naming the key, its source and the closest key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Model family: a name in the model registry (built in: `"mlp"`, `"cnn"`, `"gpt"`).
    /// Default: `"mlp"`.
    pub kind: String,
    /// mlp: input features. Default: `1000`.
    pub input_size: usize,
    /// Widths of the hidden Linear layers, in order (cnn: after the convolutions). Default:
    /// `[500]`.
    pub hidden_sizes: Vec<usize>,
    /// cnn: output channels of each stage Conv2d -> ReLU -> MaxPool2d(2), in order; required for
    /// cnn. Default: `[]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<usize>,
    /// cnn: the (odd) kernel size of every Conv2d, padded to keep the image size. Default: `3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_size: Option<usize>,
    /// gpt: vocabulary size (at least 256 for byte-level text). Default: `256`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// gpt: tokens of context (and of each training window). Default: `128`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    /// gpt: transformer blocks. Default: `4`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// gpt: attention heads (`dim` must be a multiple). Default: `4`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// gpt: embedding width. Default: `128`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// gpt: biases in the Linear and LayerNorm layers. Default: `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias: Option<bool>,
    /// gpt: the output layer shares the token embedding's weights. Default: `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie_embeddings: Option<bool>,
    /// gpt: the MLP's GELU, `"exact"` (erf; nanoGPT's and PyTorch's `nn.GELU()`) or `"tanh"`
    /// (the tanh approximation: GPT-2's, Hugging Face's `gelu_new`). Default: `"exact"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gelu: Option<GeluKind>,
    /// Start training from these weights instead of the seeded initialisation: a safetensors
    /// file from `kiln export` (either format) or PyTorch's
    /// `safetensors.torch.save_file(model.state_dict(), path)` (f16/bf16/f64 are converted to
    /// f32). Every tensor must be there with its shape, and nothing else. A relative path is
    /// relative to the experiment file. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
    /// The names and layouts `init_from` holds: `"auto"` (kiln's exports by their metadata,
    /// gpt files by their names and shapes), `"kiln"` (a `kiln export`, either format),
    /// `"hf-gpt2"` (Hugging Face's `GPT2LMHeadModel`: `transformer.h.<i>.attn.c_attn.weight`,
    /// Conv1D weights `[in, out]`) or `"nanogpt"` (nanoGPT's `GPT`: the same names, Linear
    /// weights `[out, in]`, a `_orig_mod.` prefix of `torch.compile` taken off). Default:
    /// `"auto"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_format: Option<InitFormat>,
    /// The keys of a family kiln does not know (a user's model). Default: none.
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, toml::Value>,
    /// Output classes. Default: `10`.
    pub classes: usize,
    /// Activation after each hidden layer: relu, gelu, tanh, sigmoid. Default: `"relu"`.
    pub activation: Activation,
    /// Dropout probability after each hidden activation, in [0, 1). Default: `0.0`.
    pub dropout: f64,
}

impl ModelConfig {
    /// The keys of `[model]` kiln reads itself (any other goes to `extra`, a family's own keys),
    /// in the struct's order, derived from the struct: every field is set below by name, with no
    /// `..`, so a new field does not compile until it is named here, and then it is listed.
    pub fn known_keys() -> Vec<String> {
        let every = ModelConfig {
            kind: String::new(),
            input_size: 0,
            hidden_sizes: Vec::new(),
            channels: vec![0],
            kernel_size: Some(0),
            vocab_size: Some(0),
            block_size: Some(0),
            layers: Some(0),
            heads: Some(0),
            dim: Some(0),
            bias: Some(false),
            tie_embeddings: Some(false),
            gelu: Some(GeluKind::Exact),
            init_from: Some(String::new()),
            init_format: Some(InitFormat::Auto),
            extra: std::collections::BTreeMap::new(),
            classes: 0,
            activation: Activation::Relu,
            dropout: 0.0,
        };
        toml::Table::try_from(&every)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default()
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            kind: "mlp".into(),
            input_size: 1000,
            hidden_sizes: vec![500],
            channels: Vec::new(),
            kernel_size: None,
            vocab_size: None,
            block_size: None,
            layers: None,
            heads: None,
            dim: None,
            bias: None,
            tie_embeddings: None,
            gelu: None,
            init_from: None,
            init_format: None,
            extra: Default::default(),
            classes: 10,
            activation: Activation::Relu,
            dropout: 0.0,
        }
    }
}

impl ModelConfig {
    /// Sizes: at least 1 (2 classes), hidden widths at most 2^24, dropout in [0, 1).
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        at_least(r, "model.input_size", self.input_size, 1)?;
        at_least(r, "model.classes", self.classes, 2)?;
        for (i, h) in self.hidden_sizes.iter().enumerate() {
            if *h == 0 {
                return Err(r.key_error(
                    "model.hidden_sizes",
                    format!(
                        "`model.hidden_sizes[{i}]` = 0 is out of range: every width must be at least 1"
                    ),
                    None,
                ));
            }
        }
        let d = self.dropout;
        in_range(r, "model.dropout", d, (0.0..1.0).contains(&d), "in [0, 1)")?;
        if let Some(block) = self.block_size {
            // the data's windows depend on it too, so it is checked before any data is read
            at_least(r, "model.block_size", block, 1)?;
        }
        if let Some((i, h)) = self
            .hidden_sizes
            .iter()
            .enumerate()
            .find(|(_, h)| **h > 1 << 24)
        {
            return Err(r.key_error(
                "model.hidden_sizes",
                format!(
                    "`model.hidden_sizes[{i}]` = {h} is out of range: at most {}",
                    1 << 24
                ),
                None,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod known_key_tests {
    use super::ModelConfig;

    /// Every field of `ModelConfig` is a known key (the list that was kept by hand before
    /// issue 44), and none of `extra`'s.
    #[test]
    fn the_known_model_keys_are_the_structs_fields() {
        let mut got = ModelConfig::known_keys();
        got.sort();
        let mut want = vec![
            "kind",
            "input_size",
            "hidden_sizes",
            "classes",
            "activation",
            "dropout",
            "channels",
            "kernel_size",
            "vocab_size",
            "block_size",
            "layers",
            "heads",
            "dim",
            "bias",
            "tie_embeddings",
            "gelu",
            "init_from",
            "init_format",
        ];
        want.sort();
        assert_eq!(got, want);
    }
}
