//! The llama family's own `[model]` keys, read the way a user's family reads its keys
//! (`Resolved::model_keys`). Keys left out of `[model]` come from the `config.json` of a Hugging
//! Face directory in `model.init_from` (`config::hf_json`), with that file as their source.

use serde::{Deserialize, Serialize};

/// `model.rope_scaling`: the rotary scaling of the global layers (Gemma 3's sliding layers keep
/// their own base unscaled), as transformers' `rope_type`: `"llama3"` (Llama 3's frequency-
/// dependent scaling, all four numbers) or `"linear"` (every frequency divided by `factor`:
/// positions interpolated, Gemma 3 4B-27B's; `factor` alone).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RopeScaling {
    /// `"llama3"` or `"linear"`.
    pub rope_type: RopeType,
    /// Frequencies are divided by it (llama3: the low ones; Llama 3.1: 8, Gemma 3: 8).
    pub factor: f64,
    /// llama3 (Llama 3.1: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low_freq_factor: Option<f64>,
    /// llama3 (Llama 3.1: 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_freq_factor: Option<f64>,
    /// llama3: the context the model was pretrained on before scaling (Llama 3.1: 8192).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_max_position_embeddings: Option<usize>,
}

impl RopeScaling {
    /// Llama 3's scaling of `factor` and its three other numbers.
    pub fn llama3(factor: f64, low: f64, high: f64, original: usize) -> Self {
        RopeScaling {
            rope_type: RopeType::Llama3,
            factor,
            low_freq_factor: Some(low),
            high_freq_factor: Some(high),
            original_max_position_embeddings: Some(original),
        }
    }

    /// Linear scaling by `factor`.
    pub fn linear(factor: f64) -> Self {
        RopeScaling {
            rope_type: RopeType::Linear,
            factor,
            low_freq_factor: None,
            high_freq_factor: None,
            original_max_position_embeddings: None,
        }
    }
}

/// The rope scalings kiln computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeType {
    Llama3,
    Linear,
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
    /// The global layers' rotary scaling: Llama 3's `{ rope_type = "llama3", factor,
    /// low_freq_factor, high_freq_factor, original_max_position_embeddings }`, or `{ rope_type =
    /// "linear", factor }`. Default: none.
    pub rope_scaling: Option<RopeScaling>,
    /// The RMSNorms' epsilon. Default: `1e-5`.
    pub norm_eps: Option<f64>,
    /// The output layer shares the token embedding's weights. Default: `false`.
    pub tie_embeddings: Option<bool>,
    /// Biases on the query, key and value projections (Qwen2's; kind `llama` only). Default:
    /// `false`.
    pub attn_bias: Option<bool>,
    /// Channels per attention head (Qwen3's and Gemma 3's `head_dim`, which may differ from
    /// `dim / heads`). Default: `dim / heads`.
    pub head_dim: Option<usize>,
    /// The attention window of the layers `layer_types` marks `"sliding_attention"`: position i
    /// attends to positions i - window + 1 ..= i (transformers' `sliding_window`; Mistral's,
    /// Phi-3's, Gemma 3's local layers). Default: none, every layer attends to the whole block.
    pub sliding_window: Option<usize>,
    /// Each layer's attention, `"sliding_attention"` or `"full_attention"` (transformers'
    /// `layer_types`). Default: with a `sliding_window`, gemma3's five local layers to one
    /// global one, every layer sliding for the other kinds; without, all full.
    pub layer_types: Option<Vec<LayerType>>,
    /// gemma3: the rotary base of its sliding layers (transformers' `rope_local_base_freq`,
    /// `rope_parameters.sliding_attention.rope_theta`). Default: `10000.0`.
    pub rope_local_theta: Option<f64>,
    /// gemma3: the attention scores are scaled by `query_pre_attn_scalar ** -0.5`. Default:
    /// `head_dim`.
    pub query_pre_attn_scalar: Option<f64>,
    /// mixtral: experts per layer (transformers' `num_local_experts`). Default: `4`.
    pub experts: Option<usize>,
    /// mixtral: experts each token is routed to (`num_experts_per_tok`). Default: `2`.
    pub experts_per_token: Option<usize>,
    /// mixtral: weight of the router's load-balancing loss in the training loss
    /// (`router_aux_loss_coef`; 0 leaves it out). Default: `0.001`.
    pub router_aux_loss_coef: Option<f64>,
}

/// One layer's attention (`model.layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    SlidingAttention,
    FullAttention,
}
