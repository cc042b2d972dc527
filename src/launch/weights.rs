//! Weights in and out of kiln as safetensors files: `kiln export` (a checkpoint's whole model,
//! fsdp shards gathered from the files, under PyTorch's or Burn's names and layouts) and
//! `model.init_from` (a run starting from such a file, or from PyTorch's `save_file`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};

use super::resume::require_checkpoint;
use super::run_dir::{checkpoint_store, run_config};
use crate::checkpoint::{self, tensors};
use crate::config::Resolved;
use crate::error::{Error, Result};
use crate::model::portable::{self, WeightFormat};
use crate::model::{ComputeOn, Model, Task};
use crate::rng::Rng;

/// What `kiln export` writes.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A checkpoint name (`step-00000600`) instead of the newest verified one.
    pub from: Option<String>,
    pub out: PathBuf,
    pub format: WeightFormat,
    /// Also write a fixed model input and kiln's logits for it here (`scripts/check-export.py`
    /// compares PyTorch's logits with them).
    pub probe: Option<PathBuf>,
}

/// What `kiln export` wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub checkpoint: PathBuf,
    pub step: usize,
    pub tensors: usize,
    pub bytes: usize,
}

/// Where an output file of `flag` goes: its directory must exist, and the path must not be a
/// directory, a symlink or a special file (it is replaced by a new regular file). Returns the
/// canonical directory joined with the file name.
pub(super) fn output_path(path: &Path, flag: &str) -> Result<PathBuf> {
    let name = path
        .file_name()
        .filter(|_| !path.as_os_str().to_string_lossy().ends_with('/'));
    let Some(name) = name else {
        return Err(Error::Usage(format!(
            "{flag} `{}` names no file; give the path of the file to write",
            path.display()
        )));
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let dir = dir.canonicalize().map_err(|_| {
        Error::Usage(format!(
            "cannot write `{}`: the directory `{}` does not exist",
            path.display(),
            dir.display()
        ))
    })?;
    if let Ok(m) = fs::symlink_metadata(path) {
        if m.is_dir() {
            return Err(Error::Usage(format!(
                "{flag} `{}` is a directory; give the path of the file to write",
                path.display()
            )));
        }
        if !m.is_file() {
            return Err(Error::Usage(format!(
                "{flag} `{}` exists and is not a regular file (a symlink, device or pipe); kiln only replaces regular files",
                path.display()
            )));
        }
    }
    Ok(dir.join(name))
}

/// Writes `bytes` to `path` through a temporary file in the same directory, fsynced and renamed,
/// so `path` is either absent, the previous file or the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "cannot write `{}`: the directory `{}` does not exist",
            path.display(),
            dir.display()
        )));
    }
    super::run_dir::replace_file(path, bytes)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The fixed input of a probe: 4 samples of normal values for classification, 4 sequences of
/// `block` uniform tokens for a language model, from kiln's RNG (seed 0).
fn probe_input(task: Task, input_shape: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let n = 4;
    let mut rng = Rng::stream(0, "export-probe", &[]);
    match task {
        Task::Classification { .. } => {
            let per: usize = input_shape.iter().product();
            let x = (0..n * per).map(|_| rng.normal() as f32).collect();
            let mut shape = vec![n];
            shape.extend_from_slice(input_shape);
            (x, shape)
        }
        Task::LanguageModel { vocab, block } => {
            let x = (0..n * block)
                .map(|_| ((rng.next_f64() * vocab as f64) as usize).min(vocab - 1) as f32)
                .collect();
            (x, vec![n, block])
        }
    }
}

/// Exports the weights of the run in `run_dir` (its newest verified checkpoint, or `o.from`).
pub fn export(run_dir: &Path, o: &ExportOptions) -> Result<ExportReport> {
    // every output is checked before anything is written
    let out = output_path(&o.out, "-o")?;
    let probe = o
        .probe
        .as_ref()
        .map(|p| output_path(p, "--probe"))
        .transpose()?;
    if probe.as_ref() == Some(&out) {
        return Err(Error::Usage(format!(
            "--probe and -o are both `{}`; give the probe its own file",
            out.display()
        )));
    }
    let r = run_config(run_dir)?;
    let store = checkpoint_store(run_dir)?;
    if let Ok(ck) = store.dir.canonicalize() {
        for p in std::iter::once(&out).chain(probe.as_ref()) {
            if p.starts_with(&ck) {
                return Err(Error::Usage(format!(
                    "`{}` is inside the run's checkpoints; write the export elsewhere",
                    p.display()
                )));
            }
        }
    }
    let path = require_checkpoint(&store, o.from.as_deref())?;
    let state = checkpoint::read_state(&path)?;
    let model = crate::model::build(&r, &state.input_shape)?;
    let loaded = checkpoint::load(&path, &model.layout().specs())?;
    let named = portable::export(model.as_ref(), o.format, &loaded.params);
    let model_json = serde_json::to_string(&r.config.model).unwrap_or_default();
    let mut meta: HashMap<String, String> = [
        ("kiln.version", env!("CARGO_PKG_VERSION").to_string()),
        ("kiln.step", state.step.to_string()),
        ("kiln.kind", model.kind().to_string()),
        ("kiln.format", o.format.name().to_string()),
        ("kiln.model", model_json),
        (
            "kiln.input_shape",
            serde_json::to_string(&state.input_shape).unwrap_or_default(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if o.format == WeightFormat::PyTorch {
        // what `transformers` and `safetensors.torch` write
        meta.insert("format".into(), "pt".into());
    }
    let refs: Vec<(&str, &[usize], &[f32])> = named
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice()))
        .collect();
    let bytes = tensors::encode(&refs, meta.clone()).map_err(|e| {
        Error::Usage(format!(
            "cannot export model `{}`: {e} (a model of your own maps two parameters to one name in `Family::torch_name`?)",
            model.kind()
        ))
    })?;
    // the model first: a probe never sits next to another model's weights
    write_atomic(&out, &bytes)?;
    if let Some(probe) = &probe {
        let (x, shape) = probe_input(model.task(), &state.input_shape);
        let compute = <Autodiff<Flex> as ComputeOn>::compute(model.as_ref(), &Default::default());
        let logits =
            compute.logits(&loaded.params, &crate::data::Values::F32(x.clone()), &shape)?;
        let classes = model.task().classes();
        let probe_bytes = tensors::encode(
            &[
                ("input", &shape, &x),
                ("logits", &[logits.len() / classes.max(1), classes], &logits),
            ],
            meta,
        )
        .map_err(Error::Invalid)?;
        write_atomic(probe, &probe_bytes)?;
    }
    Ok(ExportReport {
        checkpoint: path,
        step: state.step,
        tensors: named.len(),
        bytes: bytes.len(),
    })
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
    let format = match file.metadata.get("kiln.format").map(String::as_str) {
        Some("burn") => WeightFormat::Burn,
        _ => WeightFormat::PyTorch,
    };
    let map: HashMap<&str, (&[usize], &[f32])> = file
        .tensors
        .iter()
        .filter(|t| t.unsupported.is_none())
        .map(|t| (t.name.as_str(), (t.shape.as_slice(), t.data.as_slice())))
        .collect();
    let other: HashMap<&str, &str> = file
        .tensors
        .iter()
        .filter_map(|t| Some((t.name.as_str(), t.unsupported.as_deref()?)))
        .collect();
    // training from NaN or infinite weights is never what was meant
    let bad: Vec<String> = file
        .tensors
        .iter()
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
