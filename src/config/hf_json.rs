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
    let model_type = match c.get("model_type") {
        Some(Json::String(t)) => t.as_str(),
        // (it was ignored, and kiln's defaults applied)
        None | Some(Json::Null) => {
            return Err("has no `model_type`: transformers' save_pretrained writes one (kiln computes: llama, mistral, qwen2, qwen3, gemma3_text, gemma3, phi3, mixtral, gpt2)".into())
        }
        Some(other) => {
            return Err(format!(
                "`model_type` = {} is not a name (kiln computes: llama, mistral, qwen2, qwen3, gemma3_text, gemma3, phi3, mixtral, gpt2)",
                super::brief(&other.to_string(), 60)
            ))
        }
    };
    // (Gemma 3 4B-27B: a vision-language model, whose language model kiln computes; a
    // Gemma 3 config takes transformers' defaults for the keys it leaves out)
    let mut lm = language_model(c)?.into_owned();
    let lm_of_vision = model_type == "gemma3";
    let model_type = if lm_of_vision {
        "gemma3_text"
    } else {
        model_type
    };
    if model_type == "gemma3_text" {
        gemma3_defaults(&mut lm);
    }
    let c = &lm;
    let within = |e: String| {
        if lm_of_vision {
            format!("{e}; in `text_config`, Gemma 3's language model's settings")
        } else {
            e
        }
    };
    let get = |k: &str| c.get(k).filter(|v| !v.is_null()).cloned();
    let mut out: Vec<(&'static str, Option<Json>)> = Vec::new();
    let family = LLAMA_TYPES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, kind)| *kind);
    match model_type {
        _ if family.is_some() => {
            out = llama_keys(c, model_type, family.unwrap_or("llama")).map_err(within)?;
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

/// Where a vision-language model's language model sits among its modules (PEFT's names of
/// them since transformers 4.52: `model.language_model.layers.0.self_attn.q_proj`).
pub const VISION_LANGUAGE_MODULES: &str = "model.language_model.";

/// What of a Gemma 3 vision-language model is not its language model: the checkpoint's tensors
/// (and PEFT's modules, under `model.`) with these prefixes.
pub const VISION_SIDE: [&str; 2] = ["vision_tower.", "multi_modal_projector."];

/// `VISION_LANGUAGE_MODULES` when `init_from` is a vision-language model's directory (Gemma 3
/// 4B-27B), `None` when it is a language model's; an error saying why its config.json cannot
/// be read (then nobody can tell).
pub fn language_model_modules(init_from: &Path) -> Result<Option<&'static str>, String> {
    let path = config_json_of(init_from)
        .ok_or_else(|| format!("`{}` has no config.json", init_from.display()))?;
    let text = std::fs::read(&path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let c: Json = serde_json::from_slice(&text)
        .map_err(|e| format!("`{}` is not JSON: {e}", path.display()))?;
    Ok(
        (c.get("model_type").and_then(Json::as_str) == Some("gemma3"))
            .then_some(VISION_LANGUAGE_MODULES),
    )
}

/// The config.json of the language model `c` describes: `c` itself, or a Gemma 3
/// vision-language model's (`model_type` "gemma3", `Gemma3ForConditionalGeneration`) `text_config`
/// with transformers' `Gemma3TextConfig` defaults where it leaves a key out (the Hub's Gemma 3
/// 4B-27B configs set a few keys only) and the whole model's `tie_word_embeddings`. An error
/// says what is wrong with `text_config`.
pub fn language_model(c: &Json) -> Result<std::borrow::Cow<'_, Json>, String> {
    if c.get("model_type").and_then(Json::as_str) != Some("gemma3") {
        return Ok(std::borrow::Cow::Borrowed(c));
    }
    let mut text = match c.get("text_config") {
        None | Some(Json::Null) => serde_json::Map::new(),
        Some(Json::Object(t)) => t.clone(),
        Some(_) => return Err("has model_type \"gemma3\" and a `text_config` that is not a table (Gemma 3's language model's settings)".into()),
    };
    match text.get("model_type") {
        None | Some(Json::Null) => {}
        Some(Json::String(t)) if t == "gemma3_text" => {}
        Some(t) => {
            return Err(format!(
            "has model_type \"gemma3\" and a `text_config` of model_type {}, not \"gemma3_text\"",
            super::brief(&t.to_string(), 40)
        ))
        }
    }
    text.insert("model_type".into(), "gemma3_text".into());
    // (the whole model's ties the head, `Gemma3Config`'s default true; text_config's is not
    // read)
    let tie = c
        .get("tie_word_embeddings")
        .filter(|v| !v.is_null())
        .cloned()
        .unwrap_or(true.into());
    text.insert("tie_word_embeddings".into(), tie);
    let mut text = Json::Object(text);
    gemma3_defaults(&mut text);
    Ok(std::borrow::Cow::Owned(text))
}

/// transformers' `Gemma3TextConfig` defaults (Gemma 3 1B's shape is not them: 4B's and up
/// leave these out of their `text_config`), where `c` leaves a key out.
fn gemma3_defaults(c: &mut Json) {
    let Some(m) = c.as_object_mut() else { return };
    for (k, v) in [
        ("vocab_size", json_u(262_208)),
        ("hidden_size", json_u(2304)),
        ("intermediate_size", json_u(9216)),
        ("num_hidden_layers", json_u(26)),
        ("num_attention_heads", json_u(8)),
        ("num_key_value_heads", json_u(4)),
        ("max_position_embeddings", json_u(131_072)),
    ] {
        if m.get(k).is_none_or(Json::is_null) {
            m.insert(k.into(), v);
        }
    }
    // (not `[model]` keys: an export's config.json takes them; null is transformers' None)
    for (k, v) in [
        ("bos_token_id", 2),
        ("eos_token_id", 1),
        ("pad_token_id", 0),
    ] {
        m.entry(k).or_insert(json_u(v));
    }
}

fn json_u(v: u64) -> Json {
    Json::from(v)
}

/// The rotary keys of a llama-family config.json: the global base, Llama 3's scaling, Gemma
/// 3's local base (`rope_parameters` over the top-level `rope_theta`, as transformers takes
/// them; without either, its config class's default: Mixtral's and Gemma 3's global 1e6).
#[allow(clippy::type_complexity)]
fn rope_keys(
    c: &Json,
    model_type: &str,
) -> Result<(Option<Json>, Option<Json>, Option<Json>), String> {
    let get = |k: &str| c.get(k).filter(|v| !v.is_null()).cloned();
    let rope = get("rope_scaling").or(get("rope_parameters"));
    // (Gemma 3's rope_parameters have one entry per layer type)
    let global = rope
        .as_ref()
        .and_then(|r| r.get("full_attention").cloned())
        .or(rope.clone());
    let local = rope
        .as_ref()
        .and_then(|r| r.get("sliding_attention").cloned());
    for (key, v) in [
        ("rope_parameters", get("rope_parameters")),
        ("rope_scaling", get("rope_scaling")),
    ] {
        if v.as_ref().is_some_and(|v| !v.is_object()) {
            return Err(format!("`{key}` is not a table"));
        }
    }
    let theta = global
        .as_ref()
        .and_then(|r| r.get("rope_theta").cloned())
        .or(get("rope_theta"))
        .or(match model_type {
            "mixtral" | "gemma3_text" => Some(1e6.into()),
            _ => None,
        });
    let scaling = rope_scaling(c, global)?;
    let local = local
        .and_then(|r| r.get("rope_theta").cloned())
        .or(get("rope_local_base_freq"));
    Ok((theta, scaling, local))
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
    let (theta, scaling, local) = rope_keys(c, model_type)?;
    let (window, types) = sliding(c, model_type)?;
    // transformers' defaults where config.json leaves a key out
    let default_head_dim = match model_type {
        "qwen3" => Some(128.into()),
        "gemma3_text" => Some(256.into()),
        _ => None,
    };
    let default_eps = if matches!(model_type, "phi3" | "mixtral") {
        1e-5
    } else {
        1e-6
    };
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
        ("head_dim", count("head_dim")?.or(default_head_dim).filter(|hd| {
            let (d, h) = (
                c.get("hidden_size").and_then(Json::as_u64),
                c.get("num_attention_heads").and_then(Json::as_u64),
            );
            !matches!((d, h, hd.as_u64()), (Some(d), Some(h), Some(hd)) if h > 0 && d / h == hd && d % h == 0)
        })),
        ("rope_theta", theta),
        ("rope_scaling", scaling),
        // (transformers' configs default to 1e-6, Phi-3's and Mixtral's to 1e-5)
        ("norm_eps", Some(get("rms_norm_eps").unwrap_or(default_eps.into()))),
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
            ("rope_local_theta", local),
            (
                "query_pre_attn_scalar",
                Some(get("query_pre_attn_scalar").unwrap_or(256.into())),
            ),
        ]);
    }
    if kind == "mixtral" {
        out.extend([
            (
                "experts",
                Some(count("num_local_experts")?.unwrap_or(8.into())),
            ),
            (
                "experts_per_token",
                Some(count("num_experts_per_tok")?.unwrap_or(2.into())),
            ),
            // transformers adds the router's loss only with `output_router_logits` (false by
            // default): a training setting `model.router_aux_loss_coef` may change
            (
                "router_aux_loss_coef",
                Some(
                    if c.get("output_router_logits").and_then(Json::as_bool) == Some(true) {
                        get("router_aux_loss_coef").unwrap_or(0.001.into())
                    } else {
                        0.0.into()
                    },
                ),
            ),
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
pub const MODEL_TYPES: [&str; 9] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma3",
    "phi3",
    "mixtral",
    "gpt2",
];

/// The sliding window and layer types of a llama-family `config.json` of `model_type`, as
/// transformers reads them: Llama never slides; Mistral, Phi-3 and Mixtral slide every layer
/// when `sliding_window` is set (Mistral honours `layer_types`); Qwen2 and Qwen3 only with
/// `use_sliding_window`, the layers from `max_window_layers` on (28 by default) unless
/// `layer_types` says; Gemma 3's window (4096 by default) in its `layer_types`, else five
/// sliding layers to one global (`sliding_window_pattern`). No window when no layer slides.
fn sliding(c: &Json, model_type: &str) -> Result<(Option<Json>, Option<Json>), String> {
    let layers = c
        .get("num_hidden_layers")
        .and_then(Json::as_u64)
        .unwrap_or(0) as usize;
    let mut window = count_of(c, "sliding_window")?;
    let listed = match c.get("layer_types").filter(|v| !v.is_null()) {
        None => None,
        Some(Json::Array(types)) => {
            let slides: Option<Vec<bool>> = types
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Some(true),
                    Some("full_attention") => Some(false),
                    _ => None,
                })
                .collect();
            Some(slides.ok_or("`layer_types` has an entry other than \"sliding_attention\" and \"full_attention\"")?)
        }
        Some(_) => return Err("`layer_types` is not a list".into()),
    };
    let slides: Vec<bool> = match model_type {
        "llama" => return Ok((None, None)),
        "phi3" | "mixtral" => vec![true; layers],
        "mistral" => listed.unwrap_or_else(|| vec![true; layers]),
        "qwen2" | "qwen3" => {
            let used = match c.get("use_sliding_window") {
                None | Some(Json::Null) => false,
                Some(Json::Bool(b)) => *b,
                Some(v) => {
                    return Err(format!(
                        "`use_sliding_window` = {} is not true or false",
                        super::brief(&v.to_string(), 40)
                    ))
                }
            };
            if !used {
                return Ok((None, None));
            }
            window = window.or(Some(4096.into()));
            let from = count_of(c, "max_window_layers")?
                .and_then(|v| v.as_u64())
                .unwrap_or(28) as usize;
            listed.unwrap_or_else(|| (0..layers).map(|i| i >= from).collect())
        }
        // gemma3_text
        _ => {
            if c.get("sliding_window").is_some_and(Json::is_null) {
                return Err("`sliding_window` is null, but Gemma 3's local layers need one".into());
            }
            window = window.or(Some(4096.into()));
            let pattern = count_of(c, "sliding_window_pattern")?
                .and_then(|v| v.as_u64())
                .unwrap_or(6) as usize;
            listed.unwrap_or_else(|| (0..layers).map(|i| (i + 1) % pattern != 0).collect())
        }
    };
    if window.is_none() || !slides.contains(&true) {
        return Ok((None, None));
    }
    let types: Vec<Json> = slides
        .iter()
        .map(|&s| {
            if s {
                "sliding_attention"
            } else {
                "full_attention"
            }
            .into()
        })
        .collect();
    Ok((window, Some(Json::Array(types))))
}

/// The rope scaling of `rope` (config.json's `rope_scaling` or `rope_parameters`, the global
/// layers' entry of Gemma 3's) when kiln computes its type: Llama 3's, every one of its four
/// numbers, or linear's factor; an error naming a number that is missing (a missing one said
/// "`model` has the wrong type: found unit"). Another type is refused when the weights load
/// (`model::llama::hf::mismatches`).
fn rope_scaling(c: &Json, rope: Option<Json>) -> Result<Option<Json>, String> {
    let Some((r, rope_type)) = rope.and_then(|r| {
        let t = r
            .get("rope_type")
            .or(r.get("type"))
            .and_then(Json::as_str)?;
        matches!(t, "llama3" | "linear").then(|| (r.clone(), t.to_string()))
    }) else {
        return Ok(None);
    };
    let mut m = serde_json::Map::new();
    m.insert("rope_type".into(), rope_type.as_str().into());
    let numbers: &[&str] = if rope_type == "linear" {
        &["factor"]
    } else {
        &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ]
    };
    for k in numbers {
        let v = r.get(*k).filter(|v| v.is_number()).cloned().ok_or_else(|| {
            let name = if c.get("rope_scaling").is_some_and(|v| !v.is_null()) {
                "rope_scaling"
            } else {
                "rope_parameters"
            };
            let takes = if rope_type == "linear" {
                "linear scaling takes a factor"
            } else {
                "Llama 3's scaling takes factor, low_freq_factor, high_freq_factor and original_max_position_embeddings"
            };
            format!("`{name}` has rope_type \"{rope_type}\" but no number `{k}` ({takes})")
        })?;
        m.insert((*k).into(), v);
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

/// Whether `figment`'s model takes `json` (a config.json) as its own: another architecture is
/// refused only for a model it would give its weights to (a config.json beside the weights of
/// a model of kiln's mlp or cnn, or of a user's family, is not that model's).
fn reads_config(figment: &Figment, json: &Json) -> bool {
    let kind = figment
        .find_metadata("model.kind")
        .filter(|m| m.name != DEFAULT_SOURCE)
        .and_then(|_| figment.find_value("model.kind").ok())
        .and_then(|v| v.into_string());
    let known = json
        .get("model_type")
        .and_then(Json::as_str)
        .is_none_or(|t| MODEL_TYPES.contains(&t));
    known || kind.is_none_or(|k| k == "gpt" || LLAMA_TYPES.iter().any(|(_, kind)| *kind == k))
}

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
    if !reads_config(figment, &json) {
        return Ok(None);
    }
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
            // (a training setting: `output_router_logits` is config.json's)
            Some(_) if key == "block_size" || key == "router_aux_loss_coef" => {}
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The `[model]` keys a config.json gives, by name.
    fn keys(c: Json) -> std::collections::BTreeMap<&'static str, Json> {
        model_keys(&c).unwrap().unwrap().into_iter().collect()
    }

    fn types(list: &[&str]) -> Json {
        json!(list)
    }

    /// Gemma 3 4B's config.json as the Hub has it (transformers 4.50 wrote it): a
    /// vision-language model whose `text_config` sets five keys and a linear rope scaling; kiln
    /// reads its language model as transformers 5.25's `Gemma3TextConfig` does (checked with
    /// `AutoConfig.from_pretrained(...).text_config`).
    #[test]
    fn a_vision_language_gemma3_reads_as_its_language_model() {
        let k = keys(json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
            "mm_tokens_per_image": 256, "eos_token_id": [1, 106],
            "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                "model_type": "gemma3_text", "num_hidden_layers": 34,
                "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
            "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}
        }));
        for (key, want) in [
            ("kind", json!("gemma3")),
            ("vocab_size", json!(262_208)),
            ("dim", json!(2560)),
            ("ffn_dim", json!(10240)),
            ("layers", json!(34)),
            ("heads", json!(8)),
            ("kv_heads", json!(4)),
            ("head_dim", json!(256)),
            ("block_size", json!(MAX_BLOCK)),
            ("rope_theta", json!(1e6)),
            (
                "rope_scaling",
                json!({"rope_type": "linear", "factor": 8.0}),
            ),
            ("sliding_window", json!(1024)),
            ("query_pre_attn_scalar", json!(256)),
            ("tie_embeddings", json!(true)),
            ("norm_eps", json!(1e-6)),
        ] {
            assert_eq!(k.get(key), Some(&want), "{key}: {k:?}");
        }
        let types = k["layer_types"].as_array().unwrap();
        assert_eq!(types.len(), 34);
        assert_eq!(types[5], json!("full_attention"));
        assert_eq!(types[6], json!("sliding_attention"));
        // transformers 5's rope_parameters, one entry per layer type
        let k = keys(
            json!({"model_type": "gemma3", "text_config": {"rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 5e5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}}}),
        );
        assert_eq!(
            k["rope_scaling"],
            json!({"rope_type": "linear", "factor": 4.0})
        );
        assert_eq!(k["rope_theta"], json!(5e5));
        assert_eq!(k["rope_local_theta"], json!(2e4));
        // the special tokens an export writes: Gemma3TextConfig's where text_config leaves them
        // out, null where it says null (transformers' None)
        let vl = json!({"model_type": "gemma3", "text_config": {"pad_token_id": null}});
        let lm = language_model(&vl).unwrap();
        assert_eq!(
            [
                &lm["bos_token_id"],
                &lm["eos_token_id"],
                &lm["pad_token_id"]
            ],
            [&json!(2), &json!(1), &Json::Null]
        );
        // the whole model's tie_word_embeddings ties the head (true by default), not text_config's
        let tie = |c: Json| keys(c)["tie_embeddings"].clone();
        let text = json!({"tie_word_embeddings": false});
        assert_eq!(
            tie(json!({"model_type": "gemma3", "text_config": text})),
            json!(true)
        );
        assert_eq!(
            tie(json!({"model_type": "gemma3", "tie_word_embeddings": false, "text_config": {}})),
            json!(false)
        );
        // what is not Gemma 3's language model is named, a key of its text_config as such
        for (c, says) in [
            (
                json!({"model_type": "gemma3", "text_config": 3}),
                "not a table",
            ),
            (
                json!({"model_type": "gemma3", "text_config": {"model_type": "llama"}}),
                "\"llama\"",
            ),
            (
                json!({"model_type": "gemma3", "text_config": {"rope_scaling": {"rope_type": "linear"}}}),
                "no number `factor` (linear scaling takes a factor); in `text_config`",
            ),
        ] {
            let e = model_keys(&c).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    /// Windows and layer types as transformers 5.25 reads each model type's config.
    #[test]
    fn sliding_windows_are_read_as_transformers_reads_them() {
        let base = |t: &str, extra: Json| {
            let mut c = json!({"model_type": t, "num_hidden_layers": 2, "hidden_size": 32,
                "num_attention_heads": 4});
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            keys(c)
        };
        // Llama never slides; Qwen2/3 only with use_sliding_window, from max_window_layers on
        assert!(!base("llama", json!({"sliding_window": 4})).contains_key("sliding_window"));
        assert!(!base("qwen3", json!({"sliding_window": 4})).contains_key("sliding_window"));
        let q = base(
            "qwen3",
            json!({"sliding_window": 4, "use_sliding_window": true, "max_window_layers": 1}),
        );
        assert_eq!(
            q["layer_types"],
            types(&["full_attention", "sliding_attention"])
        );
        // Phi-3 and Mixtral slide every layer whatever layer_types says
        let p = base(
            "phi3",
            json!({"sliding_window": 4, "layer_types": ["full_attention", "sliding_attention"]}),
        );
        assert_eq!(
            p["layer_types"],
            types(&["sliding_attention", "sliding_attention"])
        );
        // Gemma 3: a window of 4096 by default, sliding_window_pattern honoured
        let g = base(
            "gemma3_text",
            json!({"sliding_window_pattern": 2, "num_hidden_layers": 4}),
        );
        assert_eq!(g["sliding_window"], json!(4096));
        assert_eq!(
            g["layer_types"],
            types(&[
                "sliding_attention",
                "full_attention",
                "sliding_attention",
                "full_attention"
            ])
        );
        assert!(
            model_keys(&json!({"model_type": "qwen3", "use_sliding_window": "false"}))
                .unwrap_err()
                .contains("use_sliding_window")
        );
    }

    /// transformers' defaults where config.json leaves a key out.
    #[test]
    fn missing_keys_take_transformers_defaults() {
        let m = keys(json!({"model_type": "mixtral"}));
        assert_eq!(
            (&m["rope_theta"], &m["norm_eps"], &m["experts"]),
            (&json!(1e6), &json!(1e-5), &json!(8))
        );
        // the router's loss only with output_router_logits
        assert_eq!(m["router_aux_loss_coef"], json!(0.0));
        let m = keys(
            json!({"model_type": "mixtral", "output_router_logits": true,
            "router_aux_loss_coef": 0.02}),
        );
        assert_eq!(m["router_aux_loss_coef"], json!(0.02));
        let g = keys(json!({"model_type": "gemma3_text", "hidden_size": 32,
            "num_attention_heads": 4}));
        assert_eq!(
            (
                &g["query_pre_attn_scalar"],
                &g["head_dim"],
                &g["rope_theta"]
            ),
            (&json!(256), &json!(256), &json!(1e6))
        );
        // rope_parameters' theta wins over a top-level one
        let q = keys(json!({"model_type": "qwen3", "rope_theta": 1.0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}));
        assert_eq!(q["rope_theta"], json!(5.0));
        // with both, transformers 5 takes `rope_scaling` whole (`convert_rope_params_to_dict`:
        // `rope_scaling or rope_parameters`) and the top-level theta: rope_parameters' is dropped
        let both = json!({"model_type": "llama", "rope_theta": 7.0,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}});
        let b = keys(both.clone());
        assert_eq!(
            (&b["rope_theta"], &b["rope_scaling"]["factor"]),
            (&json!(7.0), &json!(4.0))
        );
        let mut none = both;
        none.as_object_mut().unwrap().remove("rope_theta");
        assert_eq!(keys(none).get("rope_theta"), None);
    }
}
