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
    check_config(&dir.join("adapter_config.json"), spec, &modules_of(model))?;
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
fn check_config(path: &Path, spec: &crate::model::lora::LoraSpec, modules: &Modules) -> Result<()> {
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
    for key in [
        "modules_to_save",
        "layers_to_transform",
        "layers_pattern",
        "target_parameters",
    ] {
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
    if let Err(why) = same_targets(&c, modules) {
        bad.push(format!(
            "`target_modules` is {}: {why}, `model.lora.targets` resolves to {:?}",
            shown("target_modules"),
            spec.targets
        ));
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

/// The base's modules PEFT may adapt, under kiln's Hugging Face names (`model.layers.0.self_attn.q_proj`,
/// `lm_head`; the weights' names less their leaf), and those kiln's adapters adapt.
struct Modules {
    all: Vec<String>,
    adapted: Vec<String>,
}

fn modules_of(model: &dyn Model) -> Modules {
    let layout = model.layout();
    let stem = |n: &str| n.rsplit_once('.').map_or(n, |(s, _)| s).to_string();
    let base = model
        .weights()
        .formats()
        .into_iter()
        .find(|f| f.is_dir())
        .unwrap_or(crate::model::portable::WeightFormat::PyTorch);
    let mut all: Vec<String> = externals(model, base)
        .iter()
        .filter(|e| !crate::model::lora::is_adapter(&layout.params[e.param].name))
        .map(|e| stem(&e.name))
        .collect();
    all.dedup();
    let mut adapted: Vec<String> = externals(model, PEFT)
        .iter()
        .filter_map(|e| {
            let n = e.name.strip_prefix("base_model.model.")?;
            Some(n.split(".lora_").next()?.to_string())
        })
        .collect();
    adapted.dedup();
    Modules { all, adapted }
}

/// PEFT's test of a module name by `target_modules` or `exclude_modules` = `v`: a string is a
/// pattern the whole name matches (`re.fullmatch`), a list names modules, each the whole name or
/// its last dotted parts; `None` when unset.
#[allow(clippy::type_complexity)]
fn matcher(
    v: Option<&serde_json::Value>,
) -> std::result::Result<Option<Box<dyn Fn(&str) -> bool>>, String> {
    use serde_json::Value;
    Ok(Some(match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(p)) => {
            let re = regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                let e = e.to_string();
                let last = e.lines().last().unwrap_or_default().trim().to_string();
                format!(
                    "a pattern kiln cannot read ({})",
                    crate::ui::printable(&last)
                )
            })?;
            Box::new(move |m| re.is_match(m))
        }
        Some(Value::Array(a)) => {
            let names: Vec<String> = a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or("a list that is not all names")?;
            Box::new(move |m| {
                names
                    .iter()
                    .any(|t| m == t || m.ends_with(&format!(".{t}")))
            })
        }
        Some(_) => return Err("neither a list of module names nor a pattern".into()),
    }))
}

/// Whether adapter config `c`'s `target_modules` (less its `exclude_modules`) adapts exactly
/// `modules.adapted` among `modules.all` by PEFT's rules (`check_target_module_exists`), under the
/// names PEFT saw: the base's own, or a vision-language base's language model's
/// (`model.language_model.layers...`, `language_model.model.layers...` before transformers
/// 4.52; what it matched in the vision tower shows as tensors kiln refuses). Else what differs.
fn same_targets(c: &serde_json::Value, modules: &Modules) -> std::result::Result<(), String> {
    let targets =
        matcher(c.get("target_modules"))?.ok_or("neither a list of module names nor a pattern")?;
    let excluded =
        matcher(c.get("exclude_modules")).map_err(|e| format!("`exclude_modules` is {e}"))?;
    let matches = |m: &str| targets(m) && !excluded.as_ref().is_some_and(|x| x(m));
    let namings: [fn(&str) -> String; 3] = [
        |m| m.to_string(),
        |m| match m.strip_prefix("model.") {
            Some(rest) => format!("{VISION_LANGUAGE}{rest}"),
            None => m.to_string(),
        },
        |m| format!("language_model.{m}"),
    ];
    let mut differences = Vec::new();
    for name in namings {
        let (mut extra, mut lacking) = (Vec::new(), Vec::new());
        for m in &modules.all {
            match (matches(&name(m)), modules.adapted.contains(m)) {
                (true, false) => extra.push(m.as_str()),
                (false, true) => lacking.push(m.as_str()),
                _ => {}
            }
        }
        if extra.is_empty() && lacking.is_empty() {
            return Ok(());
        }
        differences.push((extra, lacking));
    }
    let (extra, lacking) = differences
        .into_iter()
        .min_by_key(|(e, l)| e.len() + l.len())
        .unwrap_or_default();
    let some = |v: &[&str]| {
        let shown: Vec<String> = v.iter().take(3).map(|m| format!("`{m}`")).collect();
        let more = v.len().saturating_sub(3);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!("{}{more}", shown.join(", "))
    };
    let mut why = Vec::new();
    if !extra.is_empty() {
        why.push(format!(
            "it adapts {} which kiln's targets do not",
            some(&extra)
        ));
    }
    if !lacking.is_empty() {
        why.push(format!(
            "it leaves out {} which kiln's targets adapt",
            some(&lacking)
        ));
    }
    Err(why.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::{same_targets, Modules};
    use serde_json::json;

    /// A two-layer base with q/k/v projections and a head, kiln adapting q and v.
    fn modules() -> Modules {
        let layer = |i: usize, m: &str| format!("model.layers.{i}.self_attn.{m}");
        let mut all = vec!["model.embed_tokens".to_string()];
        for i in 0..2 {
            all.extend(["q_proj", "k_proj", "v_proj"].map(|m| layer(i, m)));
        }
        all.push("lm_head".into());
        let adapted = (0..2)
            .flat_map(|i| ["q_proj", "v_proj"].map(|m| layer(i, m)))
            .collect();
        Modules { all, adapted }
    }

    #[test]
    fn target_modules_read_as_peft_matches_them() {
        let m = modules();
        for same in [
            json!(["q_proj", "v_proj"]),
            json!(["self_attn.v_proj", "q_proj"]),
            json!(r".*\.(q_proj|v_proj)"),
            json!(r"model\.layers\.\d+\.self_attn\.[qv]_proj"),
            // a vision-language base's language model, as kiln's export writes it, and before 4.52
            json!(r"model\.language_model\..*\.(q_proj|v_proj)"),
            json!(r"language_model\.model\..*\.(q_proj|v_proj)"),
        ] {
            let c = json!({ "target_modules": same });
            assert_eq!(same_targets(&c, &m), Ok(()), "{same}");
        }
        for (other, says) in [
            (
                json!(["q_proj"]),
                "leaves out `model.layers.0.self_attn.v_proj`",
            ),
            (json!(["q_proj", "v_proj", "lm_head"]), "adapts `lm_head`"),
            // fullmatch: a pattern that matches part of a name adapts nothing
            (json!("q_proj|v_proj"), "leaves out"),
            (
                json!(r"model\.layers\.0\..*_proj"),
                "`model.layers.0.self_attn.k_proj`",
            ),
            (json!("(q_proj"), "a pattern kiln cannot read"),
            (json!(4), "neither a list"),
            (json!(["q_proj", 4]), "not all names"),
        ] {
            let why = same_targets(&json!({ "target_modules": other }), &m).unwrap_err();
            assert!(why.contains(says), "{other}: {why}");
        }
        assert!(same_targets(&json!({}), &m).is_err());
        // exclude_modules takes modules back out, as PEFT's check does first
        let c = json!({"target_modules": ["q_proj", "v_proj", "k_proj"], "exclude_modules": ["k_proj"]});
        assert_eq!(same_targets(&c, &m), Ok(()));
        let c =
            json!({"target_modules": ["q_proj", "v_proj"], "exclude_modules": r".*layers\.1\..*"});
        let why = same_targets(&c, &m).unwrap_err();
        assert!(
            why.contains("leaves out `model.layers.1.self_attn.q_proj`"),
            "{why}"
        );
    }
}
