//! Range and combination checks that the types alone cannot express. Each failure names the
//! dotted key, its source and what is allowed.

use std::path::PathBuf;

use super::error::{closest, ConfigError, KeyError};
use super::load::{describe_source, Resolved};
use super::schema::{
    choice_name, Adapter, CollectiveKind, CpuBackend, DataKind, Device, Devices, OptimKind,
    Precision, StrategyKind,
};

impl Resolved {
    /// An error about `key`, naming the source that set it.
    pub fn key_error(&self, key: &str, message: String, help: Option<String>) -> ConfigError {
        ConfigError::Key(KeyError {
            key: key.to_string(),
            message,
            source: describe_source(&self.figment, key),
            help,
        })
    }

    /// A path-valued key, resolved relative to the file that set it (as given when it came from
    /// the environment or `--set`, i.e. relative to the working directory).
    pub fn path_of(&self, key: &str, value: &str) -> PathBuf {
        let p = PathBuf::from(value);
        if p.is_absolute() {
            return p;
        }
        let from_file = self
            .figment
            .find_metadata(key)
            .and_then(|m| m.source.as_ref())
            .and_then(|s| s.file_path())
            .and_then(|f| f.parent().map(|d| d.join(&p)));
        from_file.unwrap_or(p)
    }
}

fn at_least(r: &Resolved, key: &str, value: usize, min: usize) -> Result<(), ConfigError> {
    if value < min {
        return Err(r.key_error(
            key,
            format!("`{key}` = {value} is out of range: must be at least {min}"),
            None,
        ));
    }
    Ok(())
}

fn in_range(
    r: &Resolved,
    key: &str,
    value: f64,
    ok: bool,
    allowed: &str,
) -> Result<(), ConfigError> {
    if !ok || !value.is_finite() {
        return Err(r.key_error(
            key,
            format!("`{key}` = {value} is out of range: must be {allowed}"),
            None,
        ));
    }
    Ok(())
}

/// Each path-valued key that is set names an existing file (relative to the file that set it).
fn files_exist(r: &Resolved, keys: &[(&str, &Option<String>)]) -> Result<(), ConfigError> {
    for (key, value) in keys {
        let Some(value) = value else { continue };
        let resolved = r.path_of(key, value);
        match std::fs::metadata(&resolved) {
            Ok(m) if m.is_file() => {}
            Ok(m) => {
                let what = if m.is_dir() {
                    "a directory"
                } else {
                    "a FIFO, socket or device"
                };
                return Err(r.key_error(
                    key,
                    format!(
                        "`{key}` = \"{value}\": `{}` is not a regular file (it is {what})",
                        resolved.display()
                    ),
                    Some("give the path of the data file itself".into()),
                ));
            }
            Err(_) => {
                return Err(r.key_error(
                    key,
                    format!(
                        "`{key}` = \"{value}\": file `{}` not found",
                        resolved.display()
                    ),
                    Some("paths are relative to the experiment file that sets them".into()),
                ))
            }
        }
    }
    Ok(())
}

/// Whether `checkpoint.dir` = `dir` names a directory inside the run directory: relative,
/// without `..`, not the run's own `trace/`, `logs/` or `slurm/` (`trace/` is replaced on
/// resume).
pub fn checkpoint_dir_inside(dir: &str) -> bool {
    use std::path::Component;
    let d = std::path::Path::new(dir);
    let first = d.components().find(|p| matches!(p, Component::Normal(_)));
    !dir.trim().is_empty()
        && d.components()
            .all(|p| matches!(p, Component::Normal(_) | Component::CurDir))
        && first.is_some()
        && !first.is_some_and(|f| {
            ["trace", "logs", "slurm"].contains(&f.as_os_str().to_string_lossy().as_ref())
        })
        && !dir.chars().any(char::is_control)
}

/// Checks every value and combination; the first problem is returned.
pub fn validate(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    at_least(r, "profile.active", c.profile.active, 1)?;
    validate_slurm(r)?;
    // a week at most: longer waits mean a stuck job, and huge numbers overflow clocks
    for (key, v) in [
        ("strategy.timeout_secs", c.strategy.timeout_secs),
        (
            "launch.rendezvous_timeout_secs",
            c.launch.rendezvous_timeout_secs,
        ),
        ("launch.heartbeat_secs", c.launch.heartbeat_secs),
    ] {
        if v > 604_800 {
            return Err(r.key_error(
                key,
                format!("`{key}` = {v} is out of range: at most 604800 (a week)"),
                None,
            ));
        }
    }
    let world = c.strategy.devices.count() * c.launch.nnodes.max(1);
    if let Some(bad) = c.profile.ranks.iter().find(|&&rk| rk >= world) {
        return Err(r.key_error(
            "profile.ranks",
            format!("`profile.ranks` names rank {bad}, but the job has {world} ranks (0..{world})"),
            Some(
                "list ranks below strategy.devices x launch.nnodes, or leave it empty for all"
                    .into(),
            ),
        ));
    }
    let name = &c.experiment.name;
    if name.trim().is_empty()
        || name.contains(['/', '\\'])
        || name == "."
        || name == ".."
        || name.chars().any(char::is_control)
        || name.len() > 200
    {
        return Err(r.key_error(
            "experiment.name",
            format!(
                "`experiment.name` = \"{}\" is not a usable directory name",
                c.experiment.name
            ),
            Some("use one directory name: not empty, `.` or `..`, without `/`, `\\` or control characters, at most 200 bytes".into()),
        ));
    }
    {
        if !checkpoint_dir_inside(&c.checkpoint.dir) {
            return Err(r.key_error(
                "checkpoint.dir",
                format!(
                    "`checkpoint.dir` = {:?} is not a directory inside the run directory",
                    c.checkpoint.dir
                ),
                Some("give a relative path without `..`, other than the run's trace/, logs/ and slurm/, e.g. \"checkpoints\"".into()),
            ));
        }
    }
    if c.experiment.output_dir.chars().any(char::is_control) {
        return Err(r.key_error(
            "experiment.output_dir",
            format!(
                "`experiment.output_dir` = {:?} holds a control character",
                c.experiment.output_dir
            ),
            Some("give a plain path".into()),
        ));
    }
    at_least(r, "model.input_size", c.model.input_size, 1)?;
    at_least(r, "model.classes", c.model.classes, 2)?;
    for (i, h) in c.model.hidden_sizes.iter().enumerate() {
        if *h == 0 {
            return Err(r.key_error(
                "model.hidden_sizes",
                format!(
                    "`model.hidden_sizes[{i}]` = 0 is out of range: every width must be at least 1"
                ),
                None,
            ));
        }
    }
    let d = c.model.dropout;
    in_range(r, "model.dropout", d, (0.0..1.0).contains(&d), "in [0, 1)")?;

    at_least(r, "data.classes", c.data.classes, 2)?;
    if let Some(block) = c.model.block_size {
        // the data's windows depend on it too, so it is checked before any data is read
        at_least(r, "model.block_size", block, 1)?;
    }
    match c.data.normalize.as_slice() {
        [] => {}
        [mean, std] if *std > 0.0 && std.is_finite() && mean.is_finite() => {}
        other => {
            return Err(r.key_error(
                "data.normalize",
                format!(
                    "`data.normalize` = {other:?} is not [mean, std] with std > 0, both finite"
                ),
                Some("e.g. normalize = [0.1307, 0.3081], or leave it out".into()),
            ))
        }
    }
    if c.data.tokenizer != "bytes" && !matches!(c.data.kind, DataKind::Text | DataKind::Tokens) {
        return Err(r.key_error(
            "data.tokenizer",
            format!(
                "`data.tokenizer` tokenizes text for a language model, but `data.kind` = \"{}\"",
                choice_name(&c.data.kind)
            ),
            Some("remove it, or use `data.kind = \"text\"` (or \"tokens\")".into()),
        ));
    }
    let tok = c.data.tokenizer.as_str();
    if !matches!(tok, "bytes" | "gpt2") && !r.path_of("data.tokenizer", tok).is_file() {
        let near = closest(tok, &["bytes", "gpt2"])
            .map(|k| format!("did you mean \"{k}\"? "))
            .unwrap_or_default();
        return Err(r.key_error(
            "data.tokenizer",
            format!(
                "`data.tokenizer` = \"{tok}\" is neither \"bytes\", \"gpt2\" nor a tokenizer.json file (`{}` not found)",
                r.path_of("data.tokenizer", tok).display()
            ),
            Some(format!(
                "{near}a tokenizer.json path is relative to the experiment file that sets it"
            )),
        ));
    }
    if c.data.dtype.is_some() && c.data.kind != DataKind::Tokens {
        return Err(r.key_error(
            "data.dtype",
            "`data.dtype` is the element type of a token file (`data.kind = \"tokens\"`)".into(),
            Some("remove it, or set `data.kind = \"tokens\"`".into()),
        ));
    }
    match c.data.kind {
        DataKind::Synthetic => {
            at_least(r, "data.samples", c.data.samples, 1)?;
            at_least(r, "data.features", c.data.features, 1)?;
            // the synthetic data is drawn in memory: at most 2^32 values (16 GiB)
            let values =
                (c.data.samples as u128 + c.data.eval_samples as u128) * c.data.features as u128;
            if values > 1u128 << 32 {
                return Err(r.key_error(
                    "data.samples",
                    format!(
                        "(data.samples {} + data.eval_samples {}) x data.features {} = {values} values ({} bytes) is more synthetic data than kiln draws (at most 2^32 values)",
                        c.data.samples, c.data.eval_samples, c.data.features, values * 4
                    ),
                    Some("use fewer samples or features".into()),
                ));
            }
            if let Some(t) = c.data.tokens {
                at_least(r, "data.tokens", t, 1)?;
            } else if !c.data.image.is_empty() {
                if c.data.image.len() != 3 || c.data.image.contains(&0) {
                    return Err(r.key_error(
                        "data.image",
                        format!("`data.image` = {:?} is not an image shape", c.data.image),
                        Some("give [channels, height, width], each at least 1".into()),
                    ));
                }
            } else if c.model.kind == "mlp" && c.data.features != c.model.input_size {
                return Err(r.key_error(
                    "model.input_size",
                    format!(
                        "`model.input_size` = {} does not match `data.features` = {}",
                        c.model.input_size, c.data.features
                    ),
                    Some("set both to the same number of features".into()),
                ));
            }
        }
        DataKind::Csv => {
            if c.data.path.is_none() {
                return Err(r.key_error(
                    "data.kind",
                    "`data.kind` = \"csv\" needs `data.path`".into(),
                    Some(
                        "add `path = \"train.csv\"` to [data] (relative to the experiment file)"
                            .into(),
                    ),
                ));
            }
            files_exist(
                r,
                &[
                    ("data.path", &c.data.path),
                    ("data.eval_path", &c.data.eval_path),
                ],
            )?;
        }
        DataKind::Text | DataKind::Tokens => {
            let (kind, example) = match c.data.kind {
                DataKind::Text => ("text", "corpus.txt"),
                _ => ("tokens", "train.bin"),
            };
            if c.data.path.is_none() {
                return Err(r.key_error(
                    "data.kind",
                    format!("`data.kind` = \"{kind}\" needs `data.path`"),
                    Some(format!(
                        "add `path = \"{example}\"` to [data] (relative to the experiment file)"
                    )),
                ));
            }
            if c.data.kind == DataKind::Tokens {
                files_exist(
                    r,
                    &[
                        ("data.path", &c.data.path),
                        ("data.eval_path", &c.data.eval_path),
                    ],
                )?;
                if c.data.eval_path.is_some() && c.data.eval_fraction.is_some() {
                    return Err(r.key_error(
                        "data.eval_fraction",
                        "`data.eval_fraction` holds out the end of `data.path`, but `data.eval_path` is set too".into(),
                        Some("keep one of them".into()),
                    ));
                }
            } else {
                files_exist(r, &[("data.path", &c.data.path)])?;
                if c.data.eval_path.is_some() {
                    return Err(r.key_error(
                        "data.eval_path",
                        "`data.kind` = \"text\" holds out the end of `data.path` (`data.eval_fraction`); it has no `data.eval_path`".into(),
                        Some("remove `data.eval_path`, or `kiln tokenize` both files and use `data.kind = \"tokens\"`".into()),
                    ));
                }
            }
            if let Some(f) = c.data.eval_fraction {
                if !(0.0..1.0).contains(&f) {
                    return Err(r.key_error(
                        "data.eval_fraction",
                        format!("`data.eval_fraction` = {f} is out of range: must be in [0, 1)"),
                        None,
                    ));
                }
            }
            if c.data.stride == Some(0) {
                return Err(r.key_error(
                    "data.stride",
                    "`data.stride` = 0 is out of range: must be at least 1".into(),
                    None,
                ));
            }
        }
        DataKind::Idx => {
            for (key, value, what) in [
                (
                    "data.path",
                    &c.data.path,
                    "path = \"train-images-idx3-ubyte.gz\"",
                ),
                (
                    "data.labels_path",
                    &c.data.labels_path,
                    "labels_path = \"train-labels-idx1-ubyte.gz\"",
                ),
            ] {
                if value.is_none() {
                    return Err(r.key_error(
                        "data.kind",
                        format!("`data.kind` = \"idx\" needs `{key}`"),
                        Some(format!(
                            "add `{what}` to [data] (relative to the experiment file)"
                        )),
                    ));
                }
            }
            if c.data.eval_path.is_some() != c.data.eval_labels_path.is_some() {
                let (key, missing) = if c.data.eval_path.is_some() {
                    ("data.eval_path", "data.eval_labels_path")
                } else {
                    ("data.eval_labels_path", "data.eval_path")
                };
                return Err(r.key_error(
                    key,
                    format!("`{key}` needs `{missing}` too"),
                    Some("give both evaluation files, or neither".into()),
                ));
            }
            files_exist(
                r,
                &[
                    ("data.path", &c.data.path),
                    ("data.labels_path", &c.data.labels_path),
                    ("data.eval_path", &c.data.eval_path),
                    ("data.eval_labels_path", &c.data.eval_labels_path),
                ],
            )?;
        }
    }
    if c.data.classes != c.model.classes {
        return Err(r.key_error(
            "model.classes",
            format!(
                "`model.classes` = {} does not match `data.classes` = {}",
                c.model.classes, c.data.classes
            ),
            Some("set both to the number of classes in the data".into()),
        ));
    }

    at_least(r, "train.epochs", c.train.epochs, 1)?;
    if let Some(m) = c.train.max_steps {
        at_least(r, "train.max_steps", m, 1)?;
    }
    at_least(r, "train.batch_size", c.train.batch_size, 1)?;
    at_least(r, "train.grad_accum_steps", c.train.grad_accum_steps, 1)?;
    // sizes whose products must not wrap (a global batch of 0, a model of 0 bytes)
    const MAX_SIZE: usize = 1 << 30;
    for (key, v) in [
        ("train.batch_size", c.train.batch_size),
        ("train.grad_accum_steps", c.train.grad_accum_steps),
        ("strategy.devices", c.strategy.devices.count()),
        ("launch.nnodes", c.launch.nnodes),
        ("data.samples", c.data.samples),
        ("data.eval_samples", c.data.eval_samples),
        ("data.features", c.data.features),
        ("model.input_size", c.model.input_size),
        ("model.classes", c.model.classes),
    ] {
        if v > MAX_SIZE {
            return Err(r.key_error(
                key,
                format!("`{key}` = {v} is out of range: at most {MAX_SIZE}"),
                None,
            ));
        }
    }
    if let Some((i, h)) = c
        .model
        .hidden_sizes
        .iter()
        .enumerate()
        .find(|(_, h)| **h > 1 << 24)
    {
        return Err(r.key_error(
            "model.hidden_sizes",
            format!(
                "`model.hidden_sizes[{i}]` = {h} is out of range: at most {}",
                1 << 24
            ),
            None,
        ));
    }
    let global = [
        c.train.batch_size,
        c.train.grad_accum_steps,
        c.strategy.devices.count(),
        c.launch.nnodes.max(1),
    ]
    .iter()
    .try_fold(1usize, |a, b| a.checked_mul(*b).filter(|v| *v <= MAX_SIZE));
    if global.is_none() {
        return Err(r.key_error(
            "train.batch_size",
            format!(
                "the global batch, train.batch_size {} x train.grad_accum_steps {} x strategy.devices {} x launch.nnodes {}, is more than {MAX_SIZE} samples",
                c.train.batch_size,
                c.train.grad_accum_steps,
                c.strategy.devices.count(),
                c.launch.nnodes
            ),
            Some("lower one of them".into()),
        ));
    }
    at_least(r, "train.log_every", c.train.log_every, 1)?;
    if let Some(p) = c.backend.nccl.problems().into_iter().next() {
        return Err(r.key_error(&p.key, p.message, p.help));
    }
    let d = &c.data;
    if d.workers > 64 {
        return Err(r.key_error(
            "data.workers",
            format!(
                "`data.workers` = {} is out of range: at most 64 loader threads per rank",
                d.workers
            ),
            None,
        ));
    }
    if d.workers > 0 {
        at_least(r, "data.prefetch", d.prefetch, 1)?;
    }
    if d.prefetch > 1024 {
        return Err(r.key_error(
            "data.prefetch",
            format!(
                "`data.prefetch` = {} is out of range: at most 1024 micro-batches ahead",
                d.prefetch
            ),
            None,
        ));
    }
    if let Some(a) = &d.augment {
        if a.random_crop > 4096 {
            return Err(r.key_error(
                "data.augment.random_crop",
                format!(
                    "`data.augment.random_crop` = {} is out of range: at most 4096 pixels of padding",
                    a.random_crop
                ),
                None,
            ));
        }
        let images = match d.kind {
            DataKind::Idx => true,
            DataKind::Synthetic => d.image.len() == 3 && d.tokens.is_none(),
            DataKind::Csv | DataKind::Text | DataKind::Tokens => false,
        };
        if !images {
            return Err(r.key_error(
                "data.augment",
                format!(
                    "`data.augment` transforms images, but `data.kind` = \"{}\" gives {}",
                    crate::config::choice_name(&d.kind),
                    if matches!(d.kind, DataKind::Text | DataKind::Tokens) || d.tokens.is_some() {
                        "token windows"
                    } else {
                        "flat feature rows"
                    }
                ),
                Some("remove [data.augment], or use images (`data.kind = \"idx\"`, or synthetic `data.image = [C, H, W]`)".into()),
            ));
        }
    }
    if let Some(e) = &c.train.early_stopping {
        at_least(r, "train.early_stopping.patience", e.patience, 1)?;
        in_range(
            r,
            "train.early_stopping.min_delta",
            e.min_delta,
            e.min_delta >= 0.0,
            "at least 0",
        )?;
    }
    // both watch the metric at each evaluation: with none before the end they could not act
    for (key, on) in [
        ("train.early_stopping", c.train.early_stopping.is_some()),
        ("checkpoint.keep_best", c.checkpoint.keep_best.is_some()),
    ] {
        if on && c.train.eval_every == 0 {
            return Err(r.key_error(
                "train.eval_every",
                format!("`{key}` acts at each evaluation, but `train.eval_every` = 0 evaluates only at the end"),
                Some("set train.eval_every to evaluate every N steps".into()),
            ));
        }
    }

    let o = &c.optim;
    in_range(r, "optim.lr", o.lr, o.lr >= 0.0, "at least 0")?;
    in_range(
        r,
        "optim.momentum",
        o.momentum,
        (0.0..1.0).contains(&o.momentum),
        "in [0, 1)",
    )?;
    in_range(
        r,
        "optim.weight_decay",
        o.weight_decay,
        o.weight_decay >= 0.0,
        "at least 0",
    )?;
    in_range(r, "optim.eps", o.eps, o.eps > 0.0, "greater than 0")?;
    for (i, b) in o.betas.iter().enumerate() {
        in_range(
            r,
            "optim.betas",
            *b,
            (0.0..1.0).contains(b),
            &format!("in [0, 1) (betas[{i}])"),
        )?;
    }
    if let Some(g) = o.grad_clip_norm {
        in_range(r, "optim.grad_clip_norm", g, g > 0.0, "greater than 0")?;
    }
    if o.nesterov && (o.kind != OptimKind::Sgd || o.momentum <= 0.0) {
        return Err(r.key_error(
            "optim.nesterov",
            "`optim.nesterov` = true needs `optim.kind` = \"sgd\" and `optim.momentum` > 0".into(),
            None,
        ));
    }

    let st = &c.strategy;
    at_least(r, "strategy.devices", st.devices.count(), 1)?;
    // ranks on the CPU (or a wgpu adapter) are threads of this process, each with a replica,
    // its buffers and its thread pool: beyond these, a run takes the machine's memory before
    // it trains
    if c.backend.device != Device::Cuda && st.devices.count() > MAX_HOST_RANKS {
        return Err(r.key_error(
            "strategy.devices",
            format!(
                "`strategy.devices` = {} is out of range: at most {MAX_HOST_RANKS} ranks per node on the {}",
                st.devices.count(),
                if c.backend.device == Device::Wgpu { "wgpu adapter" } else { "CPU" }
            ),
            Some("CPU ranks share this machine's cores; use launch.nnodes for more ranks, or a few devices".into()),
        ));
    }
    if c.backend.threads > MAX_THREADS {
        return Err(r.key_error(
            "backend.threads",
            format!(
                "`backend.threads` = {} is out of range: at most {MAX_THREADS} threads per rank",
                c.backend.threads
            ),
            Some("leave it 0 to share this machine's cores among the ranks".into()),
        ));
    }
    if c.backend.device != Device::Cuda
        && st.devices.count().saturating_mul(c.backend.threads.max(1)) > MAX_HOST_THREADS
    {
        return Err(r.key_error(
            "backend.threads",
            format!(
                "`backend.threads` = {} for each of `strategy.devices` = {} ranks is {} math threads, more than {MAX_HOST_THREADS}",
                c.backend.threads,
                st.devices.count(),
                st.devices.count().saturating_mul(c.backend.threads)
            ),
            Some("leave backend.threads 0 to share this machine's cores among the ranks".into()),
        ));
    }
    at_least(r, "strategy.timeout_secs", st.timeout_secs as usize, 1)?;
    in_range(
        r,
        "strategy.bucket_cap_mb",
        st.bucket_cap_mb,
        st.bucket_cap_mb > 0.0,
        "greater than 0",
    )?;
    if st.kind == StrategyKind::Single && st.devices.count() > 1 {
        return Err(r.key_error(
            "strategy.devices",
            format!(
                "`strategy.devices` = {} but `strategy.kind` = \"single\" uses one device",
                st.devices.count()
            ),
            Some("set `strategy.kind = \"ddp\"` (or \"dp\") to train on several devices".into()),
        ));
    }

    at_least(r, "checkpoint.keep_last", c.checkpoint.keep_last, 1)?;
    if c.checkpoint.dir.trim().is_empty() {
        return Err(r.key_error(
            "checkpoint.dir",
            "`checkpoint.dir` is empty".into(),
            Some("use a directory name such as \"checkpoints\"".into()),
        ));
    }

    let cuda = c.backend.device == Device::Cuda;
    let wgpu = c.backend.device == Device::Wgpu;
    if c.backend.adapter != Adapter::Auto && !wgpu {
        return Err(r.key_error(
            "backend.adapter",
            "`backend.adapter` chooses a wgpu adapter, but `backend.device` is not \"wgpu\"".into(),
            Some("set `backend.device = \"wgpu\"`, or remove `backend.adapter`".into()),
        ));
    }
    if wgpu && st.collective == CollectiveKind::Nccl {
        return Err(r.key_error(
            "strategy.collective",
            "`strategy.collective` = \"nccl\" needs CUDA; wgpu has no NCCL".into(),
            Some(
                "wgpu ranks reduce through the host: use `collective = \"host\"` (or \"auto\")"
                    .into(),
            ),
        ));
    }
    let ls = &c.backend.loss_scale;
    if c.backend.precision != Precision::F16 && !ls.is_default() {
        return Err(r.key_error(
            "backend.loss_scale",
            format!(
                "`[backend.loss_scale]` applies to `backend.precision` = \"f16\" only, not \"{}\"",
                choice_name(&c.backend.precision)
            ),
            Some("remove `[backend.loss_scale]`, or set `backend.precision = \"f16\"` (bf16 and f32 need no loss scaling)".into()),
        ));
    }
    in_range(
        r,
        "backend.loss_scale.init_scale",
        ls.init_scale,
        ls.init_scale > 0.0 && ls.init_scale <= 1e30,
        "greater than 0 and at most 1e30",
    )?;
    in_range(
        r,
        "backend.loss_scale.growth_factor",
        ls.growth_factor,
        ls.growth_factor > 1.0 && ls.growth_factor <= 1e6,
        "greater than 1 (and at most 1e6)",
    )?;
    in_range(
        r,
        "backend.loss_scale.backoff_factor",
        ls.backoff_factor,
        ls.backoff_factor > 0.0 && ls.backoff_factor < 1.0,
        "between 0 and 1",
    )?;
    at_least(
        r,
        "backend.loss_scale.growth_interval",
        ls.growth_interval as usize,
        1,
    )?;
    if st.kind == StrategyKind::Single && st.reduce_dtype != Precision::F32 {
        return Err(r.key_error(
            "strategy.reduce_dtype",
            format!(
                "`strategy.reduce_dtype` = \"{}\" sets the dtype of the gradient reduction, which `strategy.kind` = \"single\" does not have",
                choice_name(&st.reduce_dtype)
            ),
            Some("remove it, or use dp, ddp or fsdp".into()),
        ));
    }
    if c.backend.device == Device::Cpu
        && c.backend.cpu == CpuBackend::Ndarray
        && c.backend.precision != Precision::F32
    {
        return Err(r.key_error(
            "backend.precision",
            format!(
                "`backend.precision` = \"{}\" needs a backend that computes in it; ndarray computes in f32 only",
                choice_name(&c.backend.precision)
            ),
            Some("set `backend.cpu = \"flex\"` (or \"auto\"), or remove `backend.precision`".into()),
        ));
    }
    if !cuda && st.collective == CollectiveKind::Nccl {
        return Err(r.key_error(
            "strategy.collective",
            "`strategy.collective` = \"nccl\" needs `backend.device` = \"cuda\"".into(),
            Some("CPU ranks use `collective = \"host\"` (or \"auto\")".into()),
        ));
    }
    if !cuda && matches!(st.devices, Devices::List(_)) {
        return Err(r.key_error(
            "strategy.devices",
            "`strategy.devices` lists device ordinals, which only CUDA has".into(),
            Some("give CPU runs a count, e.g. `devices = 2`".into()),
        ));
    }
    if let Devices::List(l) = &st.devices {
        let mut seen = l.clone();
        seen.sort_unstable();
        seen.dedup();
        if cuda && seen.len() < l.len() && st.collective == CollectiveKind::Nccl {
            return Err(r.key_error(
                "strategy.collective",
                format!("`strategy.devices` = {l:?} puts two ranks on one GPU, which NCCL refuses (before NCCL 2.30)"),
                Some("set `strategy.collective = \"host\"` (host-staged collectives work for several ranks on one GPU), or give each rank its own GPU".into()),
            ));
        }
    }

    let l = &c.launch;
    at_least(r, "launch.nnodes", l.nnodes, 1)?;
    if l.node_rank >= l.nnodes {
        return Err(r.key_error(
            "launch.node_rank",
            format!(
                "`launch.node_rank` = {} but `launch.nnodes` = {}: node ranks are 0..{}",
                l.node_rank, l.nnodes, l.nnodes
            ),
            None,
        ));
    }
    if l.nnodes > 1 && matches!(st.kind, StrategyKind::Single | StrategyKind::Dp) {
        // blame the value someone set: the node count when the strategy is the default
        let kind_is_default =
            super::describe_source(&r.figment, "strategy.kind") == super::load::DEFAULT_SOURCE;
        return Err(r.key_error(
            if kind_is_default {
                "launch.nnodes"
            } else {
                "strategy.kind"
            },
            format!(
                "`strategy.kind` = \"{:?}\" runs in one process, but `launch.nnodes` = {}",
                st.kind, l.nnodes
            )
            .to_lowercase(),
            Some("use `strategy.kind = \"ddp\"` or \"fsdp\" across nodes".into()),
        ));
    }

    let s = &c.schedule;
    at_least(r, "schedule.step_size", s.step_size, 1)?;
    in_range(
        r,
        "schedule.gamma",
        s.gamma,
        s.gamma > 0.0,
        "greater than 0",
    )?;
    in_range(
        r,
        "schedule.min_lr",
        s.min_lr,
        s.min_lr >= 0.0 && s.min_lr <= o.lr,
        "in [0, optim.lr]",
    )?;
    validate_sweep(r)?;
    Ok(())
}

/// Ranks per node on the CPU or a wgpu adapter (threads of one process).
pub const MAX_HOST_RANKS: usize = 256;
/// `backend.threads`: math threads of one rank.
pub const MAX_THREADS: usize = 1024;
/// Math threads of all ranks of a node on the CPU.
pub const MAX_HOST_THREADS: usize = 4096;
/// Trials of one sweep (the grid's product times the random samples).
pub const MAX_TRIALS: usize = 10_000;

/// The numbers of `summary.json` a sweep can rank its trials by.
pub const SWEEP_METRICS: &[&str] = &[
    "eval_loss",
    "final_loss",
    "eval_accuracy",
    "eval_perplexity",
    "samples_per_sec",
    "tokens_per_sec",
    "wall_seconds",
    "steps",
    "epochs",
    "peak_rss_bytes",
    "flops_per_sec",
    "mfu",
    "flops_per_sample",
    "num_params",
    "global_batch",
    "world_size",
    "eval_samples",
    "resumed_from_step",
];

/// `[sweep]`: the number of trials bounded before any is expanded, and a metric a trial's
/// summary has.
fn validate_sweep(r: &Resolved) -> Result<(), ConfigError> {
    let s = &r.config.sweep;
    if !SWEEP_METRICS.contains(&s.metric.as_str()) {
        let hint = match closest(&s.metric, SWEEP_METRICS) {
            Some(m) => format!("did you mean `{m}`? "),
            None => String::new(),
        };
        return Err(r.key_error(
            "sweep.metric",
            format!(
                "`sweep.metric` = {:?} is not a number a trial's summary.json has",
                s.metric
            ),
            Some(format!("{hint}one of: {}", SWEEP_METRICS.join(", "))),
        ));
    }
    let grid = s
        .grid
        .values()
        .try_fold(1usize, |a, v| a.checked_mul(v.len().max(1)));
    let samples = s.random.as_ref().map_or(1, |x| x.samples.max(1));
    let trials = grid.and_then(|g| g.checked_mul(samples));
    if trials.is_none_or(|t| t > MAX_TRIALS) {
        let key = if s.random.as_ref().is_some_and(|x| x.samples > MAX_TRIALS) {
            "sweep.random.samples"
        } else {
            "sweep.grid"
        };
        return Err(r.key_error(
            key,
            format!(
                "the sweep has {} trials, more than {MAX_TRIALS}",
                trials.map_or("too many to count".to_string(), |t| t.to_string()),
            ),
            Some("search fewer values per key (or a random search with fewer samples), then narrow it around the best trials".into()),
        ));
    }
    Ok(())
}

/// `[slurm]`: what `kiln submit` would otherwise hand to `sbatch` to refuse.
fn validate_slurm(r: &Resolved) -> Result<(), ConfigError> {
    let s = &r.config.slurm;
    at_least(r, "slurm.nodes", s.nodes, 1)?;
    at_least(r, "slurm.tasks_per_node", s.tasks_per_node, 1)?;
    if s.cpus_per_task == Some(0) {
        return Err(r.key_error(
            "slurm.cpus_per_task",
            "`slurm.cpus_per_task` = 0 is out of range: must be at least 1".into(),
            Some("leave it unset for Slurm's default".into()),
        ));
    }
    if s.signal_secs > 65535 {
        return Err(r.key_error(
            "slurm.signal_secs",
            format!(
                "`slurm.signal_secs` = {} is out of range: Slurm's --signal takes at most 65535 seconds",
                s.signal_secs
            ),
            None,
        ));
    }
    if s.signal_secs == 0 {
        return Err(r.key_error(
            "slurm.signal_secs",
            "`slurm.signal_secs` = 0 leaves no time to checkpoint before the time limit".into(),
            Some("give the seconds a checkpoint needs, with a margin (default 120)".into()),
        ));
    }
    if let Some(t) = &s.time {
        let secs = super::schema::parse_slurm_time(t)
            .map_err(|why| r.key_error("slurm.time", format!("`slurm.time`: {why}"), None))?;
        if secs <= s.signal_secs {
            return Err(r.key_error(
                "slurm.time",
                format!(
                    "`slurm.time` = \"{t}\" is not longer than `slurm.signal_secs` = {}: the stop signal would come before the job starts",
                    s.signal_secs
                ),
                Some("give a longer time limit or a smaller slurm.signal_secs".into()),
            ));
        }
    }
    for (key, v) in [
        ("slurm.partition", &s.partition),
        ("slurm.account", &s.account),
    ] {
        if let Some(v) = v {
            if !super::schema::slurm_name_ok(v) {
                return Err(r.key_error(
                    key,
                    format!("`{key}` = {v:?} is not a Slurm name"),
                    Some("use letters, digits, `_`, `-`, `.` (and `,` between partitions); leave it unset for the cluster's default".into()),
                ));
            }
        }
    }
    if s.gpus_per_node == Some(0) && r.config.backend.device == crate::config::Device::Cuda {
        return Err(r.key_error(
            "slurm.gpus_per_node",
            "`slurm.gpus_per_node` = 0 with backend.device = \"cuda\": the job would get no GPU"
                .into(),
            Some("leave it unset (strategy.devices GPUs per node) or give the GPUs".into()),
        ));
    }
    if let Some(bad) = s
        .sbatch_args
        .iter()
        .find(|a| !super::schema::sbatch_option_ok(a))
    {
        return Err(r.key_error(
            "slurm.sbatch_args",
            format!("`slurm.sbatch_args` has {bad:?}, which is not one sbatch option"),
            Some("give options such as \"--mail-type=END\", one per element, `=` before a value, no spaces or quotes".into()),
        ));
    }
    Ok(())
}
