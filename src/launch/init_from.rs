//! `model.init_from`: a run starting from a safetensors file (`kiln export`'s, or PyTorch's
//! `save_file`), its format detected or as `model.init_format` says, checked against the model.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::checkpoint::tensors;
use crate::config::Resolved;
use crate::error::{Error, Result};
use crate::model::portable::{self, ImportError, WeightFormat};
use crate::model::Model;

/// The format of an `init_from` file: as `model.init_format` says, or (`auto`) kiln's export
/// metadata, else a format of the model's family its names show (`WeightAdapter::detect_format`: for
/// a gpt Hugging Face's or nanoGPT's GPT-2 names, for a llama Hugging Face's), else PyTorch's
/// names.
fn init_format(
    asked: &str,
    metadata: &HashMap<String, String>,
    named: &[(&str, &[usize])],
    model: &dyn Model,
) -> std::result::Result<WeightFormat, String> {
    // kiln's own metadata may name a format of another family's (an export of a gpt)
    let kiln = || match metadata.get("kiln.format").map(String::as_str) {
        None | Some("pytorch") => Ok(WeightFormat::PyTorch),
        Some(name) => portable::format_named(model, name),
    };
    match asked {
        "kiln" => kiln(),
        "auto" => {
            if metadata.contains_key("kiln.format") {
                return kiln();
            }
            match model.weights().detect_format(named) {
                Some(f) => Ok(f),
                None => kiln(),
            }
        }
        // a format by name: PyTorch's, Burn's or one of the family's
        name => portable::format_named(model, name),
    }
}

/// A sharded checkpoint's index: the shard file each tensor is in.
type ShardOf = HashMap<String, String>;

/// The safetensors files of `init_from`: the file itself, or in a Hugging Face directory
/// (`from_pretrained`'s layout) its `model.safetensors`, or the shards its
/// `model.safetensors.index.json` lists (with the shard each tensor is in, as the index says).
fn weight_files(path: &Path) -> Result<(Vec<PathBuf>, Option<ShardOf>)> {
    if !path.is_dir() {
        return Ok((vec![path.to_path_buf()], None));
    }
    let shown = path.display();
    let single = path.join("model.safetensors");
    let index = path.join("model.safetensors.index.json");
    // (transformers' `from_pretrained` reads model.safetensors first, when both are there)
    if single.is_file() {
        return Ok((vec![single], None));
    }
    if !index.is_file() {
        return Err(Error::Usage(format!(
            "model.init_from: the directory `{shown}` has neither model.safetensors nor model.safetensors.index.json\n  = help: give a directory transformers' `save_pretrained(..., safe_serialization=True)` or `kiln export --format hf-...` wrote, or a .safetensors file"
        )));
    }
    let ishown = index.display();
    let text = crate::data::read_bounded(&index, "model.init_from", Some(64 << 20))
        .map_err(|e| Error::Usage(format!("model.init_from: {e}")))?;
    let bad = |why: String| {
        Error::Usage(format!(
            "model.init_from: `{ishown}`: {why}\n  = help: the index transformers writes maps every tensor name to a shard file in the same directory (`\"weight_map\": {{\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}`)"
        ))
    };
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut shards: Vec<PathBuf> = Vec::new();
    let mut of = HashMap::new();
    for (name, file) in map {
        let Some(file) = file.as_str() else {
            return Err(bad(format!("`{name}` maps to {file}, not a file name")));
        };
        // a shard is a file named in this directory: no path, no `..` (a link to a regular
        // file is one: the hub cache's snapshots link every file into its blobs)
        let p = path.join(file);
        let plain = !file.is_empty()
            && !file.contains(['/', '\\'])
            && file != ".."
            && file != "."
            && fs::metadata(&p).is_ok_and(|m| m.is_file());
        if !plain {
            return Err(bad(format!(
                "`{name}` is in shard `{}`, which is not a regular file in `{shown}`",
                crate::config::brief(file, 80)
            )));
        }
        if !shards.contains(&p) {
            shards.push(p);
        }
        of.insert(name.clone(), file.to_string());
    }
    shards.sort();
    Ok((shards, Some(of)))
}

/// The safetensors files of `init_from` (`weight_files`), their headers read and checked: each
/// tensor in one file, and in the shard the index names.
fn open_weights(path: &Path) -> Result<Vec<tensors::Lazy>> {
    let (files, index) = weight_files(path)?;
    let mut opened = Vec::with_capacity(files.len());
    for f in &files {
        let fshown = f.display();
        let lazy = tensors::Lazy::open(f).map_err(|e| {
            let help = if files.len() > 1 {
                "a shard model.safetensors.index.json names: the shards and the index are from different saves, or the download is incomplete"
            } else if e.starts_with("cannot read") {
                "give the path of a .safetensors file (relative paths are relative to the experiment file)"
            } else {
                "give a file written by `kiln export` or by PyTorch's `safetensors.torch.save_file`"
            };
            match e.strip_prefix("cannot read: ") {
                Some(why) => Error::Usage(format!(
                    "model.init_from: cannot read `{fshown}`: {why}\n  = help: {help}"
                )),
                None => Error::Usage(format!("model.init_from: `{fshown}`: {e}\n  = help: {help}")),
            }
        })?;
        opened.push(lazy);
    }
    // every tensor of every file, once
    let mut at: HashMap<&str, (usize, usize)> = HashMap::new();
    for (fi, lazy) in opened.iter().enumerate() {
        for (ei, e) in lazy.entries.iter().enumerate() {
            if let Some((other, _)) = at.insert(e.name.as_str(), (fi, ei)) {
                return Err(Error::Usage(format!(
                    "model.init_from: tensor `{}` is in both `{}` and `{}`\n  = help: each tensor belongs in one shard",
                    crate::ui::printable(&e.name),
                    files[other].display(),
                    files[fi].display()
                )));
            }
        }
    }
    if let Some(index) = &index {
        let mut absent: Vec<String> = index
            .iter()
            .filter(|(n, file)| {
                at.get(n.as_str()).is_none_or(|(fi, _)| {
                    files[*fi].file_name() != Some(std::ffi::OsStr::new(file.as_str()))
                })
            })
            .map(|(n, file)| format!("`{n}` (in `{file}`, says the index)"))
            .collect();
        if !absent.is_empty() {
            absent.sort();
            let n = absent.len();
            absent.truncate(10);
            return Err(Error::Usage(format!(
                "model.init_from: {n} tensor(s) that `{}` lists are not in the shard it names: {}\n  = help: the shards and the index are from different saves; save the model again",
                path.join("model.safetensors.index.json").display(),
                absent.join(", ")
            )));
        }
    }
    Ok(opened)
}

/// Refuses a file two of whose names `format` reads as one (`language_model.model.x` and
/// `model.language_model.x` of a Gemma 3 checkpoint), naming both.
fn one_name_each(
    kept: &[(String, &tensors::Entry, (usize, usize))],
    shown: &std::path::Display,
    format: WeightFormat,
) -> Result<()> {
    let mut read_as: HashMap<&str, &str> = HashMap::new();
    for (n, e, _) in kept {
        if let Some(first) = read_as.insert(n.as_str(), e.name.as_str()) {
            let p = crate::ui::printable;
            return Err(Error::Usage(format!(
                "model.init_from: `{shown}` holds both `{}` and `{}`, which format {} reads as the same tensor `{}`\n  = help: keep one of the two (they are two saves of one weight)",
                p(first),
                p(&e.name),
                format.name(),
                p(n)
            )));
        }
    }
    Ok(())
}

/// The parameters `model.init_from` names, checked against `model` (every problem in one
/// error), or `None` when it is not set. Tensors are read one at a time, straight into the
/// parameters, once every name and shape fits.
pub fn init_weights(r: &Resolved, model: &dyn Model) -> Result<Option<Vec<f32>>> {
    let Some(value) = &r.config.model.init_from else {
        return seeded_with_adapter(r, model);
    };
    let path = r.path_of("model.init_from", value);
    let shown = path.display();
    // a pipe or a device (/dev/zero) would be read for ever
    match fs::metadata(&path) {
        Ok(m) if !m.is_file() && !m.is_dir() => {
            return Err(Error::Usage(format!(
                "model.init_from: `{shown}` is not a regular file or a directory\n  = help: give the path of a .safetensors file or of a Hugging Face model directory"
            )))
        }
        _ => {}
    }
    // a format name the model does not have is said before a large file is read
    let asked = r.config.model.init_format.as_deref().unwrap_or("auto");
    if !matches!(asked, "auto" | "kiln") {
        portable::format_named(model, asked).map_err(|why| {
            Error::Usage(format!(
                "model.init_format: {why}\n  = help: set `model.init_format` to the file's format: \"auto\", \"kiln\" or one of the model's ({})",
                portable::format_names(model)
            ))
        })?;
    }
    let opened = open_weights(&path)?;
    let named: Vec<(&str, &[usize])> = opened
        .iter()
        .flat_map(|l| {
            l.entries
                .iter()
                .map(|e| (e.name.as_str(), e.shape.as_slice()))
        })
        .collect();
    let metadata = opened
        .first()
        .map(|l| l.metadata.clone())
        .unwrap_or_default();
    let format = init_format(asked, &metadata, &named, model).map_err(|why| {
        Error::Usage(format!(
            "model.init_format: `{shown}`: {why}\n  = help: set `model.init_format` to the file's format: \"auto\", \"kiln\" or one of the model's ({})",
            portable::format_names(model)
        ))
    })?;
    // nanoGPT's compiled models prefix every name; GPT-2 files carry attention masks (the
    // family says which names are such buffers)
    let kept: Vec<(String, &tensors::Entry, (usize, usize))> = opened
        .iter()
        .enumerate()
        .flat_map(|(fi, l)| {
            l.entries
                .iter()
                .enumerate()
                .map(move |(ei, e)| (e, (fi, ei)))
        })
        .map(|(e, loc)| (format.strip(&e.name).to_string(), e, loc))
        .filter(|(n, _, _)| !model.weights().format_buffer(format, n))
        .collect();
    one_name_each(&kept, &shown, format)?;
    let shapes: HashMap<&str, &[usize]> = kept
        .iter()
        .filter(|(_, e, _)| e.unsupported.is_none())
        .map(|(n, e, _)| (n.as_str(), e.shape.as_slice()))
        .collect();
    let other: HashMap<&str, &str> = kept
        .iter()
        .filter_map(|(n, e, _)| Some((n.as_str(), e.unsupported.as_deref()?)))
        .collect();
    let where_is: HashMap<&str, (usize, usize)> =
        kept.iter().map(|(n, _, loc)| (n.as_str(), *loc)).collect();
    // training from NaN or infinite weights is never what was meant
    let mut nonfinite: Vec<String> = Vec::new();
    let mut load = |n: &str| -> std::result::Result<Vec<f32>, String> {
        let (fi, ei) = where_is[n];
        let values = opened[fi].read(ei)?;
        let bad = values.iter().filter(|v| !v.is_finite()).count();
        if bad > 0 && nonfinite.len() < 20 {
            nonfinite.push(format!(
                "`{}` ({bad} of {})",
                opened[fi].entries[ei].name,
                values.len()
            ));
        }
        Ok(values)
    };
    // what the shapes do not show, the config.json beside them does: said before a tensor is
    // read
    if format.is_dir() {
        beside_config(r, model, format, &path)?;
    }
    // the parameters the file has (a base model's has no adapters; kiln's own export of a LoRA
    // run in PyTorch's names has them)
    let in_file = params_in(model, format, &shapes);
    let imported = portable::import_with(model, format, &shapes, &other, &mut load);
    if !nonfinite.is_empty() {
        return Err(Error::Usage(format!(
            "model.init_from: `{shown}` holds NaN or infinite values (after conversion to f32) in {}\n  = help: export the weights again from a healthy checkpoint",
            nonfinite.join(", ")
        )));
    }
    let params = imported.map_err(|e| match e {
        ImportError::Read(e) => Error::Usage(format!("model.init_from: `{shown}`: {e}")),
        ImportError::Mismatch(m) => Error::Usage(format!(
            "model.init_from: `{shown}` does not fit model `{}` ({} names and layouts): {}\n{m}  = help: the file must hold exactly the model's tensors; `kiln export --format {}` of a run of the same model writes them",
            model.kind(),
            format.name(),
            m.summary(),
            format.name()
        )),
    })?;
    Ok(Some(with_adapters(r, model, params, &in_file)?))
}

/// `params` (weights from `model.init_from`, `loaded` the parameters it had) with the LoRA
/// adapters the adapter directory `model.lora.init_from` holds, else those `init_from` had,
/// else PEFT's initialisation from the experiment's seed (as without `init_from`).
fn with_adapters(
    r: &Resolved,
    model: &dyn Model,
    mut params: Vec<f32>,
    loaded: &std::collections::HashSet<usize>,
) -> Result<Vec<f32>> {
    if let Some(dir) = adapter_dir(r) {
        super::lora_from::load_adapter(r, model, dir, &mut params)?;
        return Ok(params);
    }
    let seed = r.config.experiment.seed;
    for (i, p) in model.layout().params.iter().enumerate() {
        if crate::model::lora::is_adapter(&p.name) && !loaded.contains(&i) {
            crate::model::lora::init(&p.name, &p.shape, &mut params[p.range()], seed);
        }
    }
    Ok(params)
}

/// Without `model.init_from`: the seeded initialisation with the adapters of
/// `model.lora.init_from`, or `None` (the seeded initialisation is made later).
fn seeded_with_adapter(r: &Resolved, model: &dyn Model) -> Result<Option<Vec<f32>>> {
    if adapter_dir(r).is_none() {
        return Ok(None);
    }
    let seeded = model.init(r.config.experiment.seed);
    with_adapters(r, model, seeded, &Default::default()).map(Some)
}

/// The layout indices of the parameters whose tensors (in `format`) a file of `shapes` holds.
fn params_in(
    model: &dyn Model,
    format: WeightFormat,
    shapes: &HashMap<&str, &[usize]>,
) -> std::collections::HashSet<usize> {
    portable::externals(model, format)
        .iter()
        .filter(|e| shapes.contains_key(e.name.as_str()))
        .map(|e| e.param)
        .collect()
}

/// `model.lora.init_from`, where LoRA is on.
fn adapter_dir(r: &Resolved) -> Option<&str> {
    let l = r.config.model.lora.as_ref().filter(|l| l.rank > 0)?;
    l.init_from.as_deref()
}

/// The `config.json` beside a Hugging Face file (`from_pretrained`'s layout), when there is
/// one, against `[model]` (issue 45, defect 17): a head count or an activation the tensors'
/// shapes do not show loaded silently before; every disagreement is named, with both values.
fn beside_config(
    r: &Resolved,
    model: &dyn Model,
    format: WeightFormat,
    weights: &std::path::Path,
) -> Result<()> {
    let Some(path) = crate::config::hf_json::config_json_of(weights) else {
        return Ok(());
    };
    let shown = path.display();
    let text = crate::data::read_bounded(&path, "model.init_from", Some(1 << 20))
        .map_err(|e| Error::Usage(format!("model.init_from: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        Error::Usage(format!(
            "model.init_from: `{shown}` (beside the weights) is not JSON: {e}\n  = help: fix or remove it; it is read to check the model's settings"
        ))
    })?;
    let bad = model.weights().hf_config_mismatches(format, &json);
    if bad.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = bad
        .iter()
        .map(
            |crate::model::ConfigMismatch {
                 theirs,
                 value,
                 key,
                 ours,
             }| {
                let source = if key.starts_with("model.") {
                    format!(" ({})", crate::config::describe_source(&r.figment, key))
                } else {
                    // (no key sets it: such a file cannot be loaded exactly)
                    " (fixed: no [model] key sets it, so this file cannot be loaded exactly)".into()
                };
                format!(
                    "  {theirs} = {} there, but `{key}` = {ours}{source}",
                    crate::config::brief(value, 60)
                )
            },
        )
        .collect();
    Err(Error::Usage(format!(
        "model.init_from: `{shown}` describes another model than [model]:\n{}\n  = help: set [model] as the file says (a {} export of this model writes a config.json that agrees)",
        lines.join("\n"),
        format.name()
    )))
}
