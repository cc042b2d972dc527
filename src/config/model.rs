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

/// `[model]`: the keys every family shares (or the data reads). Any other key is kept in
/// `extra`, a family's own: the family reads them with `Resolved::model_keys` into its serde
/// struct (gpt's `GptKeys`, llama's `LlamaKeys`, a user's family's own), and for a family with no
/// keys of its own they are unknown keys (an error naming the key, its source and the closest
/// key).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Model family: a name in the model registry (built in: `"mlp"`, `"cnn"`, `"gpt"`,
    /// `"llama"`). A Hugging Face directory in `init_from` sets it from its `config.json`
    /// (`"llama"` for Llama, Mistral and Qwen2, `"gpt"` for GPT-2). Default: `"mlp"`.
    pub kind: String,
    /// mlp: input features. Default: `1000`.
    pub input_size: usize,
    /// Widths of the hidden Linear layers, in order (cnn: after the convolutions). Default:
    /// `[500]`.
    pub hidden_sizes: Vec<usize>,
    /// cnn: output channels of each stage Conv2d -> ReLU -> MaxPool2d(2), in order; required for
    /// cnn. Default: `[]`.
    pub channels: Vec<usize>,
    /// cnn: the (odd) kernel size of every Conv2d, padded to keep the image size. Default: `3`.
    pub kernel_size: Option<usize>,
    /// Language models (gpt, llama): vocabulary size (at least 256 for byte-level text); the
    /// data's token ids are checked against it. Default: `256`, or the `config.json` of a
    /// Hugging Face directory in `init_from`.
    pub vocab_size: Option<usize>,
    /// Language models (gpt, llama): tokens of context; the data's training windows are
    /// `block_size + 1` tokens. Default: `128`, or the `config.json` of a Hugging Face directory
    /// in `init_from` (GPT-2's `n_positions`; a llama's `max_position_embeddings`, at most
    /// 2048).
    pub block_size: Option<usize>,
    /// Start training from these weights instead of the seeded initialisation: a safetensors
    /// file (`kiln export`'s, PyTorch's `safetensors.torch.save_file(model.state_dict(), path)`,
    /// nanoGPT's) or a Hugging Face model directory (`save_pretrained`'s: `model.safetensors`,
    /// or shards with `model.safetensors.index.json`), in a format `init_format` names; f16,
    /// bf16 and f64 are converted to f32. Every parameter's tensor must be there with its shape,
    /// and nothing else (a tied copy may be missing; a format's buffers, GPT-2's attention masks
    /// or a llama's `rotary_emb.inv_freq`, are skipped). A Hugging Face `config.json` in the
    /// directory (or beside the file) of a model kiln computes is a config layer
    /// (`config::hf_json`: the `[model]` keys no other layer sets), and the `tokenizer.json`
    /// beside it is `data.tokenizer` unless that is set. A relative path is relative to
    /// the file that set it (to the working directory when a variable or flag did). Default:
    /// none.
    pub init_from: Option<String>,
    /// The names and layouts `init_from` holds (`model::portable`; a name the model's family
    /// does not have is an error listing those it has):
    /// - `"auto"`: a `kiln export` by its `kiln.format` metadata, else a format of the family's
    ///   that the names show (gpt: `hf-gpt2` or `nanogpt` by `c_attn`'s and `c_fc`'s shapes;
    ///   llama: `hf-llama` by `model.layers.*` or `model.embed_tokens.weight`), else `pytorch`.
    /// - `"kiln"`: a `kiln export`, in the format its `kiln.format` metadata names (`pytorch`
    ///   without it).
    /// - `"pytorch"` (every family): the `state_dict` names of the PyTorch module the family
    ///   mirrors, Linear weights `[out, in]`, a norm's `weight`/`bias`.
    /// - `"burn"` (every family): Burn's module paths, Linear weights `[in, out]`, a norm's
    ///   `gamma`/`beta` (as Burn's `SafetensorsStore` writes them).
    /// - `"hf-gpt2"` (gpt): Hugging Face's `GPT2LMHeadModel` (its `save_pretrained` directory,
    ///   or a file of it): `transformer.h.<i>.attn.c_attn.weight`, Conv1D weights `[in, out]`.
    /// - `"nanogpt"` (gpt): nanoGPT's `GPT`: the same names, Linear weights `[out, in]`, a
    ///   `_orig_mod.` prefix of `torch.compile` taken off.
    /// - `"hf-llama"` (llama): Hugging Face's `LlamaForCausalLM` (and `Qwen2ForCausalLM`; its
    ///   `save_pretrained` directory, or a file of it): `model.` + the module path
    ///   (`model.layers.<i>.self_attn.q_proj.weight`) and `lm_head.weight`, Linear weights
    ///   `[out, in]`.
    ///
    /// A user's family may add formats of its own (`WeightAdapter::formats`). Default: `"auto"`.
    pub init_format: Option<String>,
    /// Parameters that do not train: globs over their names as Hugging Face writes them for the
    /// gpt and llama families (the names `kiln export --format hf-gpt2` / `hf-llama` writes,
    /// e.g. `"model.embed_tokens.weight"`, `"model.layers.0.*"`), PyTorch's names for the others;
    /// `*` matches any run of characters, dots too. A frozen parameter gets no gradient, no
    /// reduction and no optimizer state, and keeps its initial (or `init_from`) values bit for
    /// bit; `kiln check` lists them with the counts of frozen and trainable parameters. A glob
    /// that matches nothing, or a list that freezes everything, is an error. Default: `[]`.
    pub freeze: Vec<String>,
    /// LoRA adapters (PEFT's `LoraConfig`). Default: none.
    pub lora: Option<LoraConfig>,
    /// A family's own keys (gpt's and llama's `layers`, `heads`, `dim`, ...; a user's model's),
    /// which the family reads with `Resolved::model_keys` into its own serde struct. Default:
    /// none.
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, toml::Value>,
    /// Output classes. Default: `10`.
    pub classes: usize,
    /// Activation after each hidden layer: relu, gelu, tanh, sigmoid. Default: `"relu"`.
    pub activation: Activation,
    /// Dropout probability, in [0, 1): mlp and cnn after each hidden activation; gpt on the
    /// embeddings, the attention weights and each residual branch; llama on the attention
    /// weights (transformers' `attention_dropout`). Default: `0.0`.
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
            init_from: Some(String::new()),
            init_format: Some(String::new()),
            freeze: vec![String::new()],
            lora: Some(LoraConfig::default()),
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

/// Keys a family now owns (gpt's), in the order they had as `ModelConfig` fields (before issue
/// 44 gave the family its keys): serialized there, after `block_size`, so the TOML of a config,
/// and its `config_hash`, are what they were (sweep trial directories keep their names).
const FORMER_FIELDS: [&str; 6] = ["layers", "heads", "dim", "bias", "tie_embeddings", "gelu"];

impl Serialize for ModelConfig {
    /// The derived order (fields as declared, `extra` where it stands), but the keys of
    /// `FORMER_FIELDS` where those fields stood: config hashes do not change.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        // every field by name, no `..`: a new field does not compile until it is written here
        let ModelConfig {
            kind,
            input_size,
            hidden_sizes,
            channels,
            kernel_size,
            vocab_size,
            block_size,
            init_from,
            init_format,
            freeze,
            lora,
            extra,
            classes,
            activation,
            dropout,
        } = self;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", kind)?;
        m.serialize_entry("input_size", input_size)?;
        m.serialize_entry("hidden_sizes", hidden_sizes)?;
        if !channels.is_empty() {
            m.serialize_entry("channels", channels)?;
        }
        for (k, v) in [
            ("kernel_size", kernel_size),
            ("vocab_size", vocab_size),
            ("block_size", block_size),
        ] {
            if let Some(v) = v {
                m.serialize_entry(k, v)?;
            }
        }
        for k in FORMER_FIELDS {
            if let Some(v) = extra.get(k) {
                m.serialize_entry(k, v)?;
            }
        }
        if let Some(v) = init_from {
            m.serialize_entry("init_from", v)?;
        }
        if let Some(v) = init_format {
            m.serialize_entry("init_format", v)?;
        }
        if !freeze.is_empty() {
            m.serialize_entry("freeze", freeze)?;
        }
        if let Some(v) = lora {
            m.serialize_entry("lora", v)?;
        }
        for (k, v) in extra {
            if !FORMER_FIELDS.contains(&k.as_str()) {
                m.serialize_entry(k, v)?;
            }
        }
        m.serialize_entry("classes", classes)?;
        m.serialize_entry("activation", activation)?;
        m.serialize_entry("dropout", dropout)?;
        m.end()
    }
}

/// `[model.lora]`: low-rank adapters as PEFT's `LoraConfig` makes them (kiln's gpt and llama).
/// Each targeted Linear computes `W x + (alpha / rank) B A dropout(x)`, A `[rank, in]` drawn as
/// PEFT's default (Kaiming-uniform: U(-1/sqrt(in), 1/sqrt(in))), B `[out, rank]` zero; every
/// other parameter is frozen (no gradient, no optimizer state). The adapters are parameters
/// of the model like any other: every strategy, checkpoint, resume and sweep takes them;
/// `kiln export --format peft` writes them as PEFT does, `hf-llama` / `hf-gpt2` the merged
/// weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraConfig {
    /// The adapters' rank `r`; 0 turns LoRA off. At most the smaller dimension of each
    /// targeted layer. Default: `8`.
    pub rank: usize,
    /// `lora_alpha`: the adapter's output is scaled by `alpha / rank`. Default: `8.0`.
    pub alpha: f64,
    /// `lora_dropout`: dropout on the adapter's input only, in [0, 1) (drawn like every kiln
    /// mask, so every strategy and world size gives the same result). Default: `0.0`.
    pub dropout: f64,
    /// `target_modules`: the Hugging Face module names to adapt, every layer's (llama:
    /// `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`; gpt:
    /// `c_attn`, `c_proj` (the attention's and the MLP's), `c_fc`), or `["all-linear"]` (every
    /// one of those). Default: PEFT's for the architecture (llama: `["q_proj", "v_proj"]`;
    /// gpt: `["c_attn"]`).
    pub targets: Option<Vec<String>>,
    /// Start the adapters from a PEFT adapter directory (`adapter_config.json` +
    /// `adapter_model.safetensors`, `save_pretrained`'s or `kiln export --format peft`'s)
    /// instead of PEFT's initialisation: its rank, alpha and target modules must be these. A
    /// relative path is relative to the file that set it. Default: none.
    pub init_from: Option<String>,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: None,
            init_from: None,
        }
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
            init_from: None,
            init_format: None,
            freeze: Vec::new(),
            lora: None,
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
                return Err(r.range_error(
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
        if let Some(l) = &self.lora {
            let d = l.dropout;
            in_range(
                r,
                "model.lora.dropout",
                d,
                (0.0..1.0).contains(&d),
                "in [0, 1)",
            )?;
            let a = l.alpha;
            in_range(
                r,
                "model.lora.alpha",
                a,
                a > 0.0 && a.is_finite(),
                "a positive number",
            )?;
        }
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
            return Err(r.range_error(
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
    /// issue 44), and none of `extra`'s (gpt's own keys went there with issue 44's item 3).
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
            "init_from",
            "init_format",
            "freeze",
            "lora",
        ];
        want.sort();
        assert_eq!(got, want);
    }
}
