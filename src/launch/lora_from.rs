//! `model.lora.init_from`: LoRA adapters from a PEFT adapter directory (`adapter_config.json`
//! and `adapter_model.safetensors`, as `PeftModel.save_pretrained` and `kiln export --format
//! peft` write them), checked against `[model.lora]` and the model.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::checkpoint::tensors;
use crate::config::hf_json::VISION_LANGUAGE_MODULES as VISION_LANGUAGE;
use crate::config::Resolved;
use crate::error::{Error, Result};
use crate::model::lora::PEFT;
use crate::model::portable::externals;
use crate::model::Model;

const KEY: &str = "model.lora.init_from";

/// How PEFT named a vision-language base's language model's modules before transformers
/// 4.52 (`language_model.model.layers...`, the checkpoint's names).
const VISION_LANGUAGE_OLD: &str = "language_model.model.";

fn usage(why: String, help: &str) -> Error {
    Error::Usage(format!("{KEY}: {why}\n  = help: {help}"))
}

/// Writes the adapters of the PEFT directory at `value` into `params` (in `model`'s layout).
pub fn load_adapter(
    r: &Resolved,
    model: &dyn Model,
    value: &str,
    params: &mut [f32],
) -> Result<()> {
    let dir = r.path_of(KEY, value);
    let shown = dir.display().to_string();
    if !dir.is_dir() {
        return Err(usage(
            format!("`{shown}` is not a directory"),
            "give the directory `PeftModel.save_pretrained` or `kiln export --format peft` wrote",
        ));
    }
    let Some(spec) = model.weights().lora() else {
        return Err(usage(
            "the model has no LoRA adapters (`[model.lora]` with a rank)".into(),
            "set `model.lora.rank` and `model.lora.targets` as the adapter's were made",
        ));
    };
    check_config(&dir.join("adapter_config.json"), spec)?;
    let file = dir.join("adapter_model.safetensors");
    let lazy = tensors::Lazy::open(&file).map_err(|e| {
        usage(
            format!("`{}`: {e}", file.display()),
            "PEFT saves the adapter's weights as adapter_model.safetensors (safe_serialization)",
        )
    })?;
    let layout = model.layout();
    let want = externals(model, PEFT);
    let at: HashMap<&str, usize> = lazy
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.name.as_str(), i))
        .collect();
    // PEFT writes without the adapter's name; a file saved with it has `.default.` inside. On
    // a vision-language base (Gemma 3 4B-27B) the language model's modules are
    // `model.language_model.layers...` (`language_model.model.layers...` before transformers
    // 4.52) where kiln's are `model.layers...`
    let find = |name: &str| {
        let named = |n: &str| {
            at.get(n).copied().or_else(|| {
                let (stem, leaf) = n.rsplit_once('.')?;
                at.get(format!("{stem}.default.{leaf}").as_str()).copied()
            })
        };
        let rest = name.strip_prefix("base_model.model.model.");
        named(name)
            .or_else(|| named(&format!("base_model.model.{VISION_LANGUAGE}{}", rest?)))
            .or_else(|| named(&format!("base_model.model.{VISION_LANGUAGE_OLD}{}", rest?)))
    };
    let mut problems = Vec::new();
    let mut used = HashSet::new();
    let mut reads = Vec::new();
    for e in &want {
        match find(&e.name) {
            None => problems.push(format!("`{}` is missing", e.name)),
            Some(i) if lazy.entries[i].shape != e.shape => problems.push(format!(
                "`{}` has shape {:?}, the model's is {:?}",
                e.name, lazy.entries[i].shape, e.shape
            )),
            Some(i) => {
                used.insert(i);
                reads.push((e, i));
            }
        }
    }
    for (i, e) in lazy.entries.iter().enumerate() {
        if !used.contains(&i) && problems.len() < 12 {
            problems.push(not_ours(&e.name));
        }
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(10);
        return Err(usage(
            format!(
                "`{}` does not fit the model's adapters ({n} problem(s)): {}",
                file.display(),
                problems.join("; ")
            ),
            "the adapter must be for this base model with these targets (an adapter of another model has other names or shapes)",
        ));
    }
    for (e, i) in reads {
        let values = lazy.read(i).map_err(|why| {
            usage(
                format!("`{}`: {why}", file.display()),
                "save the adapter again",
            )
        })?;
        if values.iter().any(|v| !v.is_finite()) {
            return Err(usage(
                format!(
                    "`{}` holds NaN or infinite values in `{}`",
                    file.display(),
                    e.name
                ),
                "save the adapter again from a healthy model",
            ));
        }
        let p = &layout.params[e.param];
        let out = &mut params[p.range()];
        if e.transpose {
            let (rows, cols) = (e.shape[0], e.shape[1]);
            for (rr, row) in values.chunks_exact(cols).enumerate() {
                for (c, v) in row.iter().enumerate() {
                    out[c * rows + rr] = *v;
                }
            }
        } else {
            out.copy_from_slice(&values);
        }
    }
    Ok(())
}

/// What is wrong with a tensor `name` of the adapter file that no adapter of the model is.
fn not_ours(name: &str) -> String {
    let shown = crate::ui::printable(name);
    // (`base_model.model.vision_tower.` before transformers 4.52)
    let vision = crate::config::hf_json::VISION_SIDE.iter().any(|p| {
        ["base_model.model.model.", "base_model.model."]
            .iter()
            .any(|at| name.starts_with(&format!("{at}{p}")))
    });
    if vision {
        format!("`{shown}` adapts the vision tower, which kiln does not compute (make the adapter for the language model alone: PEFT's target_modules = r\"model\\.language_model\\..*\\.(q_proj|v_proj)\" with your modules)")
    } else {
        format!("`{shown}` is not an adapter of this model")
    }
}

/// `adapter_config.json` against `[model.lora]`: its rank, alpha and target modules, and no
/// variant kiln does not compute (DoRA, rsLoRA, per-layer ranks).
fn check_config(path: &Path, spec: &crate::model::lora::LoraSpec) -> Result<()> {
    let help = "set [model.lora] as the adapter was made (its adapter_config.json)";
    let text = crate::data::read_bounded(path, KEY, Some(1 << 20)).map_err(|e| {
        usage(
            format!("{e}"),
            "PEFT writes adapter_config.json beside the weights",
        )
    })?;
    let c: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        usage(
            format!("`{}` is not JSON: {e}", path.display()),
            "save the adapter again",
        )
    })?;
    let mut bad = Vec::new();
    // (a value as the file has it, for the message: its JSON, shortened and printable)
    let shown = |key: &str| match c.get(key) {
        None => "missing".to_string(),
        Some(v) => crate::ui::printable(&crate::config::brief(&v.to_string(), 60)).into_owned(),
    };
    match c.get("peft_type").and_then(|v| v.as_str()) {
        Some("LORA") => {}
        _ => bad.push(format!(
            "`peft_type` is {}, not \"LORA\"",
            shown("peft_type")
        )),
    }
    match c.get("r").and_then(|v| v.as_u64()) {
        Some(r) if r as usize == spec.rank => {}
        _ => bad.push(format!(
            "`r` is {}, `model.lora.rank` = {}",
            shown("r"),
            spec.rank
        )),
    }
    match c.get("lora_alpha").and_then(|v| v.as_f64()) {
        Some(a) if (a - spec.alpha).abs() < 1e-9 => {}
        _ => bad.push(format!(
            "`lora_alpha` is {}, `model.lora.alpha` = {}",
            shown("lora_alpha"),
            spec.alpha
        )),
    }
    // what kiln's adapters are not: biases trained, whole modules saved, some layers only
    if c.get("bias")
        .and_then(|v| v.as_str())
        .is_some_and(|b| b != "none")
    {
        bad.push(format!(
            "`bias` is {} (kiln trains no biases with LoRA: \"none\")",
            shown("bias")
        ));
    }
    for key in ["modules_to_save", "layers_to_transform", "layers_pattern"] {
        let set = match c.get(key) {
            None | Some(serde_json::Value::Null) => false,
            Some(serde_json::Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if set {
            bad.push(format!(
                "`{key}` is {} (kiln adapts every layer's targets and nothing else)",
                shown(key)
            ));
        }
    }
    let theirs: Option<Vec<String>> = match c.get("target_modules") {
        Some(serde_json::Value::Array(a)) => {
            a.iter().map(|v| v.as_str().map(str::to_string)).collect()
        }
        // the one pattern read: a vision-language base's language model's modules, as `kiln
        // export --format peft` writes it (`model\.language_model\..*\.(q_proj|v_proj)`)
        Some(serde_json::Value::String(p)) => language_model_targets(p),
        _ => None,
    };
    match theirs {
        Some(mut t) => {
            let mut ours = spec.targets.clone();
            t.sort();
            ours.sort();
            if t != ours {
                bad.push(format!(
                    "`target_modules` is {}, `model.lora.targets` resolves to {ours:?}",
                    shown("target_modules")
                ));
            }
        }
        None => bad.push(format!(
            "`target_modules` is {}: kiln reads a list of module names, or for a vision-language base the one pattern model\\.language_model\\..*\\.(NAME|NAME...) as kiln's export writes it",
            shown("target_modules")
        )),
    }
    for key in ["use_dora", "use_rslora"] {
        if c.get(key).and_then(|v| v.as_bool()) == Some(true) {
            bad.push(format!("`{key}` is true (kiln computes plain LoRA)"));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if c.get(key)
            .and_then(|v| v.as_object())
            .is_some_and(|o| !o.is_empty())
        {
            bad.push(format!(
                "`{key}` is not empty (one rank and alpha for every layer here)"
            ));
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    Err(usage(
        format!(
            "`{}` disagrees with [model.lora]: {}",
            path.display(),
            bad.join("; ")
        ),
        help,
    ))
}

/// The modules of `target_modules` = `pattern` when it names a vision-language base's language
/// model's modules as `kiln export --format peft` writes it
/// (`model\.language_model\..*\.(q_proj|v_proj)`); `None` for any other pattern.
fn language_model_targets(pattern: &str) -> Option<Vec<String>> {
    let empty = crate::model::lora::modules_pattern(VISION_LANGUAGE, &[]);
    let head = empty.strip_suffix(')')?;
    let names = pattern.strip_prefix(head)?.strip_suffix(')')?;
    let names: Vec<String> = names.split('|').map(str::to_string).collect();
    names
        .iter()
        .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .then_some(names)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_language_model_pattern_is_read_and_no_other() {
        let read = super::language_model_targets;
        assert_eq!(
            read(r"model\.language_model\..*\.(q_proj|v_proj)"),
            Some(vec!["q_proj".to_string(), "v_proj".to_string()])
        );
        for other in [
            r"model\.language_model\..*\.(q_proj|v_.*)",
            r"model\.language_model\..*\.()",
            r".*\.(q_proj|v_proj)",
            r"model\.language_model\..*\.(q_proj|v_proj)x",
        ] {
            assert_eq!(read(other), None, "{other}");
        }
    }
}
