//! `model.init_from`: a run starting from a safetensors file (`kiln export`'s, or PyTorch's
//! `save_file`), its format detected or as `model.init_format` says, checked against the model.

use std::collections::HashMap;
use std::fs;

use crate::checkpoint::tensors;
use crate::config::Resolved;
use crate::error::{Error, Result};
use crate::model::portable::{self, WeightFormat};
use crate::model::Model;

/// The format of an `init_from` file: as `model.init_format` says, or (`auto`) kiln's export
/// metadata, else a format of the model's family its names show (`Family::detect_format`: for
/// a gpt Hugging Face's or nanoGPT's GPT-2 names), else PyTorch's names.
fn init_format(
    asked: &str,
    file: &tensors::TensorFile,
    model: &dyn Model,
) -> std::result::Result<WeightFormat, String> {
    // kiln's own metadata may name a format of another family's (an export of a gpt)
    let kiln = || match file.metadata.get("kiln.format").map(String::as_str) {
        None | Some("pytorch") => Ok(WeightFormat::PyTorch),
        Some(name) => portable::format_named(model, name),
    };
    match asked {
        "kiln" => kiln(),
        "auto" => {
            if file.metadata.contains_key("kiln.format") {
                return kiln();
            }
            let named: Vec<(&str, &[usize])> = file
                .tensors
                .iter()
                .map(|t| (t.name.as_str(), t.shape.as_slice()))
                .collect();
            match model.detect_format(&named) {
                Some(f) => Ok(f),
                None => kiln(),
            }
        }
        // a format by name: PyTorch's, Burn's or one of the family's
        name => portable::format_named(model, name),
    }
}

/// The parameters `model.init_from` names, checked against `model` (every problem in one
/// error), or `None` when it is not set.
pub fn init_weights(r: &Resolved, model: &dyn Model) -> Result<Option<Vec<f32>>> {
    let Some(value) = &r.config.model.init_from else {
        return Ok(None);
    };
    let path = r.path_of("model.init_from", value);
    let shown = path.display();
    // a pipe or a device (/dev/zero) would be read for ever
    match fs::metadata(&path) {
        Ok(m) if !m.is_file() => {
            return Err(Error::Usage(format!(
                "model.init_from: `{shown}` is not a regular file\n  = help: give the path of a .safetensors file"
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
    let bytes = fs::read(&path).map_err(|e| {
        Error::Usage(format!(
            "model.init_from: cannot read `{shown}`: {e}\n  = help: give the path of a .safetensors file (relative paths are relative to the experiment file)"
        ))
    })?;
    let file = tensors::decode(&bytes).map_err(|e| {
        Error::Usage(format!(
            "model.init_from: `{shown}`: {e}\n  = help: give a file written by `kiln export` or by PyTorch's `safetensors.torch.save_file`"
        ))
    })?;
    let format = init_format(asked, &file, model).map_err(|why| {
        Error::Usage(format!(
            "model.init_format: `{shown}`: {why}\n  = help: set `model.init_format` to the file's format: \"auto\", \"kiln\" or one of the model's ({})",
            portable::format_names(model)
        ))
    })?;
    // nanoGPT's compiled models prefix every name; GPT-2 files carry attention masks (the
    // family says which names are such buffers)
    let name_of = |n: &str| -> String { format.strip(n).to_string() };
    let kept: Vec<(String, &tensors::Named)> = file
        .tensors
        .iter()
        .map(|t| (name_of(&t.name), t))
        .filter(|(n, _)| !model.format_buffer(format, n))
        .collect();
    let map: HashMap<&str, (&[usize], &[f32])> = kept
        .iter()
        .filter(|(_, t)| t.unsupported.is_none())
        .map(|(n, t)| (n.as_str(), (t.shape.as_slice(), t.data.as_slice())))
        .collect();
    let other: HashMap<&str, &str> = kept
        .iter()
        .filter_map(|(n, t)| Some((n.as_str(), t.unsupported.as_deref()?)))
        .collect();
    // training from NaN or infinite weights is never what was meant
    let bad: Vec<String> = kept
        .iter()
        .map(|(_, t)| *t)
        .filter_map(|t| {
            let n = t.data.iter().filter(|v| !v.is_finite()).count();
            (n > 0).then(|| format!("`{}` ({n} of {})", t.name, t.data.len()))
        })
        .take(20)
        .collect();
    if !bad.is_empty() {
        return Err(Error::Usage(format!(
            "model.init_from: `{shown}` holds NaN or infinite values (after conversion to f32) in {}\n  = help: export the weights again from a healthy checkpoint",
            bad.join(", ")
        )));
    }
    let params = portable::import(model, format, &map, &other).map_err(|m| {
            Error::Usage(format!(
                "model.init_from: `{shown}` does not fit model `{}` ({} names and layouts): {}\n{m}  = help: the file must hold exactly the model's tensors; `kiln export --format {}` of a run of the same model writes them",
                model.kind(),
                format.name(),
                m.summary(),
                format.name()
            ))
        })?;
    // every tensor fits: what their shapes do not show, the config.json beside them does
    if format.is_dir() {
        beside_config(r, model, format, &path)?;
    }
    Ok(Some(params))
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
    let path = weights
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("config.json");
    if !path.is_file() {
        return Ok(());
    }
    let shown = path.display();
    let text = crate::data::read_bounded(&path, "model.init_from", Some(1 << 20))
        .map_err(|e| Error::Usage(format!("model.init_from: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
        Error::Usage(format!(
            "model.init_from: `{shown}` (beside the weights) is not JSON: {e}\n  = help: fix or remove it; it is read to check the model's settings"
        ))
    })?;
    let bad = model.hf_config_mismatches(format, &json);
    if bad.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = bad
        .iter()
        .map(|(theirs, value, key, ours)| {
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
        })
        .collect();
    Err(Error::Usage(format!(
        "model.init_from: `{shown}` describes another model than [model]:\n{}\n  = help: set [model] as the file says (a {} export of this model writes a config.json that agrees)",
        lines.join("\n"),
        format.name()
    )))
}
