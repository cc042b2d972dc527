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
            return Err("has no `model_type`: transformers' save_pretrained writes one (\"llama\", \"mistral\", \"qwen2\", \"gpt2\" are the ones kiln reads)".into())
        }
        Some(other) => {
            return Err(format!(
                "`model_type` = {} is not a name (\"llama\", \"mistral\", \"qwen2\", \"gpt2\" are the ones kiln reads)",
                super::brief(&other.to_string(), 60)
            ))
        }
    };
    // a positive whole number where one must be (it was ignored when it was a string, a
    // fraction or negative)
    let count = |k: &str| -> Result<Option<Json>, String> {
        match get(k) {
            None => Ok(None),
            Some(v) if v.as_u64().is_some_and(|n| n > 0) => Ok(Some(v)),
            Some(v) => Err(format!(
                "`{k}` = {} is not a positive whole number",
                super::brief(&v.to_string(), 60)
            )),
        }
    };
    let mut out: Vec<(&'static str, Option<Json>)> = Vec::new();
    match model_type {
        "llama" | "mistral" | "qwen2" => {
            let rope = get("rope_scaling").or(get("rope_parameters"));
            let theta =
                get("rope_theta").or(rope.as_ref().and_then(|r| r.get("rope_theta").cloned()));
            let scaling = llama3_scaling(c, rope)?;
            out.extend([
                ("kind", Some("llama".into())),
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
                ("rope_theta", theta),
                ("rope_scaling", scaling),
                // (transformers' Llama, Mistral and Qwen2 configs default to 1e-6)
                ("norm_eps", Some(get("rms_norm_eps").unwrap_or(1e-6.into()))),
                (
                    "tie_embeddings",
                    Some(get("tie_word_embeddings").unwrap_or(false.into())),
                ),
                ("attn_bias", Some((model_type == "qwen2").into())),
            ]);
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
        _ => return Ok(None),
    }
    Ok(Some(
        out.into_iter().filter_map(|(k, v)| Some((k, v?))).collect(),
    ))
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
