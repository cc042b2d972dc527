//! The llama's weights as Hugging Face's `LlamaForCausalLM` (and `Qwen2ForCausalLM` with
//! `attn_bias`) stores them (`hf-llama`): a directory of `config.json` and safetensors
//! (`model.safetensors`, or shards with `model.safetensors.index.json`), names `model.` + the
//! module path (`model.layers.3.self_attn.q_proj.weight`) and `lm_head.weight`, Linear weights
//! `[out, in]`. The `[model]` keys a `config.json` sets are read by `config::hf_json`; this file
//! checks what no key sets.

use crate::model::ConfigMismatch;
use serde_json::{json, Value};

use super::{Arch, Llama};
use crate::model::portable::{External, FamilyFormat, WeightFormat};
use crate::params::ParamLayout;

/// Hugging Face's `LlamaForCausalLM` directory.
pub const HF_LLAMA: WeightFormat = hf("hf-llama");

const fn hf(name: &'static str) -> WeightFormat {
    WeightFormat::Family(FamilyFormat {
        name,
        dir: true,
        renames: &[],
    })
}

/// How a Gemma 3 vision-language checkpoint (`Gemma3ForConditionalGeneration`) names its
/// language model: `language_model.model.layers.0...` and `language_model.lm_head.weight` on
/// the Hub and from transformers' `save_pretrained`, `model.language_model.layers.0...` and
/// `lm_head.weight` (an untied head) from transformers 5's
/// `save_pretrained(save_original_format=False)` (its modules' own names).
pub const GEMMA3_LANGUAGE_MODEL: [(&str, &str); 2] =
    [("language_model.", ""), ("model.language_model.", "model.")];

/// The Hugging Face directory format of `arch` (`--format hf` names it too).
pub fn format_of(arch: Arch) -> WeightFormat {
    match arch {
        Arch::Llama => HF_LLAMA,
        Arch::Qwen3 => hf("hf-qwen3"),
        // (Gemma 3 4B-27B are vision-language models saved as `language_model.model.*` beside
        // `vision_tower.*`: kiln computes the language model, `Llama::format_buffer` leaves
        // the vision side out)
        Arch::Gemma3 => WeightFormat::Family(FamilyFormat {
            name: "hf-gemma3",
            dir: true,
            renames: &GEMMA3_LANGUAGE_MODEL,
        }),
        Arch::Phi3 => hf("hf-phi3"),
        Arch::Mixtral => hf("hf-mixtral"),
    }
}

/// The tensors in `hf-llama`, from PyTorch's (one per parameter, in layout order).
pub(super) fn tensors(
    format: WeightFormat,
    _layout: &ParamLayout,
    torch: &[External],
) -> Vec<External> {
    if !format.is_dir() {
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

/// The `config.json` model types architecture `arch` computes (`config::hf_json`'s table,
/// which also gives each its `model.kind`).
fn model_types(arch: Arch) -> Vec<&'static str> {
    crate::config::hf_json::LLAMA_TYPES
        .iter()
        .filter(|(_, kind)| *kind == arch.kind())
        .map(|(t, _)| *t)
        .collect()
}

/// Where a Hugging Face `config.json` describes something no `[model]` key can say (the keys
/// it sets are compared by `config::hf_json` when the config is read): another architecture, an
/// activation other than the architecture's, MLP biases, an o_proj bias, another head_dim, a
/// rope scaling other than Llama 3's and linear, soft-capping, bidirectional attention, partial rotation,
/// router jitter.
pub(super) fn mismatches(l: &Llama, c: &Value) -> Vec<ConfigMismatch> {
    let mut out = Vec::new();
    let mut bad = |key: &str, theirs: &Value, kiln_key: &str, ours: String| {
        out.push(mismatch(key, theirs, kiln_key, ours))
    };
    let s = |k: &str| c.get(k).and_then(Value::as_str);
    let types = model_types(l.arch);
    let model_type = s("model_type").unwrap_or(types[0]);
    let kind = l.arch.kind();
    if !types.contains(&model_type) {
        bad(
            "model_type",
            &json!(model_type),
            &format!("(kiln's {kind} computes)"),
            types.join(", "),
        );
    }
    let (act_key, act) = if l.arch == Arch::Gemma3 {
        ("hidden_activation", "gelu_pytorch_tanh")
    } else {
        ("hidden_act", "silu")
    };
    if let Some(theirs) = s(act_key).filter(|a| *a != act) {
        bad(
            act_key,
            &json!(theirs),
            &format!("(kiln's {kind} MLP)"),
            format!("\"{act}\""),
        );
    }
    out.extend(unsupported(c, kind));
    let mut bad = |key: &str, theirs: &Value, kiln_key: &str, ours: String| {
        out.push(mismatch(key, theirs, kiln_key, ours))
    };
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
        .filter(|&hd| hd as usize != l.head_dim)
    {
        bad(
            "head_dim",
            &json!(hd),
            "model.head_dim",
            l.head_dim.to_string(),
        );
    }
    let rope = c
        .get("rope_scaling")
        .filter(|v| !v.is_null())
        .or(c.get("rope_parameters"));
    // (Gemma 3's: one entry per layer type; kiln scales the global layers' alone)
    let ropes: Vec<(&Value, &[&str])> = match rope {
        Some(r) if r.get("full_attention").is_some() || r.get("sliding_attention").is_some() => {
            let mut v: Vec<(&Value, &[&str])> = Vec::new();
            if let Some(g) = r.get("full_attention") {
                v.push((g, &["default", "llama3", "linear"]));
            }
            if let Some(s) = r.get("sliding_attention") {
                v.push((s, &["default"]));
            }
            v
        }
        Some(r) => vec![(r, &["default", "llama3", "linear"])],
        None => Vec::new(),
    };
    for (r, computed) in ropes {
        if let Some(rope_type) = r.get("rope_type").or(r.get("type")).and_then(Value::as_str) {
            if !computed.contains(&rope_type) {
                bad(
                    "rope_type",
                    &json!(rope_type),
                    "model.rope_scaling.rope_type",
                    format!("{:?}", l.rope_scaling.map(|r| r.rope_type)),
                );
            }
        }
    }
    out
}

/// config.json's `key` = `theirs` where kiln computes `ours` (`kiln_key`).
fn mismatch(key: &str, theirs: &Value, kiln_key: &str, ours: String) -> ConfigMismatch {
    ConfigMismatch {
        theirs: key.to_string(),
        value: theirs.to_string(),
        key: kiln_key.to_string(),
        ours,
    }
}

/// What a config.json asks for that no llama-family kind computes, by name: logit
/// soft-capping, router jitter, bidirectional attention, partial rotation.
pub(super) fn unsupported(c: &Value, kind: &str) -> Vec<ConfigMismatch> {
    let mut out = Vec::new();
    let mut bad = |key: &str, theirs: &Value, kiln_key: &str, ours: String| {
        out.push(mismatch(key, theirs, kiln_key, ours))
    };
    for key in [
        "final_logit_softcapping",
        "attn_logit_softcapping",
        "router_jitter_noise",
    ] {
        if let Some(v) = c
            .get(key)
            .filter(|v| !v.is_null() && v.as_f64() != Some(0.0))
        {
            bad(key, v, &format!("(kiln's {kind})"), "null".into());
        }
    }
    if c.get("use_bidirectional_attention")
        .and_then(Value::as_bool)
        == Some(true)
    {
        bad(
            "use_bidirectional_attention",
            &json!(true),
            &format!("(kiln's {kind}: causal)"),
            "false".into(),
        );
    }
    // (any value but the number 1: a string "0.5" is no more computed than 0.5)
    let partial = [
        c.get("partial_rotary_factor"),
        c.get("rope_parameters")
            .and_then(|r| r.get("partial_rotary_factor")),
    ];
    if let Some(p) = partial
        .into_iter()
        .flatten()
        .find(|v| !v.is_null() && v.as_f64() != Some(1.0))
    {
        bad(
            "partial_rotary_factor",
            p,
            &format!("(kiln's {kind} rotates every channel)"),
            "1.0".into(),
        );
    }
    out
}

/// Hugging Face's `config.json` for `l`: `LlamaForCausalLM` (or `Qwen2ForCausalLM` with
/// `attn_bias`: Llama's `attention_bias` would put a bias on o_proj too; `MistralForCausalLM`
/// with a sliding window), `Qwen3ForCausalLM`, `Gemma3ForCausalLM`, `Phi3ForCausalLM`,
/// `MixtralForCausalLM`.
pub(super) fn config_json(l: &Llama) -> String {
    let (arch, model_type) = match l.arch {
        Arch::Llama if l.attn_bias => ("Qwen2ForCausalLM", "qwen2"),
        Arch::Llama if l.sliding_window.is_some() => ("MistralForCausalLM", "mistral"),
        Arch::Llama => ("LlamaForCausalLM", "llama"),
        Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        Arch::Gemma3 => ("Gemma3ForCausalLM", "gemma3_text"),
        Arch::Phi3 => ("Phi3ForCausalLM", "phi3"),
        Arch::Mixtral => ("MixtralForCausalLM", "mixtral"),
    };
    // (transformers' names: llama3's four numbers, linear's factor)
    let scaling = l
        .rope_scaling
        .map(|s| serde_json::to_value(s).expect("numbers and a name"));
    let layer_types: Vec<&str> = l
        .sliding
        .iter()
        .map(|&s| {
            if s && l.sliding_window.is_some() {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    let mut config = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": l.vocab,
        "hidden_size": l.dim,
        "intermediate_size": l.ffn_dim,
        "num_hidden_layers": l.layers,
        "num_attention_heads": l.heads,
        "num_key_value_heads": l.kv_heads,
        "head_dim": l.head_dim,
        "max_position_embeddings": l.block,
        "rms_norm_eps": l.norm_eps,
        "rope_theta": l.rope_theta,
        "rope_scaling": scaling.clone(),
        "hidden_act": "silu",
        "tie_word_embeddings": l.tie,
        "attention_dropout": l.dropout,
        "initializer_range": 0.02,
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
        "torch_dtype": "float32",
        "use_cache": true,
        "sliding_window": l.sliding_window,
    });
    match l.arch {
        Arch::Llama if l.attn_bias => {
            config["use_sliding_window"] = json!(l.sliding_window.is_some());
            config["layer_types"] = json!(layer_types);
        }
        Arch::Llama => {
            config["attention_bias"] = json!(false);
            config["mlp_bias"] = json!(false);
        }
        Arch::Qwen3 => {
            config["attention_bias"] = json!(false);
            config["use_sliding_window"] = json!(l.sliding_window.is_some());
            config["layer_types"] = json!(layer_types);
        }
        Arch::Gemma3 => {
            let obj = config.as_object_mut().expect("an object");
            obj.remove("hidden_act");
            obj.remove("rope_theta");
            obj.remove("rope_scaling");
            config["hidden_activation"] = json!("gelu_pytorch_tanh");
            // (transformers takes a whole number where it is one)
            let qpas = 1.0 / (l.query_scale * l.query_scale);
            config["query_pre_attn_scalar"] = if (qpas - qpas.round()).abs() < 1e-9 {
                json!(qpas.round() as u64)
            } else {
                json!(qpas)
            };
            config["layer_types"] = json!(layer_types);
            // (the scaling is the global layers': Gemma 3 4B-27B's linear)
            let mut global = scaling.unwrap_or_else(|| json!({"rope_type": "default"}));
            global["rope_theta"] = json!(l.rope_theta);
            config["rope_parameters"] = json!({
                "full_attention": global,
                "sliding_attention": {"rope_type": "default", "rope_theta": l.rope_local_theta},
            });
            config["final_logit_softcapping"] = json!(null);
            config["attn_logit_softcapping"] = json!(null);
            config["attention_bias"] = json!(false);
            // (Gemma's window must be a number even when no layer slides)
            config["sliding_window"] = json!(l.sliding_window.unwrap_or(l.block));
        }
        Arch::Phi3 => {
            config["original_max_position_embeddings"] = json!(l.block);
            config["partial_rotary_factor"] = json!(1.0);
        }
        Arch::Mixtral => {
            if let Some(m) = &l.moe {
                config["num_local_experts"] = json!(m.experts);
                config["num_experts_per_tok"] = json!(m.top_k);
                config["router_aux_loss_coef"] = json!(m.aux_coef);
            }
            config["output_router_logits"] = json!(false);
            config["router_jitter_noise"] = json!(0.0);
        }
    }
    serde_json::to_string_pretty(&config).unwrap_or_default() + "\n"
}
