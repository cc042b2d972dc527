//! A Hugging Face model directory as a config layer: when `model.init_from` names a directory
//! (or a weights file in one) whose `config.json` describes a model kiln computes (Llama,
//! Mistral and Qwen2 as `llama`, GPT-2 as `gpt`), the `[model]` keys it implies that no file,
//! variable or flag sets come from it, with that `config.json` as their source (`kiln check`
//! shows it); a key set elsewhere to another value is an error naming both. What no key can say
//! (an activation, a sliding window) the family checks when the weights load.

use std::path::{Path, PathBuf};

use figment::value::{Dict, Value};
use figment::{Figment, Metadata, Source};
use serde_json::Value as Json;

use super::error::{ConfigError, KeyError, KeyErrorKind};
use super::load::{describe_source, DEFAULT_SOURCE};

/// The longest `block_size` a config.json's `max_position_embeddings` gives.
pub const MAX_BLOCK: u64 = 2048;

/// The `config.json` that `init_from` (a directory, or a file in one) has, if any.
pub fn config_json_of(init_from: &Path) -> Option<PathBuf> {
    let dir = if init_from.is_dir() {
        init_from.to_path_buf()
    } else {
        init_from.parent()?.to_path_buf()
    };
    let path = dir.join("config.json");
    path.is_file().then_some(path)
}

/// `[model]` keys (without `model.`) and values a Hugging Face `config.json` implies, `None`
/// for a `model_type` kiln does not read, or what is wrong with the file (a key named, and
/// what it must be: issue 58, defect 14).
pub fn model_keys(c: &Json) -> Result<Option<Vec<(&'static str, Json)>>, String> {
    let get = |k: &str| c.get(k).filter(|v| !v.is_null()).cloned();
    let model_type = match c.get("model_type") {
        Some(Json::String(t)) => t.as_str(),
        // (it was ignored, and kiln's defaults applied)
        None | Some(Json::Null) => {
            return Err("has no `model_type`: transformers' save_pretrained writes one (kiln computes: llama, mistral, qwen2, qwen3, gemma3_text, phi3, mixtral, gpt2)".into())
        }
        Some(other) => {
            return Err(format!(
                "`model_type` = {} is not a name (kiln computes: llama, mistral, qwen2, qwen3, gemma3_text, phi3, mixtral, gpt2)",
                super::brief(&other.to_string(), 60)
            ))
        }
    };
    let mut out: Vec<(&'static str, Option<Json>)> = Vec::new();
    let family = LLAMA_TYPES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, kind)| *kind);
    match model_type {
        _ if family.is_some() => {
            out = llama_keys(c, model_type, family.unwrap_or("llama"))?;
        }
        "gpt2" => {
            let tanh = ["gelu_new", "gelu_pytorch_tanh", "gelu_fast"];
            let act = get("activation_function").and_then(|a| a.as_str().map(str::to_string));
            let gelu = act.map(|a| {
                if tanh.contains(&a.as_str()) {
                    "tanh"
                } else {
                    "exact"
                }
            });
            out.extend([
                ("kind", Some("gpt".into())),
                ("vocab_size", get("vocab_size")),
                ("block_size", get("n_positions")),
                ("layers", get("n_layer")),
                ("heads", get("n_head")),
                ("dim", get("n_embd")),
                ("gelu", Some(gelu.unwrap_or("tanh").into())),
                (
                    "tie_embeddings",
                    Some(get("tie_word_embeddings").unwrap_or(true.into())),
                ),
            ]);
        }
        other => {
            return Err(format!(
                "has model_type \"{}\"; kiln computes: {}",
                super::brief(other, 40).escape_debug(),
                MODEL_TYPES.join(", ")
            ))
        }
    }
    Ok(Some(
        out.into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
    ))
}

/// The llama family's `[model]` keys (`kind` one of its architectures) from a config.json of
/// `model_type`.
fn llama_keys(
    c: &Json,
    model_type: &str,
    kind: &'static str,
) -> Result<Vec<(&'static str, Option<Json>)>, String> {
    let get = |k: &str| c.get(k).filter(|v| !v.is_null()).cloned();
    let count = |k: &str| count_of(c, k);
    let mut out: Vec<(&'static str, Option<Json>)> = Vec::new();
    let rope = get("rope_scaling").or(get("rope_parameters"));
    // (Gemma 3's rope_parameters have one entry per layer type)
    let global = rope
        .as_ref()
        .and_then(|r| r.get("full_attention").cloned())
        .or(rope.clone());
    let local = rope
        .as_ref()
        .and_then(|r| r.get("sliding_attention").cloned());
    let theta = get("rope_theta").or(global.as_ref().and_then(|r| r.get("rope_theta").cloned()));
    let scaling = llama3_scaling(c, global)?;
    let (window, types) = sliding(c)?;
    out.extend([
        ("kind", Some(kind.into())),
        ("vocab_size", get("vocab_size")),
        // (a context of at most MAX_BLOCK: Llama 3's 131,072 positions would make
        // windows no run here could hold; `model.block_size` sets more)
        (
            "block_size",
            count("max_position_embeddings")?
                .and_then(|v| v.as_u64())
                .map(|v| v.min(MAX_BLOCK).into()),
        ),
        ("layers", get("num_hidden_layers")),
        ("heads", get("num_attention_heads")),
        (
            "kv_heads",
            get("num_key_value_heads").or(get("num_attention_heads")),
        ),
        ("dim", get("hidden_size")),
        ("ffn_dim", get("intermediate_size")),
        // (only where it is not hidden / heads, which kiln assumes: configs that
        // write the usual one keep their runs' config hashes)
        ("head_dim", count("head_dim")?.filter(|hd| {
            let (d, h) = (
                c.get("hidden_size").and_then(Json::as_u64),
                c.get("num_attention_heads").and_then(Json::as_u64),
            );
            !matches!((d, h, hd.as_u64()), (Some(d), Some(h), Some(hd)) if h > 0 && d / h == hd && d % h == 0)
        })),
        ("rope_theta", theta),
        ("rope_scaling", scaling),
        // (transformers' Llama, Mistral and Qwen2 configs default to 1e-6)
        ("norm_eps", Some(get("rms_norm_eps").unwrap_or(1e-6.into()))),
        (
            "tie_embeddings",
            Some(get("tie_word_embeddings").unwrap_or((kind == "gemma3").into())),
        ),
        ("sliding_window", window),
        ("layer_types", types),
    ]);
    if kind == "llama" {
        out.push(("attn_bias", Some((model_type == "qwen2").into())));
    }
    if kind == "gemma3" {
        out.extend([
            (
                "rope_local_theta",
                get("rope_local_base_freq").or(local.and_then(|r| r.get("rope_theta").cloned())),
            ),
            ("query_pre_attn_scalar", get("query_pre_attn_scalar")),
        ]);
    }
    if kind == "mixtral" {
        out.extend([
            ("experts", count("num_local_experts")?),
            ("experts_per_token", count("num_experts_per_tok")?),
            ("router_aux_loss_coef", get("router_aux_loss_coef")),
        ]);
    }
    Ok(out)
}

/// Key `k` of `c` when it is a positive whole number, none when it is missing or null, else an
/// error naming it (it was ignored when it was a string, a fraction or negative).
fn count_of(c: &Json, k: &str) -> Result<Option<Json>, String> {
    match c.get(k).filter(|v| !v.is_null()).cloned() {
        None => Ok(None),
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => Ok(Some(v)),
        Some(v) => Err(format!(
            "`{k}` = {} is not a positive whole number",
            super::brief(&v.to_string(), 60)
        )),
    }
}

/// The `config.json` model types of the llama family's architectures, with their `model.kind`.
pub const LLAMA_TYPES: [(&str, &str); 7] = [
    ("llama", "llama"),
    ("mistral", "llama"),
    ("qwen2", "llama"),
    ("qwen3", "qwen3"),
    ("gemma3_text", "gemma3"),
    ("phi3", "phi3"),
    ("mixtral", "mixtral"),
];

/// Every `model_type` kiln computes.
pub const MODEL_TYPES: [&str; 8] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "phi3",
    "mixtral",
    "gpt2",
];

/// The sliding window and layer types of a llama-family `config.json`: its `layer_types` when
/// it has them (transformers 5 writes them for Qwen2, Qwen3 and Gemma 3), else every layer
/// sliding when `sliding_window` is set and used (Mistral, Phi-3, Mixtral; Gemma 3's five to
/// one by kiln's default); no window when no layer slides.
fn sliding(c: &Json) -> Result<(Option<Json>, Option<Json>), String> {
    let window = match c.get("sliding_window").filter(|v| !v.is_null()) {
        None => None,
        Some(v) if v.as_u64().is_some_and(|n| n > 0) => Some(v.clone()),
        Some(v) => {
            return Err(format!(
                "`sliding_window` = {} is not a positive whole number",
                super::brief(&v.to_string(), 60)
            ))
        }
    };
    let used = c.get("use_sliding_window").and_then(Json::as_bool) != Some(false);
    let Some(window) = window.filter(|_| used) else {
        return Ok((None, None));
    };
    match c.get("layer_types").filter(|v| !v.is_null()) {
        Some(Json::Array(types)) => {
            let ok = types
                .iter()
                .all(|t| matches!(t.as_str(), Some("sliding_attention" | "full_attention")));
            if !ok {
                return Err("`layer_types` has an entry other than \"sliding_attention\" and \"full_attention\"".into());
            }
            if types
                .iter()
                .any(|t| t.as_str() == Some("sliding_attention"))
            {
                Ok((Some(window), Some(Json::Array(types.clone()))))
            } else {
                Ok((None, None))
            }
        }
        Some(_) => Err("`layer_types` is not a list".into()),
        // (Gemma 3's five sliding layers to one global are kiln's default for it)
        None => Ok((Some(window), None)),
    }
}

/// Llama 3's rope scaling from `rope` (config.json's `rope_scaling` or `rope_parameters`), when
/// its type is llama3: every one of its four numbers, or an error naming the one missing (a
/// missing one said "`model` has the wrong type: found unit").
fn llama3_scaling(c: &Json, rope: Option<Json>) -> Result<Option<Json>, String> {
    let Some(r) = rope
        .filter(|r| r.get("rope_type").or(r.get("type")).and_then(Json::as_str) == Some("llama3"))
    else {
        return Ok(None);
    };
    let mut m = serde_json::Map::new();
    m.insert("rope_type".into(), "llama3".into());
    for k in [
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ] {
        let v = r.get(k).filter(|v| v.is_number()).cloned().ok_or_else(|| {
            let name = if c.get("rope_scaling").is_some_and(|v| !v.is_null()) {
                "rope_scaling"
            } else {
                "rope_parameters"
            };
            format!(
                "`{name}` has rope_type \"llama3\" but no number `{k}` (Llama 3's scaling takes factor, low_freq_factor, high_freq_factor and original_max_position_embeddings)"
            )
        })?;
        m.insert(k.into(), v);
    }
    Ok(Some(Json::Object(m)))
}

/// Two values alike: numbers by value (`10000` and `10000.0`), tables key by key.
fn same(a: &Json, b: &Json) -> bool {
    match (a, b) {
        (Json::Number(x), Json::Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Json::Object(x), Json::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// The layers `figment`'s `model.init_from` implies (see the module): its config.json's keys,
/// and `data.tokenizer` = the `tokenizer.json` beside the weights when no layer sets it.
pub fn layers(figment: &Figment) -> Result<Vec<(Metadata, Dict)>, ConfigError> {
    let Some((json_path, keys)) = layer(figment)? else {
        return Ok(Vec::new());
    };
    let mut out = vec![keys];
    let tokenizer = json_path.with_file_name("tokenizer.json");
    let set = figment
        .find_metadata("data.tokenizer")
        .is_some_and(|m| m.name != DEFAULT_SOURCE);
    if tokenizer.is_file() && !set {
        let mut data = Dict::new();
        data.insert(
            "tokenizer".into(),
            Value::from(tokenizer.display().to_string()),
        );
        let mut top = Dict::new();
        top.insert("data".into(), Value::from(data));
        let name = format!("{} (beside model.init_from)", tokenizer.display());
        out.push((Metadata::named(name), top));
    }
    Ok(out)
}

/// A config layer: where its values come from, and the values.
type Layer = (Metadata, Dict);

/// The config.json layer of `figment`'s `model.init_from` and that file's path, or `None`.
fn layer(figment: &Figment) -> Result<Option<(PathBuf, Layer)>, ConfigError> {
    let Some(value) = figment
        .find_value("model.init_from")
        .ok()
        .and_then(|v| v.into_string())
    else {
        return Ok(None);
    };
    let mut path = PathBuf::from(&value);
    if path.is_relative() {
        if let Some(dir) = figment
            .find_metadata("model.init_from")
            .and_then(|m| m.source.as_ref())
            .and_then(Source::file_path)
            .and_then(Path::parent)
        {
            path = dir.join(path);
        }
    }
    let Some(json_path) = config_json_of(&path) else {
        return Ok(None);
    };
    let shown = json_path.display().to_string();
    let key_error = |message: String, help: &str| {
        ConfigError::Key(KeyError {
            kind: KeyErrorKind::Other,
            key: "model.init_from".into(),
            message,
            source: describe_source(figment, "model.init_from"),
            help: Some(help.into()),
        })
    };
    let mut text = Vec::new();
    std::fs::File::open(&json_path)
        .and_then(|f| {
            std::io::Read::read_to_end(&mut std::io::Read::take(f, (1 << 20) + 1), &mut text)
        })
        .map_err(|e| {
            key_error(
                format!("cannot read `{shown}`: {e}"),
                "make it readable, or remove it",
            )
        })?;
    if text.len() > 1 << 20 {
        return Err(key_error(
            format!("`{shown}` is over 1 MiB: not a model's config.json"),
            "give the directory transformers' save_pretrained wrote",
        ));
    }
    let json: Json = serde_json::from_slice(&text).map_err(|e| {
        key_error(
            format!("`{shown}` is not JSON: {e}"),
            "fix or remove it; it is read for the model's settings",
        )
    })?;
    let keys = match model_keys(&json) {
        Ok(Some(keys)) => keys,
        Ok(None) => return Ok(None),
        Err(why) => {
            return Err(key_error(
                format!("`{shown}` {why}"),
                "fix config.json, or give the directory transformers' save_pretrained wrote",
            ))
        }
    };
    let json_path_out = json_path.clone();
    let mut dict = Dict::new();
    let mut disagree = Vec::new();
    for (key, theirs) in keys {
        let dotted = format!("model.{key}");
        let set = figment
            .find_metadata(&dotted)
            .is_some_and(|m| m.name != DEFAULT_SOURCE);
        let ours = figment
            .find_value(&dotted)
            .ok()
            .and_then(|v| serde_json::to_value(&v).ok());
        match ours.filter(|_| set) {
            // the context trained on may be shorter (or longer) than the model's positions
            Some(_) if key == "block_size" => {}
            Some(ours) if !same(&ours, &theirs) => disagree.push(format!(
                "  `{dotted}` = {ours} ({}), but config.json says {theirs}",
                describe_source(figment, &dotted)
            )),
            Some(_) => {}
            None => {
                dict.insert(
                    key.to_string(),
                    Value::serialize(&theirs)
                        .map_err(|e| key_error(format!("`{shown}`: {key}: {e}"), "fix the file"))?,
                );
            }
        }
    }
    if !disagree.is_empty() {
        return Err(ConfigError::Key(KeyError {
            kind: KeyErrorKind::Other,
            key: "model.init_from".into(),
            message: format!(
                "[model] disagrees with the config.json of model.init_from (`{shown}`):\n{}",
                disagree.join("\n")
            ),
            source: describe_source(figment, "model.init_from"),
            help: Some("leave those keys out of [model] (they come from config.json), or set them as it says".into()),
        }));
    }
    let mut top = Dict::new();
    top.insert("model".into(), Value::from(dict));
    Ok(Some((
        json_path_out,
        (Metadata::from(shown, Source::File(json_path)), top),
    )))
}
