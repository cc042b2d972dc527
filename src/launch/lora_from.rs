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
    let file = dir.join("adapter_model.safetensors");
    let lazy = tensors::Lazy::open(&file);
    // (the names PEFT saw for the base's modules show in the adapter's tensors)
    let naming = lazy.as_ref().map_or(Naming::Plain, |l| {
        Naming::of(l.entries.iter().map(|e| e.name.as_str()))
    });
    check_config(
        &dir.join("adapter_config.json"),
        spec,
        &modules_of(model),
        naming,
    )?;
    let lazy = lazy.map_err(|e| {
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
    // PEFT writes without the adapter's name; a file saved with it has `.default.` inside. The
    // modules are named as PEFT saw them (`naming`: a vision-language base's language model's
    // `model.language_model.layers...` where kiln's are `model.layers...`)
    let find = |name: &str| {
        let n = match name.strip_prefix("base_model.model.") {
            Some(rest) => format!("base_model.model.{}", naming.name(rest)),
            None => name.to_string(),
        };
        at.get(n.as_str()).copied().or_else(|| {
            let (stem, leaf) = n.rsplit_once('.')?;
            at.get(format!("{stem}.default.{leaf}").as_str()).copied()
        })
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
        put(e, &values, &mut params[layout.params[e.param].range()]);
    }
    Ok(())
}

/// Tensor `e`'s `values` as its parameter's `out` (transposed back where `e` is).
fn put(e: &crate::model::portable::External, values: &[f32], out: &mut [f32]) {
    if e.transpose {
        let (rows, cols) = (e.shape[0], e.shape[1]);
        for (rr, row) in values.chunks_exact(cols).enumerate() {
            for (c, v) in row.iter().enumerate() {
                out[c * rows + rr] = *v;
            }
        }
    } else {
        out.copy_from_slice(values);
    }
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
fn check_config(
    path: &Path,
    spec: &crate::model::lora::LoraSpec,
    modules: &Modules,
    naming: Naming,
) -> Result<()> {
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
    bad.extend(targets_faults(&c, modules, naming, &spec.targets, &shown));
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

/// How PEFT named the base's modules: kiln's Hugging Face names, or those of a vision-language
/// base's language model (`model.language_model.layers...`, `language_model.model.layers...`
/// before transformers 4.52), as the adapter file's tensors show.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Naming {
    Plain,
    VisionLanguage,
    VisionLanguageOld,
}

impl Naming {
    fn of<'a>(mut tensors: impl Iterator<Item = &'a str>) -> Naming {
        let under = |n: &str, p: &str| {
            n.strip_prefix("base_model.model.")
                .is_some_and(|n| n.starts_with(p))
        };
        tensors
            .find_map(|n| {
                if under(n, VISION_LANGUAGE) {
                    Some(Naming::VisionLanguage)
                } else if under(n, VISION_LANGUAGE_OLD) {
                    Some(Naming::VisionLanguageOld)
                } else {
                    None
                }
            })
            .unwrap_or(Naming::Plain)
    }

    /// Module `m` (kiln's Hugging Face name, or a name under it) as PEFT named it.
    fn name(self, m: &str) -> String {
        match self {
            Naming::Plain => m.to_string(),
            Naming::VisionLanguage => match m.strip_prefix("model.") {
                Some(rest) => format!("{VISION_LANGUAGE}{rest}"),
                None => m.to_string(),
            },
            Naming::VisionLanguageOld => format!("language_model.{m}"),
        }
    }
}

/// PEFT's test of a module name by `target_modules` or `exclude_modules` = `v`: a string is a
/// pattern the whole name matches (`re.fullmatch`; look-around and back-references too), a list
/// names modules, each the whole name or its last dotted parts; `None` when unset.
#[allow(clippy::type_complexity)]
fn matcher(
    v: Option<&serde_json::Value>,
) -> std::result::Result<Option<Box<dyn Fn(&str) -> bool>>, String> {
    use serde_json::Value;
    let unreadable = |e: fancy_regex::Error| {
        let e = e.to_string();
        let last = e.lines().last().unwrap_or_default().trim().to_string();
        format!(
            "a pattern kiln cannot read ({}); write the module names it matched as a list",
            crate::ui::printable(&last)
        )
    };
    Ok(Some(match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(p)) if p == "all-linear" => {
            return Err("PEFT's \"all-linear\", which PEFT turns into the list of modules it adapted when it makes the adapter; save the adapter from PEFT again".into())
        }
        Some(Value::String(p)) => {
            // (read alone first, so that `a)|(b` is refused as Python refuses it; a verbose
            // pattern's closing comment swallows the anchors, a newline ends the comment)
            fancy_regex::Regex::new(p).map_err(unreadable)?;
            let re = fancy_regex::Regex::new(&format!("^(?:{p})$"))
                .or_else(|_| fancy_regex::Regex::new(&format!("^(?:{p}\n)$")))
                .map_err(unreadable)?;
            Box::new(move |m| re.is_match(m).unwrap_or(false))
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

/// What is wrong with adapter config `c`'s `target_modules` (less its `exclude_modules`) for
/// kiln's adapters of `modules` (`model.lora.targets` = `targets`), under the names PEFT saw;
/// `shown` gives a key's value as the file has it.
fn targets_faults(
    c: &serde_json::Value,
    modules: &Modules,
    naming: Naming,
    targets: &[String],
    shown: &dyn Fn(&str) -> String,
) -> Vec<String> {
    let mut bad = Vec::new();
    let excluded = matcher(c.get("exclude_modules")).unwrap_or_else(|why| {
        bad.push(format!(
            "`exclude_modules` is {}: {why}",
            shown("exclude_modules")
        ));
        None
    });
    let theirs = matcher(c.get("target_modules"))
        .and_then(|t| t.ok_or_else(|| "PEFT writes the modules it adapted there".to_string()));
    let why = theirs.and_then(|t| {
        let matches = |m: &str| t(m) && !excluded.as_ref().is_some_and(|x| x(m));
        same_targets(&matches, modules, naming)
    });
    if let Err(why) = why {
        let less = match &excluded {
            Some(_) => format!(" less `exclude_modules` {}", shown("exclude_modules")),
            None => String::new(),
        };
        bad.push(format!(
            "`target_modules` is {}{less}: {why}; `model.lora.targets` resolves to {targets:?} (kiln adapts those modules in every layer)",
            shown("target_modules"),
        ));
    }
    bad
}

/// Whether `matches` (PEFT's test of a module's name: `target_modules` less `exclude_modules`,
/// `check_target_module_exists`) picks exactly `modules.adapted` among `modules.all`, under the
/// names PEFT saw (`naming`; what it matched in a vision tower shows as tensors kiln refuses).
/// Else what differs, in PEFT's names.
fn same_targets(
    matches: &dyn Fn(&str) -> bool,
    modules: &Modules,
    naming: Naming,
) -> std::result::Result<(), String> {
    let (mut extra, mut lacking) = (Vec::new(), Vec::new());
    for m in &modules.all {
        let theirs = naming.name(m);
        match (matches(&theirs), modules.adapted.contains(m)) {
            (true, false) => extra.push(theirs),
            (false, true) => lacking.push(theirs),
            _ => {}
        }
    }
    if extra.is_empty() && lacking.is_empty() {
        return Ok(());
    }
    let some = |v: &[String]| {
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
    use super::{targets_faults, Modules, Naming};
    use serde_json::{json, Value};

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

    /// The faults of an adapter config with these keys, PEFT's names being `naming`.
    fn faults(c: Value, naming: Naming) -> String {
        let targets = ["q_proj".to_string(), "v_proj".to_string()];
        let shown = |k: &str| c.get(k).map_or("missing".into(), |v| v.to_string());
        targets_faults(&c, &modules(), naming, &targets, &shown).join("; ")
    }

    #[test]
    fn target_modules_read_as_peft_matches_them() {
        let plain = |t: Value| faults(json!({ "target_modules": t }), Naming::Plain);
        for same in [
            json!(["q_proj", "v_proj"]),
            json!(["self_attn.v_proj", "q_proj"]),
            json!(r".*\.(q_proj|v_proj)"),
            json!(r"model\.layers\.\d+\.self_attn\.[qv]_proj"),
            // Python's look-around, and a verbose pattern ending in a comment
            json!(r"^(?!.*k_proj).*layers.*_proj"),
            json!("(?x) .*\\. [qv]_proj  # q and v"),
        ] {
            assert_eq!(plain(same.clone()), "", "{same}");
        }
        // a vision-language base's language model, as kiln's export writes it, and before 4.52
        let vl = |t: &str, n| faults(json!({ "target_modules": t }), n);
        let pattern = r"model\.language_model\..*\.(q_proj|v_proj)";
        assert_eq!(vl(pattern, Naming::VisionLanguage), "");
        let old = r"language_model\.model\..*\.(q_proj|v_proj)";
        assert_eq!(vl(old, Naming::VisionLanguageOld), "");
        assert!(vl(pattern, Naming::Plain).contains("leaves out"));
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
            // unbalanced, as Python refuses it, though it would close inside the anchors
            (json!("q_proj)|(.*"), "a pattern kiln cannot read"),
            (json!("all-linear"), "save the adapter from PEFT again"),
            (json!(4), "neither a list"),
            (json!(["q_proj", 4]), "not all names"),
        ] {
            let why = plain(other.clone());
            assert!(why.contains(says), "{other}: {why}");
        }
        assert!(faults(json!({}), Naming::Plain).contains("`target_modules` is missing"));
        // exclude_modules takes modules back out, as PEFT's check does first, in PEFT's names
        let c = json!({"target_modules": ["q_proj", "v_proj", "k_proj"], "exclude_modules": ["k_proj"]});
        assert_eq!(faults(c, Naming::Plain), "");
        let c = json!({"target_modules": ["q_proj", "v_proj"],
            "exclude_modules": r"model\.language_model\.layers\.1\..*"});
        let why = faults(c, Naming::VisionLanguage);
        assert!(
            why.contains("less `exclude_modules` \"model\\\\.language_model")
                && why.contains("leaves out `model.language_model.layers.1.self_attn.q_proj`"),
            "{why}"
        );
        let c = json!({"target_modules": ["q_proj", "v_proj"], "exclude_modules": "(k"});
        assert!(faults(c, Naming::Plain).starts_with("`exclude_modules` is \"(k\": a pattern"));
    }

    #[test]
    fn the_names_peft_saw_show_in_the_adapters_tensors() {
        let of = |n: &str| Naming::of([n].into_iter());
        let leaf = "layers.0.self_attn.q_proj.lora_A.weight";
        assert_eq!(of(&format!("base_model.model.model.{leaf}")), Naming::Plain);
        let vl = format!("base_model.model.model.language_model.{leaf}");
        assert_eq!(of(&vl), Naming::VisionLanguage);
        let old = format!("base_model.model.language_model.model.{leaf}");
        assert_eq!(of(&old), Naming::VisionLanguageOld);
    }
}
