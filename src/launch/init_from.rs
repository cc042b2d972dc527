//! `model.init_from`: a run starting from a safetensors file (`kiln export`'s, or PyTorch's
//! `save_file`), its format detected or as `model.init_format` says, checked against the model.

use std::collections::HashMap;
use std::fs;

use crate::checkpoint::tensors;
use crate::config::InitFormat;
use crate::config::Resolved;
use crate::error::{Error, Result};
use crate::model::portable::{self, WeightFormat};
use crate::model::Model;

/// The format of an `init_from` file: as `model.init_format` says, or (`auto`) kiln's export
/// metadata, else for a gpt GPT-2's names (Hugging Face's when `c_attn` is `[dim, 3 dim]`,
/// Conv1D's layout; nanoGPT's when it is `[3 dim, dim]`), else PyTorch's names.
fn init_format(
    asked: InitFormat,
    file: &tensors::TensorFile,
    model: &dyn Model,
) -> std::result::Result<WeightFormat, String> {
    let kiln = || match file.metadata.get("kiln.format").map(String::as_str) {
        Some("burn") => WeightFormat::Burn,
        Some("hf-gpt2") => WeightFormat::HfGpt2,
        Some("nanogpt") => WeightFormat::NanoGpt,
        _ => WeightFormat::PyTorch,
    };
    let gpt2 = |f: WeightFormat| {
        if model.kind() == "gpt" {
            Ok(f)
        } else {
            Err(format!(
                "{} names are a gpt's, but the model is `{}`",
                f.name(),
                model.kind()
            ))
        }
    };
    match asked {
        InitFormat::Kiln => Ok(kiln()),
        InitFormat::HfGpt2 => gpt2(WeightFormat::HfGpt2),
        InitFormat::Nanogpt => gpt2(WeightFormat::NanoGpt),
        InitFormat::Auto => {
            if file.metadata.contains_key("kiln.format") || model.kind() != "gpt" {
                return Ok(kiln());
            }
            let attn = file.tensors.iter().find(|t| {
                let n = t.name.strip_prefix("_orig_mod.").unwrap_or(&t.name);
                n.starts_with("transformer.h.") && n.ends_with(".attn.c_attn.weight")
            });
            Ok(match attn.map(|t| t.shape.as_slice()) {
                Some([a, b]) if *b == 3 * *a => WeightFormat::HfGpt2,
                Some([a, b]) if *a == 3 * *b => WeightFormat::NanoGpt,
                _ => kiln(),
            })
        }
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
    let asked = r.config.model.init_format.unwrap_or(InitFormat::Auto);
    let format = init_format(asked, &file, model).map_err(|why| {
        Error::Usage(format!(
            "model.init_format: `{shown}`: {why}\n  = help: set `model.init_format` to the file's format (\"kiln\", \"hf-gpt2\" or \"nanogpt\")"
        ))
    })?;
    // nanoGPT's compiled models prefix every name; GPT-2 files carry attention masks
    let name_of = |n: &str| -> String {
        match format {
            WeightFormat::NanoGpt => n.strip_prefix("_orig_mod.").unwrap_or(n).to_string(),
            _ => n.to_string(),
        }
    };
    let kept: Vec<(String, &tensors::Named)> = file
        .tensors
        .iter()
        .map(|t| (name_of(&t.name), t))
        .filter(|(n, _)| !(format.gpt2_names() && portable::gpt2_buffer(n)))
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
    portable::import(model, format, &map, &other)
        .map(Some)
        .map_err(|m| {
            Error::Usage(format!(
                "model.init_from: `{shown}` does not fit model `{}` ({} names and layouts): {}\n{m}  = help: the file must hold exactly the model's tensors; `kiln export --format {}` of a run of the same model writes them",
                model.kind(),
                format.name(),
                m.summary(),
                format.name()
            ))
        })
}
