//! The llama's weights as Hugging Face's `LlamaForCausalLM` (and `Qwen2ForCausalLM` with
//! `attn_bias`) stores them (`hf-llama`): a directory of `config.json` and safetensors
//! (`model.safetensors`, or shards with `model.safetensors.index.json`), names `model.` + the
//! module path (`model.layers.3.self_attn.q_proj.weight`) and `lm_head.weight`, Linear weights
//! `[out, in]`. The `[model]` keys a `config.json` sets are read by `config::hf_json`; this file
//! checks what no key sets.

use crate::model::ConfigMismatch;
use serde_json::{json, Value};

use super::{Llama, RopeType};
use crate::model::portable::{External, FamilyFormat, WeightFormat};
use crate::params::ParamLayout;

/// Hugging Face's `LlamaForCausalLM` directory.
pub const HF_LLAMA: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "hf-llama",
    dir: true,
    prefix: None,
});

/// The tensors in `hf-llama`, from PyTorch's (one per parameter, in layout order).
pub(super) fn tensors(
    format: WeightFormat,
    _layout: &ParamLayout,
    torch: &[External],
) -> Vec<External> {
    if format != HF_LLAMA {
        return torch.to_vec();
    }
    let mut out: Vec<External> = torch
        .iter()
        .map(|e| External {
            name: if e.name == "lm_head.weight" {
                e.name.clone()
            } else {
                format!("model.{}", e.name)
            },
            ..e.clone()
        })
        .collect();
    // a tied output layer: `lm_head.weight` is the embedding
    crate::model::portable::tie_alias(&mut out, "model.embed_tokens.weight", "lm_head.weight");
    out
}

/// The architectures kiln computes exactly, by `config.json`'s `model_type`.
pub const MODEL_TYPES: [&str; 3] = ["llama", "mistral", "qwen2"];

/// Where a Hugging Face `config.json` describes something no `[model]` key can say (the keys
/// it sets are compared by `config::hf_json` when the config is read): another architecture, an
/// activation other than SiLU, MLP biases, an o_proj bias, a head_dim other than dim / heads, a
/// rope scaling other than Llama 3's, a sliding window shorter than the context.
pub(super) fn mismatches(l: &Llama, c: &Value) -> Vec<ConfigMismatch> {
    let mut out = Vec::new();
    let mut bad = |key: &str, theirs: &Value, kiln_key: &str, ours: String| {
        out.push(ConfigMismatch {
            theirs: key.to_string(),
            value: theirs.to_string(),
            key: kiln_key.to_string(),
            ours,
        });
    };
    let s = |k: &str| c.get(k).and_then(Value::as_str);
    let model_type = s("model_type").unwrap_or("llama");
    if !MODEL_TYPES.contains(&model_type) {
        bad(
            "model_type",
            &json!(model_type),
            "(kiln's llama computes)",
            MODEL_TYPES.join(", "),
        );
    }
    if let Some(act) = s("hidden_act").filter(|a| *a != "silu") {
        bad(
            "hidden_act",
            &json!(act),
            "(kiln's llama MLP)",
            "\"silu\"".into(),
        );
    }
    if c.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
        bad(
            "mlp_bias",
            &json!(true),
            "(kiln's llama MLP)",
            "false".into(),
        );
    }
    if model_type != "qwen2" && c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        // Llama's attention_bias puts a bias on o_proj too; kiln's attn_bias is Qwen2's
        bad(
            "attention_bias",
            &json!(true),
            "(kiln's llama: q/k/v biases only, Qwen2's)",
            "false".into(),
        );
    }
    if let Some(hd) = c
        .get("head_dim")
        .and_then(Value::as_u64)
        .filter(|&hd| hd as usize != l.dim / l.heads)
    {
        bad(
            "head_dim",
            &json!(hd),
            "model.dim / model.heads",
            (l.dim / l.heads).to_string(),
        );
    }
    let rope = c
        .get("rope_scaling")
        .filter(|v| !v.is_null())
        .or(c.get("rope_parameters"));
    if let Some(kind) = rope
        .and_then(|r| r.get("rope_type").or(r.get("type")))
        .and_then(Value::as_str)
    {
        if !matches!(kind, "default" | "llama3") {
            bad(
                "rope_type",
                &json!(kind),
                "model.rope_scaling.rope_type",
                format!("{:?}", l.rope_scaling.map(|r| r.rope_type)),
            );
        }
    }
    let window = c.get("sliding_window").and_then(Value::as_u64);
    let used = c.get("use_sliding_window").and_then(Value::as_bool) != Some(false);
    if let Some(w) = window.filter(|&w| used && (w as usize) < l.block) {
        // (the real key, so its source is named, and the fix that works: issue 58, defect 14)
        bad(
            "sliding_window",
            &json!(w),
            "model.block_size",
            format!(
                "{}, longer than the window: kiln attends to the whole block, so set `model.block_size` to at most {w}",
                l.block
            ),
        );
    }
    out
}

/// Hugging Face's `config.json` for `l`: `LlamaForCausalLM`, or `Qwen2ForCausalLM` with
/// `attn_bias` (Llama's `attention_bias` would put a bias on o_proj too).
pub(super) fn config_json(l: &Llama) -> String {
    let (arch, model_type) = if l.attn_bias {
        ("Qwen2ForCausalLM", "qwen2")
    } else {
        ("LlamaForCausalLM", "llama")
    };
    let scaling = l.rope_scaling.map(|s| {
        json!({
            "rope_type": match s.rope_type { RopeType::Llama3 => "llama3" },
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        })
    });
    let mut config = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": l.vocab,
        "hidden_size": l.dim,
        "intermediate_size": l.ffn_dim,
        "num_hidden_layers": l.layers,
        "num_attention_heads": l.heads,
        "num_key_value_heads": l.kv_heads,
        "head_dim": l.dim / l.heads,
        "max_position_embeddings": l.block,
        "rms_norm_eps": l.norm_eps,
        "rope_theta": l.rope_theta,
        "rope_scaling": scaling,
        "hidden_act": "silu",
        "tie_word_embeddings": l.tie,
        "attention_dropout": l.dropout,
        "initializer_range": 0.02,
        "bos_token_id": null,
        "eos_token_id": null,
        "torch_dtype": "float32",
        "use_cache": true,
    });
    if l.attn_bias {
        config["use_sliding_window"] = json!(false);
    } else {
        config["attention_bias"] = json!(false);
        config["mlp_bias"] = json!(false);
    }
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}
