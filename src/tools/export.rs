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
    /// The format's name: `pytorch`, `burn`, or one of the family's (`WeightAdapter::formats`).
    pub format: String,
    /// Also write a fixed model input and kiln's logits for it here (`scripts/check-export.py`
    /// compares PyTorch's logits with them).
    pub probe: Option<PathBuf>,
    /// A directory format's weights in shards of at most this many bytes (a tensor larger than
    /// that alone in one), with transformers' `model.safetensors.index.json`; default 5 GB.
    pub max_shard_size: Option<u64>,
    /// The dtype the weights are written in; default: the dtype of the `model.init_from`
    /// weights the run started from, else f32 (issue 58, defect 23: a bf16 model came back
    /// twice its size).
    pub dtype: Option<tensors::FloatDtype>,
}

/// transformers' `save_pretrained` default shard size.
pub const DEFAULT_SHARD_BYTES: u64 = 5_000_000_000;

type Encode<'a> = dyn Fn(&[(&str, &[usize], &[f32])]) -> Result<Vec<u8>> + 'a;

/// One tensor to write: its name, shape and values.
type TensorRef<'a> = (&'a str, &'a [usize], &'a [f32]);
/// A file written beside the weights: its name and bytes.
type Companion = (&'static str, Vec<u8>);

/// The files of a directory export in `dir`: the weights in one `model.safetensors`, or in
/// shards of at most `max_shard` bytes named as transformers names them with its index; the
/// family's `config.json` and a `generation_config.json`. Each must be a file kiln may replace
/// (a directory there is found before anything is written: issue 45, defect 21).
fn dir_files(
    dir: &Path,
    refs: &[TensorRef<'_>],
    max_shard: Option<u64>,
    encode: &Encode,
    config: Option<&str>,
    companions: Vec<Companion>,
) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let max = max_shard.unwrap_or(DEFAULT_SHARD_BYTES);
    let mut shards: Vec<Vec<TensorRef<'_>>> = vec![Vec::new()];
    let mut size = 0u64;
    for r in refs {
        let b = 4 * r.2.len() as u64;
        if size > 0 && size + b > max {
            shards.push(Vec::new());
            size = 0;
        }
        size += b;
        shards.last_mut().expect("one shard at least").push(*r);
    }
    let mut files = Vec::new();
    if shards.len() == 1 {
        files.push((dir.join("model.safetensors"), encode(&shards[0])?));
    } else {
        let n = shards.len();
        let mut map = serde_json::Map::new();
        for (i, shard) in shards.iter().enumerate() {
            let name = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            for (t, _, _) in shard {
                map.insert(t.to_string(), name.clone().into());
            }
            files.push((dir.join(&name), encode(shard)?));
        }
        let total: usize = refs.iter().map(|r| 4 * r.2.len()).sum();
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": map});
        let text = serde_json::to_string_pretty(&index).unwrap_or_default() + "\n";
        files.push((dir.join("model.safetensors.index.json"), text.into_bytes()));
    }
    if let Some(config) = config {
        files.push((dir.join("config.json"), config.as_bytes().to_vec()));
        if !companions
            .iter()
            .any(|(n, _)| *n == "generation_config.json")
        {
            let generation = "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": null,\n  \"eos_token_id\": null\n}\n";
            files.push((
                dir.join("generation_config.json"),
                generation.as_bytes().to_vec(),
            ));
        }
    }
    files.extend(companions.into_iter().map(|(n, b)| (dir.join(n), b)));
    if dir.is_dir() {
        for (p, _) in &files {
            output_path(p, "-o")?;
        }
    }
    Ok(files)
}

/// The files a Hugging Face directory export carries besides the weights and the family's
/// config.json, and that config.json with the run's special tokens: from the directory the
/// run started from (`model.init_from`), its generation_config.json and tokenizer files and the
/// `bos_token_id` / `eos_token_id` of its config.json; the run's own `data.tokenizer` file as
/// tokenizer.json. What is not there (a directory since removed, a run from scratch) is left out.
fn companions(r: &crate::config::Resolved, config: &str) -> Result<(String, Vec<Companion>)> {
    const NAMES: [&str; 4] = [
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ];
    let read = |p: &Path| -> Result<Option<Vec<u8>>> {
        if !p.is_file() {
            return Ok(None);
        }
        crate::data::read_bounded(p, "model.init_from", Some(256 << 20))
            .map(Some)
            .map_err(|e| Error::Usage(e.to_string()))
    };
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut config = config.to_string();
    let init_dir = init_path(r).and_then(|p| crate::config::hf_json::config_json_of(&p));
    if let Some(json_path) = init_dir {
        for name in NAMES {
            if let Some(bytes) = read(&json_path.with_file_name(name))? {
                out.push((name, bytes));
            }
        }
        let theirs: Option<serde_json::Value> =
            read(&json_path)?.and_then(|b| serde_json::from_slice(&b).ok());
        if let (Some(theirs), Ok(mut ours)) =
            (theirs, serde_json::from_str::<serde_json::Value>(&config))
        {
            // (a vision-language config's text_config has them where its top level does not,
            // Gemma3TextConfig's defaults where neither says)
            let lm = crate::config::hf_json::language_model(&theirs).ok();
            for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
                let v = std::iter::once(&theirs)
                    .chain(lm.as_deref())
                    .find_map(|c| c.get(key).filter(|v| !v.is_null()));
                if let Some(v) = v {
                    ours[key] = v.clone();
                }
            }
            config = serde_json::to_string_pretty(&ours).unwrap_or(config) + "\n";
        }
    }
    let tok = &r.config.data.tokenizer;
    if !matches!(tok.as_str(), "bytes" | "gpt2") {
        let p = crate::data::tokenizer::json_file(r.path_of("data.tokenizer", tok));
        if let Some(bytes) = read(&p)? {
            out.retain(|(n, _)| *n != "tokenizer.json");
            out.push(("tokenizer.json", bytes));
        }
    }
    Ok((config, out))
}

/// Writes `files` into `dir`, which appears whole or not at all, new or not: the export is
/// written beside it under a temporary name, each file synced, then renamed into place. Into an
/// existing directory the files kiln does not write (a README, tokenizer files of the user's,
/// subdirectories) come along as hard links (copies across file systems), the weights of an
/// earlier export do not (a `model.safetensors` beside a new index, shards not among these),
/// and the two directories are exchanged in one `renameat2(RENAME_EXCHANGE)` (issue 58,
/// defect 12: files replaced one by one left two models mixed under one index when a write
/// failed half way, and `init_from` loaded them without a word).
fn write_dir(dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let tmp = dir.with_file_name(format!(".{name}.kiln-{}", std::process::id()));
    let existing = dir.is_dir();
    // (a directory of that name is not this export's to remove); a parent this user cannot
    // write to (an export directory of theirs in a shared one): file by file in place
    if let Err(e) = fs::create_dir(&tmp) {
        if existing && e.kind() == std::io::ErrorKind::PermissionDenied {
            return write_in_place(dir, files);
        }
        return Err(Error::io(format!("making {}", tmp.display()), e));
    }
    // (what failed, and where)
    let made = (|| -> std::result::Result<(), (PathBuf, std::io::Error)> {
        let at = |p: &Path| {
            let p = p.to_path_buf();
            move |e| (p, e)
        };
        if existing {
            let ours: Vec<&std::ffi::OsStr> =
                files.iter().filter_map(|(p, _)| p.file_name()).collect();
            for e in fs::read_dir(dir).map_err(at(dir))? {
                let e = e.map_err(at(dir))?;
                let name = e.file_name();
                if ours.contains(&name.as_os_str()) || is_weights(&name.to_string_lossy()) {
                    continue;
                }
                link_tree(&e.path(), &tmp.join(&name)).map_err(at(&e.path()))?;
            }
        }
        for (p, b) in files {
            let path = tmp.join(p.file_name().unwrap_or_default());
            (|| -> std::io::Result<()> {
                let mut f = fs::File::create(&path)?;
                std::io::Write::write_all(&mut f, b)?;
                f.sync_all()
            })()
            .map_err(at(p))?;
        }
        fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(at(&tmp))?;
        if existing {
            exchange(&tmp, dir).map_err(at(dir))?;
        } else {
            fs::rename(&tmp, dir).map_err(at(dir))?;
        }
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::File::open(parent)
                .and_then(|f| f.sync_all())
                .map_err(at(parent))?;
        }
        Ok(())
    })();
    // the temporary name holds the new files (failed) or the old directory (exchanged)
    let _ = fs::remove_dir_all(&tmp);
    // a directory that cannot be exchanged (a mount point, another file system, an overlay's
    // lower layer): file by file in place, as before
    if let Err((p, e)) = &made {
        let cannot = [
            libc::EXDEV,
            libc::EBUSY,
            libc::EPERM,
            libc::EACCES,
            libc::ENOTSUP,
        ];
        if existing && p == dir && e.raw_os_error().is_some_and(|c| cannot.contains(&c)) {
            return write_in_place(dir, files);
        }
    }
    made.map_err(|(p, e)| {
        Error::io(
            format!(
                "writing {} (the export into {})",
                p.display(),
                dir.display()
            ),
            e,
        )
    })
}

/// Writes `files` into the existing directory `dir` one by one, each replaced atomically, and
/// removes the earlier export's weights that are not among them: where the directory cannot be
/// exchanged whole (a mount point, a parent not writable).
fn write_in_place(dir: &Path, files: &[(PathBuf, Vec<u8>)]) -> Result<()> {
    for (p, b) in files {
        write_atomic(p, b)?;
    }
    let ours: Vec<&std::ffi::OsStr> = files.iter().filter_map(|(p, _)| p.file_name()).collect();
    for e in fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        .flatten()
    {
        let name = e.file_name();
        if is_weights(&name.to_string_lossy()) && !ours.contains(&name.as_os_str()) {
            fs::remove_file(e.path())
                .map_err(|err| Error::io(format!("removing {}", e.path().display()), err))?;
        }
    }
    Ok(())
}

/// A file name of Hugging Face weights: `model.safetensors`, its index, or a shard.
fn is_weights(n: &str) -> bool {
    n == "model.safetensors"
        || n == "adapter_model.safetensors"
        || n == "model.safetensors.index.json"
        || (n.starts_with("model-") && n.contains("-of-") && n.ends_with(".safetensors"))
}

/// `src` at `dst`: a file as a hard link (a copy across file systems), a directory entry by
/// entry, a symlink as a symlink to the same target.
fn link_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    let m = fs::symlink_metadata(src)?;
    if m.is_dir() {
        fs::create_dir(dst)?;
        for e in fs::read_dir(src)? {
            let e = e?;
            link_tree(&e.path(), &dst.join(e.file_name()))?;
        }
        Ok(())
    } else if m.file_type().is_symlink() {
        std::os::unix::fs::symlink(fs::read_link(src)?, dst)
    } else {
        fs::hard_link(src, dst).or_else(|_| fs::copy(src, dst).map(|_| ()))
    }
}

/// Exchanges directories `a` and `b` in one step where the file system can
/// (`renameat2(RENAME_EXCHANGE)`), else moves `b` aside, `a` in, and removes nothing: the old
/// directory is then at `a`.
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that live through the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(err);
    }
    // a file system without the exchange: b aside, a in, the old one at a's name
    let aside = a.with_extension("old");
    fs::rename(b, &aside)?;
    if let Err(e) = fs::rename(a, b) {
        let _ = fs::rename(&aside, b);
        return Err(e);
    }
    fs::rename(&aside, a)
}

/// What `kiln export` wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub checkpoint: PathBuf,
    pub format: WeightFormat,
    pub dtype: tensors::FloatDtype,
    pub step: usize,
    pub tensors: usize,
    pub bytes: usize,
}

/// The directory a Hugging Face export goes to (`-o DIR`, or the directory a symlink there
/// names): made if it does not exist (its parent must), never a file.
fn hf_dir(path: &Path, format: WeightFormat) -> Result<PathBuf> {
    // (a symlink to a directory is that directory: issue 58, defect 15)
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => {
            let dir = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
            // an existing directory is replaced whole: only an earlier export (or an empty
            // one), never a run's or another directory's files
            refuse_inside_run(&dir.join("config.json"), "-o", None)?;
            let empty = fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none());
            let export = [
                "config.json",
                "model.safetensors",
                "model.safetensors.index.json",
                "adapter_config.json",
            ]
                .iter()
                .any(|f| dir.join(f).exists());
            if !empty && !export {
                return Err(Error::Usage(format!(
                    "-o `{}` exists and holds no Hugging Face model (no config.json or weights); an export replaces its directory whole\n  = help: give a new directory, or one an earlier export wrote",
                    path.display()
                )));
            }
            Ok(dir)
        }
        Ok(_) => Err(Error::Usage(format!(
            "-o `{}` is not a directory; --format {} writes a directory (config.json and the weights) that Hugging Face's `from_pretrained` loads",
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

/// `params` rounded to `dtype` (to nearest even, as the export writes them), back in f32.
fn rounded(params: &[f32], dtype: tensors::FloatDtype) -> Vec<f32> {
    match dtype {
        tensors::FloatDtype::F32 => params.to_vec(),
        tensors::FloatDtype::Bf16 => params
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect(),
        tensors::FloatDtype::F16 => params
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect(),
    }
}

/// What `model.init_from` names (a directory or a weights file), resolved, when it is set.
fn init_path(r: &crate::config::Resolved) -> Option<PathBuf> {
    let v = r.config.model.init_from.as_deref()?;
    Some(r.path_of("model.init_from", v))
}

/// The float dtype of the weights `model.init_from` names (a safetensors file, or a Hugging Face
/// directory's `model.safetensors` or first shard), when the run started from some.
fn init_dtype(r: &crate::config::Resolved) -> Option<tensors::FloatDtype> {
    let init = init_path(r)?;
    let file = if init.is_dir() {
        let single = init.join("model.safetensors");
        if single.is_file() {
            single
        } else {
            let mut shards: Vec<PathBuf> = fs::read_dir(&init)
                .ok()?
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .map(|n| n.to_string_lossy())
                        .is_some_and(|n| is_weights(&n) && n.ends_with(".safetensors"))
                })
                .collect();
            shards.sort();
            shards.into_iter().next()?
        }
    } else {
        init
    };
    tensors::Lazy::open(&file).ok()?.float_dtype()
}

/// transformers' config.json with `torch_dtype` set to `dtype` (the dtype `from_pretrained`
/// loads in by default with `torch_dtype="auto"`).
fn with_torch_dtype(config: &str, dtype: tensors::FloatDtype) -> String {
    match serde_json::from_str::<serde_json::Value>(config) {
        Ok(mut v) if v.get("torch_dtype").is_some() => {
            v["torch_dtype"] = dtype.torch_name().into();
            serde_json::to_string_pretty(&v).map_or(config.to_string(), |s| s + "\n")
        }
        _ => config.to_string(),
    }
}

/// Refuses an export into the directory the run was initialised from (issue 58, defect 11: it
/// replaced the pretrained model's weights, and its shards and index were gone).
fn refuse_init_dir(r: &crate::config::Resolved, dir: &Path) -> Result<()> {
    let Some(init) = init_path(r) else {
        return Ok(());
    };
    let init_dir = if init.is_dir() {
        init
    } else {
        init.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let same = match (init_dir.canonicalize(), dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(Error::Usage(format!(
            "-o `{}` is the directory this run was initialised from (`model.init_from`); exporting there would replace the pretrained model's weights\n  = help: give the export a directory of its own, e.g. -o {}-finetuned",
            dir.display(),
            dir.display()
        )));
    }
    Ok(())
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

/// The safetensors metadata of an export: kiln's version, the step, the model and its format
/// (and PyTorch's `format = pt`, which transformers and `safetensors.torch` write).
fn metadata(
    r: &crate::config::Resolved,
    kind: &str,
    format: WeightFormat,
    step: usize,
    input_shape: &[usize],
) -> HashMap<String, String> {
    let model_json = serde_json::to_string(&r.config.model).unwrap_or_default();
    let mut meta: HashMap<String, String> = [
        ("kiln.version", env!("CARGO_PKG_VERSION").to_string()),
        ("kiln.step", step.to_string()),
        ("kiln.kind", kind.to_string()),
        ("kiln.format", format.name().to_string()),
        ("kiln.model", model_json),
        (
            "kiln.input_shape",
            serde_json::to_string(input_shape).unwrap_or_default(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if format != WeightFormat::Burn {
        // what `transformers` and `safetensors.torch` write
        meta.insert("format".into(), "pt".into());
    }
    meta
}

/// Where an export goes: a directory format's directory (never the run's `init_from`
/// directory), the weights file, and the probe's file, each checked.
fn outputs(
    r: &crate::config::Resolved,
    o: &ExportOptions,
    format: WeightFormat,
) -> Result<(Option<PathBuf>, PathBuf, Option<PathBuf>)> {
    let hf_dir = format
        .is_dir()
        .then(|| hf_dir(&o.out, format))
        .transpose()?;
    if let Some(d) = &hf_dir {
        refuse_init_dir(r, d)?;
    }
    let out = match &hf_dir {
        Some(d) => d.join("model.safetensors"),
        None => output_path(&o.out, "-o")?,
    };
    // (a single file too: never over the weights the run started from)
    let init = init_path(r).and_then(|p| p.canonicalize().ok());
    if hf_dir.is_none() && init.is_some() && init == out.canonicalize().ok() {
        return Err(Error::Usage(format!(
            "-o `{}` is the weights file this run was initialised from (`model.init_from`); exporting there would replace them\n  = help: give the export a file of its own",
            o.out.display()
        )));
    }
    let probe = o
        .probe
        .as_ref()
        .map(|p| output_path(p, "--probe"))
        .transpose()?;
    Ok((hf_dir, out, probe))
}

/// The files of an export: a directory's (weights, their index, config.json,
/// generation_config.json; PEFT's adapter_model.safetensors and adapter_config.json), or the one
/// file.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn export_files(
    r: &crate::config::Resolved,
    model: &dyn crate::model::Model,
    format: WeightFormat,
    (hf_dir, out): (&Option<PathBuf>, &Path),
    refs: &[(&str, &[usize], &[f32])],
    o: &ExportOptions,
    encode: &dyn Fn(&[(&str, &[usize], &[f32])]) -> Result<Vec<u8>>,
    hf_config: Option<String>,
) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    let peft = (format == crate::model::lora::PEFT)
        .then(|| model.weights().lora())
        .flatten();
    Ok(match (hf_dir, peft) {
        // PEFT's `save_pretrained` directory
        (Some(dir), Some(spec)) => {
            let base = r.config.model.init_from.as_deref();
            // (a vision-language base, Gemma 3 4B-27B's: PEFT names the language model's
            // modules `model.language_model.layers...`, where kiln's are `model.layers...`)
            let lm = match init_path(r).map(|p| crate::config::hf_json::language_model_modules(&p))
            {
                Some(Ok(lm)) => lm,
                Some(Err(why)) if model.kind() == "gemma3" => {
                    eprintln!("warning: the adapter is named for a text Gemma 3 (Gemma3ForCausalLM): the base model's config ({why}) cannot tell whether it is a vision-language Gemma 3 (4B-27B), on which PEFT would not find these names; export again with the base directory where `model.init_from` says");
                    None
                }
                _ => None,
            };
            let config = crate::model::lora::adapter_config(model, spec, base, lm);
            let weights = match lm {
                Some(lm) => {
                    let names: Vec<String> = refs
                        .iter()
                        .map(
                            |(n, _, _)| match n.strip_prefix("base_model.model.model.") {
                                Some(rest) => format!("base_model.model.{lm}{rest}"),
                                None => n.to_string(),
                            },
                        )
                        .collect();
                    let renamed: Vec<(&str, &[usize], &[f32])> = refs
                        .iter()
                        .zip(&names)
                        .map(|((_, s, v), n)| (n.as_str(), *s, *v))
                        .collect();
                    encode(&renamed)?
                }
                None => encode(refs)?,
            };
            vec![
                (dir.join("adapter_model.safetensors"), weights),
                (dir.join("adapter_config.json"), config.into_bytes()),
            ]
        }
        (Some(dir), None) => {
            let (config, companions) = match &hf_config {
                Some(c) => {
                    let (c, files) = companions(r, c)?;
                    (Some(c), files)
                }
                None => (None, Vec::new()),
            };
            dir_files(
                dir,
                refs,
                o.max_shard_size,
                encode,
                config.as_deref(),
                companions,
            )?
        }
        (None, _) => vec![(out.to_path_buf(), encode(refs)?)],
    })
}

/// Exports the weights of the run in `run_dir` (its newest verified checkpoint, or `o.from`).
pub fn export(run_dir: &Path, o: &ExportOptions) -> Result<ExportReport> {
    // the run's model and checkpoint, read; then every output is checked before anything is
    // written
    let r = run_config(run_dir)?;
    let store = checkpoint_store(run_dir)?;
    let (path, (state, model, loaded)) =
        crate::launch::read_model_checkpoint(&store, o.from.as_deref(), &r)?;
    // a format of the family's own (`WeightAdapter::formats`), and its config.json where it has one
    let format = portable::format_named(model.as_ref(), &o.format).map_err(|why| {
        Error::Usage(format!(
            "--format {}: {why} (the run's model.kind = \"{}\")",
            crate::config::brief(&o.format, 60),
            model.kind()
        ))
    })?;
    let (hf_dir, out, probe) = outputs(&r, o, format)?;
    let dtype = o.dtype.or_else(|| init_dtype(&r)).unwrap_or_default();
    let hf_config = model
        .weights()
        .hf_config(format)
        .map_err(|why| Error::Usage(format!("--format {}: {why}", format.name())))?
        .map(|c| with_torch_dtype(&c, dtype));
    let named = portable::export(model.as_ref(), format, &loaded.params);
    let meta = metadata(&r, model.kind(), format, state.step, &state.input_shape);
    let refs: Vec<(&str, &[usize], &[f32])> = named
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice()))
        .collect();
    let encode = |refs: &[(&str, &[usize], &[f32])]| {
        tensors::encode_as(refs, meta.clone(), dtype).map_err(|e| {
            Error::Usage(format!(
                "cannot export model `{}`: {e} (a model of your own maps two parameters to one name in `WeightAdapter::torch_name`?)",
                model.kind()
            ))
        })
    };
    let files = export_files(
        &r,
        model.as_ref(),
        format,
        (&hf_dir, &out),
        &refs,
        o,
        &encode,
        hf_config,
    )?;
    let bytes = files
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "safetensors"))
        .map(|(_, b)| b.len())
        .sum();
    // the probe overwrites none of the export's files (issue 45, defect 20)
    if let Some(p) = probe
        .as_ref()
        .filter(|p| files.iter().any(|(f, _)| f == *p))
    {
        return Err(Error::Usage(format!(
            "--probe `{}` is a file of the export (-o); give the probe its own file",
            p.display()
        )));
    }
    // the weights first, then their index and config.json (a config never describes weights
    // that failed to be written: issue 45, defect 19), then the probe (never beside another
    // model's); a new directory appears whole (written beside it, then renamed)
    match &hf_dir {
        Some(dir) => write_dir(dir, &files)?,
        None => write_atomic(&out, &files[0].1)?,
    }
    if let Some(probe) = &probe {
        let (x, shape) = probe_input(model.task(), &state.input_shape);
        let compute = <Autodiff<Flex> as ComputeOn>::compute(
            model.as_ref(),
            &Default::default(),
            r.config.backend.fused,
        );
        // the logits of the weights as exported
        let params = rounded(&loaded.params, dtype);
        let logits = compute.logits(&params, &crate::data::Values::F32(x.clone()), &shape)?;
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
        dtype,
        step: state.step,
        tensors: named.len(),
        bytes,
    })
}
