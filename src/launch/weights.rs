//! Weights in and out of kiln as safetensors files: `kiln export` (a checkpoint's whole model,
//! fsdp shards gathered from the files, under PyTorch's or Burn's names and layouts) and
//! `model.init_from` (a run starting from such a file, or from PyTorch's `save_file`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::backend::{Autodiff, Flex};

use super::run_dir::{checkpoint_store, run_config};
use crate::checkpoint::tensors;
use crate::config::InitFormat;
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

/// The directory a Hugging Face export goes to (`-o DIR`): made if it does not exist (its parent
/// must), never a file or a symlink.
fn hf_dir(path: &Path) -> Result<PathBuf> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            // the files it writes are inside `path`
            super::run_dir::refuse_inside_run(&path.join("model.safetensors"), "-o", None)?;
            Ok(path.to_path_buf())
        }
        Ok(_) => Err(Error::Usage(format!(
            "-o `{}` is not a directory; --format hf-gpt2 writes a directory (model.safetensors and config.json) that `GPT2LMHeadModel.from_pretrained` loads",
            path.display()
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
            super::run_dir::refuse_inside_run(path, "-o", None)?;
            Ok(path.to_path_buf())
        }
    }
}

/// Hugging Face's `config.json` of the gpt run `r` (a `GPT2LMHeadModel`), or why it has none.
fn gpt2_config(r: &Resolved, model: &dyn Model) -> Result<String> {
    let m = &r.config.model;
    if model.kind() != "gpt" {
        return Err(Error::Usage(format!(
            "--format hf-gpt2 writes a gpt's weights, but the run trained model.kind = \"{}\"",
            model.kind()
        )));
    }
    if m.bias == Some(false) {
        return Err(Error::Usage(
            "--format hf-gpt2: GPT-2 has biases in every Linear and LayerNorm, but the run set `model.bias = false`; export --format nanogpt (or pytorch) instead".into(),
        ));
    }
    let dropout = m.dropout;
    let vocab = m.vocab_size.unwrap_or(256);
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_positions": m.block_size.unwrap_or(128),
        "n_ctx": m.block_size.unwrap_or(128),
        "n_embd": m.dim.unwrap_or(128),
        "n_layer": m.layers.unwrap_or(4),
        "n_head": m.heads.unwrap_or(4),
        "n_inner": null,
        "activation_function": if m.gelu == Some(crate::config::GeluKind::Tanh) { "gelu_new" } else { "gelu" },
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "tie_word_embeddings": m.tie_embeddings.unwrap_or(true),
        // GPT-2's end-of-text, where the vocabulary has it
        "bos_token_id": (vocab > 50256).then_some(50256),
        "eos_token_id": (vocab > 50256).then_some(50256),
        "torch_dtype": "float32",
    });
    Ok(serde_json::to_string_pretty(&config).unwrap_or_default() + "\n")
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
    super::run_dir::refuse_inside_run(path, flag, None)?;
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
    let hf_dir = (o.format == WeightFormat::HfGpt2)
        .then(|| hf_dir(&o.out))
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
    if probe.as_ref() == Some(&out) {
        return Err(Error::Usage(format!(
            "--probe and -o are both `{}`; give the probe its own file",
            out.display()
        )));
    }
    let r = run_config(run_dir)?;
    let store = checkpoint_store(run_dir)?;
    let (path, (state, model, loaded)) =
        super::resume::read_model_checkpoint(&store, o.from.as_deref(), &r)?;
    let hf_config = match &hf_dir {
        Some(_) => Some(gpt2_config(&r, model.as_ref())?),
        None if o.format.gpt2_names() && model.kind() != "gpt" => {
            return Err(Error::Usage(format!(
                "--format {} writes a gpt's weights, but the run trained model.kind = \"{}\"",
                o.format.name(),
                model.kind()
            )))
        }
        None => None,
    };
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
    if o.format != WeightFormat::Burn {
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
    if let (Some(dir), Some(config)) = (&hf_dir, &hf_config) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        write_atomic(&dir.join("config.json"), config.as_bytes())?;
    }
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
