//! `kiln export`: a checkpoint's whole model (fsdp shards gathered from the files) as a
//! safetensors file under PyTorch's, Burn's, nanoGPT's or Hugging Face GPT-2's names and
//! layouts, optionally with a probe (a fixed input and kiln's logits for it).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};

use crate::checkpoint::tensors;
use crate::error::{Error, Result};
use crate::model::portable::{self, WeightFormat};
use crate::model::{ComputeOn, Task};
use crate::rng::Rng;
use crate::rundir::{checkpoint_store, output_path, refuse_inside_run, run_config, write_atomic};

/// What `kiln export` writes.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// A checkpoint name (`step-00000600`) instead of the newest verified one.
    pub from: Option<String>,
    pub out: PathBuf,
    /// The format's name: `pytorch`, `burn`, or one of the family's (`Family::formats`).
    pub format: String,
    /// Also write a fixed model input and kiln's logits for it here (`scripts/check-export.py`
    /// compares PyTorch's logits with them).
    pub probe: Option<PathBuf>,
}

/// What `kiln export` wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub checkpoint: PathBuf,
    pub format: WeightFormat,
    pub step: usize,
    pub tensors: usize,
    pub bytes: usize,
}

/// The directory a Hugging Face export goes to (`-o DIR`): made if it does not exist (its parent
/// must), never a file or a symlink.
fn hf_dir(path: &Path, format: WeightFormat) -> Result<PathBuf> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            // the files it writes are inside `path`, and each must be one it may replace (a
            // directory there is found before anything is written: issue 45, defect 21)
            for name in ["model.safetensors", "config.json"] {
                output_path(&path.join(name), "-o")?;
            }
            Ok(path.canonicalize().unwrap_or_else(|_| path.to_path_buf()))
        }
        Ok(_) => Err(Error::Usage(format!(
            "-o `{}` is not a directory; --format {} writes a directory (model.safetensors and config.json) that Hugging Face's `from_pretrained` loads",
            path.display(),
            format.name()
        ))),
        Err(_) => {
            let parent = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if !parent.is_dir() {
                return Err(Error::Usage(format!(
                    "cannot write `{}`: the directory `{}` does not exist",
                    path.display(),
                    parent.display()
                )));
            }
            refuse_inside_run(path, "-o", None)?;
            Ok(path.to_path_buf())
        }
    }
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
    // the run's model and checkpoint, read; then every output is checked before anything is
    // written
    let r = run_config(run_dir)?;
    let store = checkpoint_store(run_dir)?;
    let (path, (state, model, loaded)) =
        crate::launch::read_model_checkpoint(&store, o.from.as_deref(), &r)?;
    // a format of the family's own (`Family::formats`), and its config.json where it has one
    let format = portable::format_named(model.as_ref(), &o.format).map_err(|why| {
        Error::Usage(format!(
            "--format {}: {why} (the run's model.kind = \"{}\")",
            crate::config::brief(&o.format, 60),
            model.kind()
        ))
    })?;
    let hf_dir = format
        .is_dir()
        .then(|| hf_dir(&o.out, format))
        .transpose()?;
    let out = match &hf_dir {
        Some(d) => d.join("model.safetensors"),
        None => output_path(&o.out, "-o")?,
    };
    let probe = o
        .probe
        .as_ref()
        .map(|p| output_path(p, "--probe"))
        .transpose()?;
    // the probe overwrites none of the export's files (issue 45, defect 20)
    let config_path = hf_dir.as_ref().map(|d| d.join("config.json"));
    if let Some(p) = probe
        .as_ref()
        .filter(|p| **p == out || Some(*p) == config_path.as_ref())
    {
        return Err(Error::Usage(format!(
            "--probe `{}` is a file of the export (-o); give the probe its own file",
            p.display()
        )));
    }
    let hf_config = model
        .hf_config(format)
        .map_err(|why| Error::Usage(format!("--format {}: {why}", format.name())))?;
    let named = portable::export(model.as_ref(), format, &loaded.params);
    let model_json = serde_json::to_string(&r.config.model).unwrap_or_default();
    let mut meta: HashMap<String, String> = [
        ("kiln.version", env!("CARGO_PKG_VERSION").to_string()),
        ("kiln.step", state.step.to_string()),
        ("kiln.kind", model.kind().to_string()),
        ("kiln.format", format.name().to_string()),
        ("kiln.model", model_json),
        (
            "kiln.input_shape",
            serde_json::to_string(&state.input_shape).unwrap_or_default(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if format != WeightFormat::Burn {
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
    // the weights first, then their config.json (a config never describes weights that failed
    // to be written: issue 45, defect 19), then the probe (never beside another model's)
    if let Some(dir) = &hf_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    write_atomic(&out, &bytes)?;
    if let (Some(dir), Some(config)) = (&hf_dir, &hf_config) {
        write_atomic(&dir.join("config.json"), config.as_bytes())?;
    }
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
        format,
        step: state.step,
        tensors: named.len(),
        bytes: bytes.len(),
    })
}
