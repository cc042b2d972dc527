//! The llama family's own `[model]` keys, read the way a user's family reads its keys
//! (`Resolved::model_keys`). Keys left out of `[model]` come from the `config.json` of a Hugging
//! Face directory in `model.init_from` (`config::hf_json`), with that file as their source.

use serde::{Deserialize, Serialize};

/// `model.rope_scaling`: Llama 3's frequency-dependent rotary scaling (transformers'
/// `rope_type = "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeScaling {
    /// Only `"llama3"`.
    pub rope_type: RopeType,
    /// Low frequencies are divided by it (Llama 3.1: 8).
    pub factor: f64,
    /// Llama 3.1: 1.
    pub low_freq_factor: f64,
    /// Llama 3.1: 4.
    pub high_freq_factor: f64,
    /// The context the model was pretrained on before scaling (Llama 3.1: 8192).
    pub original_max_position_embeddings: usize,
}

/// The rope scalings kiln computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeType {
    Llama3,
}

/// llama's keys of `[model]` (besides the shared `vocab_size`, `block_size`, `dropout`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaKeys {
    /// Decoder blocks. Default: `4`.
    pub layers: Option<usize>,
    /// Query heads (`dim` must be a multiple, with an even `dim / heads`). Default: `4`.
    pub heads: Option<usize>,
    /// Key/value heads of grouped-query attention (`heads` must be a multiple). Default: `heads`.
    pub kv_heads: Option<usize>,
    /// Embedding width. Default: `128`.
    pub dim: Option<usize>,
    /// The SwiGLU MLP's hidden width. Default: `8 * dim / 3` rounded up to a multiple of 32.
    pub ffn_dim: Option<usize>,
    /// The rotary embeddings' base. Default: `10000.0`.
    pub rope_theta: Option<f64>,
    /// Llama 3's rotary scaling: `{ rope_type = "llama3", factor, low_freq_factor,
    /// high_freq_factor, original_max_position_embeddings }`. Default: none.
    pub rope_scaling: Option<RopeScaling>,
    /// The RMSNorms' epsilon. Default: `1e-5`.
    pub norm_eps: Option<f64>,
    /// The output layer shares the token embedding's weights. Default: `false`.
    pub tie_embeddings: Option<bool>,
    /// Biases on the query, key and value projections (Qwen2's). Default: `false`.
    pub attn_bias: Option<bool>,
}
