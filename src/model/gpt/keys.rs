//! The gpt family's own `[model]` keys, read the way a user's family reads its keys
//! (`Resolved::model_keys`): a wrong type, an unknown key or a typo is an error naming the key
//! and the file, variable or flag that set it.

use serde::{Deserialize, Serialize};

/// `model.gelu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluKind {
    /// erf: nanoGPT's and PyTorch's `nn.GELU()`.
    Exact,
    /// The tanh approximation: GPT-2's, Hugging Face's `gelu_new`.
    Tanh,
}

/// gpt's keys of `[model]` (besides the shared `vocab_size`, `block_size`, `dropout`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptKeys {
    /// Transformer blocks. Default: `4`.
    pub layers: Option<usize>,
    /// Attention heads (`dim` must be a multiple). Default: `4`.
    pub heads: Option<usize>,
    /// Embedding width. Default: `128`.
    pub dim: Option<usize>,
    /// Biases in the Linear and LayerNorm layers. Default: `true`.
    pub bias: Option<bool>,
    /// The output layer shares the token embedding's weights. Default: `true`.
    pub tie_embeddings: Option<bool>,
    /// The MLP's GELU: `"exact"` or `"tanh"`. Default: `"exact"`.
    pub gelu: Option<GeluKind>,
}
