//! The one function that builds the config layering (`build_figment_without`, behind `load`,
//! `load_with_flags`, `load_run`, `build_figment` and `build_run_figment`). Its layers, in the
//! order they are merged, lowest first:
//!
//! 1. Built-in defaults (`Config::default()`, source `"default"`): always.
//! 2. The files the experiment file `extends`, depth first, each after the files it extends (a
//!    later file's `[sweep] grid` replaces the grids of the files below it): when it has any.
//! 3. The experiment file itself; for a run directory (`load_run`: resume, eval, env;
//!    `build_run_figment`: export, sample) the run's resolved `config.toml` in its place.
//! 4. `KILN_<SECTION>__<KEY>` environment variables (`KILN_OPTIM__LR=0.1`); other `KILN_`
//!    variables (tokens, paths) are not config keys.
//! 5. The launcher's variables as `launch.*`, each when set: with `WORLD_SIZE` (torchrun)
//!    `WORLD_SIZE`, `RANK`, `MASTER_ADDR`, `MASTER_PORT` (+ 1 under torchrun, whose agent holds
//!    that port) and `LOCAL_RANK`; else inside an `srun` step `SLURM_STEP_NUM_TASKS` (or
//!    `SLURM_NTASKS`), `SLURM_PROCID` and `MASTER_*`; else a Slurm allocation's
//!    `SLURM_NNODES`, `SLURM_NODEID` and `MASTER_*`.
//! 6. A bare `srun` step (several tasks, no `WORLD_SIZE` or `MASTER_ADDR`): `launch.master_addr`
//!    = the step's first host and `launch.master_port` from the job and step ids, each only
//!    where no layer below set it.
//! 7. Under torchrun with several processes on the host (`LOCAL_WORLD_SIZE` > 1, or unset):
//!    `strategy.devices = 1`, each process one kiln node of one device.
//! 8. `--set key=value` flags, in order.
//! 9. Typed command-line flags (`kiln run --nnodes 2`), each named after its flag.
//! 10. `OMP_NUM_THREADS` as `backend.threads`, only when no layer sets a count above 0.
//! 11. For an experiment file only (a run's `config.toml` has these keys already): the
//!     `config.json` of a Hugging Face directory in `model.init_from`, for the `[model]` keys no
//!     layer above the defaults sets (one set to another value is an error; `block_size` may
//!     differ), and `data.tokenizer` = the `tokenizer.json` beside it when no layer sets it.
//!
//! Layers 10 and 11 come last but only fill in: 10 replaces a `backend.threads` of 0 (the
//! default, "share the cores") and no count above it, 11 no key that another layer sets.
//! `build_run_figment` passes no environment, `--set` or flag: it has layers 1 and 3 only.
//! Left out of every layer above the defaults (so they take their defaults): a key unset by
//! `--set KEY=` (no value), the keys of a run's `config.toml` that a resume's new
//! `strategy.kind` does not have (`Resolved::left_out`), and a key set aside after an error (so
//! that every error is reported at once). Every value keeps the metadata of the layer that set
//! it, so errors and `kiln check` can name its source.

use std::path::{Path, PathBuf};

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};

pub use super::diagnose::extract;
pub(super) use super::diagnose::{key_error, parse_message};
use super::error::{ConfigError, KeyErrorKind};
pub use super::launcher_env::{bare_srun, under_torchrun};
pub use super::provenance::{describe_source, find_line};
use super::validate::validate;
use super::{Config, SECTIONS};

/// Name of the metadata of the built-in defaults layer.
pub const DEFAULT_SOURCE: &str = "default";
/// Prefix of env vars that set config keys: `KILN_OPTIM__LR=0.1` sets `optim.lr`.
pub const ENV_PREFIX: &str = "KILN_";

/// A resolved config together with where each value came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub config: Config,
    pub figment: Figment,
    /// The experiment file as given.
    pub file: PathBuf,
    /// Keys of a run's config.toml left out because a resume changed `strategy.kind` to a
    /// strategy that does not have them (`notes` says each).
    pub left_out: Vec<String>,
}

/// One layer: a dictionary plus the metadata that names its source.
pub(super) struct Layer {
    pub(super) meta: Metadata,
    pub(super) dict: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        self.meta.clone()
    }
    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.dict.clone()))
    }
}

fn to_dict<T: serde::Serialize>(v: &T) -> Dict {
    Value::serialize(v)
        .ok()
        .and_then(|v| v.into_dict())
        .unwrap_or_default()
}

/// A command-line flag that sets a config key (`kiln run --nnodes 2` sets `launch.nnodes`):
/// its value as the flag typed it, its source named after the flag (`flag --nnodes`). Flags
/// are the top layer, above `--set`.
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    /// The flag as written, e.g. `--nnodes`.
    pub flag: &'static str,
    /// The dotted key it sets, e.g. `launch.nnodes`.
    pub key: &'static str,
    pub value: FlagValue,
}

/// A flag's typed value.
#[derive(Debug, Clone, PartialEq)]
pub enum FlagValue {
    Int(u64),
    Str(String),
}

impl Flag {
    pub fn int(flag: &'static str, key: &'static str, v: impl Into<u64>) -> Flag {
        Flag {
            flag,
            key,
            value: FlagValue::Int(v.into()),
        }
    }

    pub fn str(flag: &'static str, key: &'static str, v: &str) -> Flag {
        Flag {
            flag,
            key,
            value: FlagValue::Str(v.to_string()),
        }
    }
}

/// Reads `file`, its `extends` chain, the `KILN_` variables among `env` and the `--set` flags, and
/// returns the validated config. `env` is passed in (not read here) so tests control it. Every
/// key that is wrong is reported, not only the first: after each error the key is set aside (it
/// takes its default) and the rest is checked again.
pub fn load(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
) -> Result<Resolved, ConfigError> {
    load_with_flags(file, env, sets, &[])
}

/// `load`, with typed command-line `flags` as the top layer.
pub fn load_with_flags(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
    flags: &[Flag],
) -> Result<Resolved, ConfigError> {
    load_layers(file, env, sets, flags, Origin::Experiment)
}

/// `load_with_flags` for a run directory's `config.toml` (resume, eval, env): the run's
/// resolved config is the truth for that run, so the `config.json` of its `model.init_from` is
/// not read again (issue 58, defect 13: a run started from a Hugging Face directory could no
/// longer be resumed, exported or sampled once that directory's config.json changed).
pub fn load_run(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
    flags: &[Flag],
) -> Result<Resolved, ConfigError> {
    load_layers(file, env, sets, flags, Origin::Run)
}

/// What kind of file a config is loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// An experiment file: a Hugging Face `model.init_from`'s config.json is a layer.
    Experiment,
    /// A run directory's resolved `config.toml`: complete, nothing read beside it.
    Run,
}

fn load_layers(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
    flags: &[Flag],
    origin: Origin,
) -> Result<Resolved, ConfigError> {
    let mut errors: Vec<ConfigError> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    // `--set KEY=` unsets a key some layer sets (a misspelt key would unset nothing, silently)
    if sets.iter().any(|s| super::strategy::unset_key(s).is_some()) {
        let kept: Vec<String> = sets
            .iter()
            .filter(|s| super::strategy::unset_key(s).is_none())
            .cloned()
            .collect();
        let probe = build_figment_without(file, env, &kept, flags, &[], origin)?;
        super::strategy::check_unsets(&probe, sets)?;
    }
    let left_out = match origin {
        Origin::Run => super::strategy::left_out(
            &build_figment_without(file, env, sets, flags, &[], origin)?,
            file,
        ),
        Origin::Experiment => Vec::new(),
    };
    let outcome = loop {
        let without: Vec<String> = left_out.iter().chain(&dropped).cloned().collect();
        let figment = build_figment_without(file, env, sets, flags, &without, origin)?;
        // (error, whether the checks after it stand on their own)
        let result = match extract(&figment) {
            // a value that does not parse (wrong type, unknown key or choice): set aside, the
            // others are judged as they are
            Err(e) => Err((e, true)),
            Ok(config) => {
                let resolved = Resolved {
                    config,
                    figment,
                    file: file.to_path_buf(),
                    left_out: left_out.clone(),
                };
                // a value out of its own range is independent of the rest; anything else (a
                // missing file, two keys that disagree) would only cascade when set aside
                validate(&resolved).map(|()| resolved).map_err(|e| {
                    let alone = matches!(&e, ConfigError::Key(k) if k.kind == KeyErrorKind::Range);
                    (e, alone)
                })
            }
        };
        match result {
            Ok(r) => break Ok(r),
            Err((e, alone)) => {
                let key = e.key().map(str::to_string);
                // the same key again (setting it aside did not help: it is said already), or a
                // problem that may only follow from a key set aside
                if key.as_ref().is_some_and(|k| dropped.contains(k))
                    || (!alone && !dropped.is_empty())
                {
                    break Err(());
                }
                errors.push(e);
                match key {
                    Some(k) if alone && errors.len() < 20 => dropped.push(k),
                    _ => break Err(()),
                }
            }
        }
    };
    match (outcome, errors.len()) {
        (Ok(r), 0) => Ok(r),
        (_, 1) => Err(errors.remove(0)),
        _ => Err(ConfigError::Many(errors)),
    }
}

/// Builds the layered figment without extracting it.
pub fn build_figment(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
) -> Result<Figment, ConfigError> {
    build_figment_without(file, env, sets, &[], &[], Origin::Experiment)
}

/// `build_figment` for a run directory's `config.toml` (see `load_run`).
pub fn build_run_figment(file: &Path) -> Result<Figment, ConfigError> {
    build_figment_without(file, &[], &[], &[], &[], Origin::Run)
}

/// `build_figment` with the dotted keys `drop` left out of every layer above the defaults (so
/// they take their defaults): after an error about a key, the rest of the config can still be
/// checked, and every error reported at once. The layers, lowest first: defaults, the files
/// (an `extends` chain), `KILN_*` variables, the launcher's variables (torchrun, Slurm), what
/// a bare `srun` step implies, torchrun's one device per process, `--set`, typed flags, and
/// under all of those the `config.json` of a Hugging Face directory in `model.init_from`.
fn build_figment_without(
    file: &Path,
    env: &[(String, String)],
    sets: &[String],
    flags: &[Flag],
    drop: &[String],
    origin: Origin,
) -> Result<Figment, ConfigError> {
    // `--set KEY=`: left out of every layer
    let unset: Vec<String> = sets
        .iter()
        .filter_map(|s| super::strategy::unset_key(s))
        .collect();
    let sets: Vec<String> = sets
        .iter()
        .filter(|s| super::strategy::unset_key(s).is_none())
        .cloned()
        .collect();
    let drop: Vec<String> = drop.iter().chain(&unset).cloned().collect();
    let mut stack = Stack {
        figment: Figment::new().merge(Layer {
            meta: Metadata::named(DEFAULT_SOURCE),
            dict: to_dict(&Config::default()),
        }),
        drop: &drop,
    };
    stack.files(file)?;
    stack.kiln_env(env);
    let var = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    stack.launcher(&var);
    if bare_srun(&var) {
        stack.bare_srun(&var);
    }
    stack.torchrun_devices(&var);
    stack.sets(&sets)?;
    stack.flags(flags);
    if let Some((meta, dict)) = super::backend::omp_threads(&stack.figment, &var) {
        stack.push(meta, dict);
    }
    // a Hugging Face directory in `model.init_from`: its config.json under every key no layer
    // above the defaults sets (an experiment's: a run's config.toml has them all already)
    let hf = match origin {
        Origin::Experiment => super::hf_json::layers(&stack.figment)?,
        Origin::Run => Vec::new(),
    };
    for (meta, dict) in hf {
        stack.push(meta, dict);
    }
    Ok(stack.figment)
}

/// The figment being built, and the keys left out of every layer (`build_figment_without`).
pub(super) struct Stack<'a> {
    pub(super) figment: Figment,
    pub(super) drop: &'a [String],
}

impl Stack<'_> {
    pub(super) fn push(&mut self, meta: Metadata, dict: Dict) {
        let figment = std::mem::take(&mut self.figment);
        self.figment = merge_without(figment, self.drop, Layer { meta, dict });
    }

    /// The experiment file and the files it extends, most extended first.
    fn files(&mut self, file: &Path) -> Result<(), ConfigError> {
        let mut files = Vec::new();
        collect_files(file, &mut Vec::new(), &mut files)?;
        // a file's `[sweep] grid` replaces the grid of the files it extends: a grid is one
        // search, and merging two would silently multiply the trials
        let has_grid =
            |d: &Dict| matches!(d.get("sweep"), Some(Value::Dict(_, s)) if s.contains_key("grid"));
        if let Some(last) = files.iter().rposition(|(_, d)| has_grid(d)) {
            for (_, dict) in &mut files[..last] {
                if let Some(Value::Dict(_, sweep)) = dict.get_mut("sweep") {
                    sweep.remove("grid");
                }
            }
        }
        for (path, dict) in files {
            self.push(
                Metadata::from(path.display().to_string(), Source::File(path)),
                dict,
            );
        }
        Ok(())
    }

    /// `KILN_<SECTION>__<KEY>` variables.
    fn kiln_env(&mut self, env: &[(String, String)]) {
        for (name, value) in env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            let parts: Vec<String> = rest.split("__").map(|s| s.to_ascii_lowercase()).collect();
            // Other KILN_ variables (tokens, library paths) are not config keys.
            if parts.len() < 2 || !SECTIONS.contains(&parts[0].as_str()) {
                continue;
            }
            self.push(
                Metadata::named(format!("environment variable {name}")),
                nest(&parts, parse_value(value)),
            );
        }
    }

    /// Typed flags (`--nnodes 2`), each named as its source.
    fn flags(&mut self, flags: &[Flag]) {
        for f in flags {
            let parts: Vec<String> = f.key.split('.').map(str::to_string).collect();
            let value = match &f.value {
                FlagValue::Int(v) => Value::from(*v),
                FlagValue::Str(v) => Value::from(v.clone()),
            };
            self.push(
                Metadata::named(format!("flag {}", f.flag)),
                nest(&parts, value),
            );
        }
    }

    /// `--set key=value`, in order.
    fn sets(&mut self, sets: &[String]) -> Result<(), ConfigError> {
        for arg in sets {
            let (key, value) = arg.split_once('=').ok_or_else(|| ConfigError::BadSet {
                arg: arg.clone(),
                why: "missing `=`".into(),
            })?;
            let key = key.trim();
            if key.is_empty() || key.split('.').any(|p| p.is_empty()) {
                return Err(ConfigError::BadSet {
                    arg: arg.clone(),
                    why: format!("`{key}` is not a dotted key"),
                });
            }
            let parts: Vec<String> = key.split('.').map(str::to_string).collect();
            self.push(
                Metadata::named(format!("--set {arg}")),
                nest(&parts, parse_value(value.trim())),
            );
        }
        Ok(())
    }
}

/// Parses a value as TOML (`0.1`, `true`, `[1, 2]`, `"x"`), else takes it as a plain string.
pub(super) fn parse_value(raw: &str) -> Value {
    match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t
            .remove("v")
            .and_then(|v| Value::serialize(v).ok())
            .unwrap_or_else(|| Value::from(raw.to_string())),
        Err(_) => Value::from(raw.to_string()),
    }
}

pub(super) fn nest(parts: &[String], leaf: Value) -> Dict {
    let mut value = leaf;
    for p in parts[1..].iter().rev() {
        let mut d = Dict::new();
        d.insert(p.clone(), value);
        value = Value::from(d);
    }
    let mut d = Dict::new();
    d.insert(parts[0].clone(), value);
    d
}

/// Depth-first over `extends`: ancestors come before the file that names them.
fn collect_files(
    file: &Path,
    stack: &mut Vec<PathBuf>,
    out: &mut Vec<(PathBuf, Dict)>,
) -> Result<(), ConfigError> {
    let canon = file.canonicalize().map_err(|source| ConfigError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    if let Some(pos) = stack.iter().position(|p| *p == canon) {
        let mut chain: Vec<PathBuf> = stack[pos..].to_vec();
        chain.push(canon);
        return Err(ConfigError::ExtendsCycle { chain });
    }
    // an experiment file is a small regular file: never read a FIFO, a device or a huge file
    let meta = std::fs::metadata(&canon).map_err(|source| ConfigError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    const MAX_CONFIG: u64 = 4 << 20;
    if !meta.is_file() || meta.len() > MAX_CONFIG {
        return Err(ConfigError::Io {
            path: file.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                if meta.is_file() {
                    format!(
                        "{} bytes: an experiment file is at most {MAX_CONFIG} bytes",
                        meta.len()
                    )
                } else {
                    "not a regular file".to_string()
                },
            ),
        });
    }
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Io {
        path: file.to_path_buf(),
        source,
    })?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: file.to_path_buf(),
        message: parse_message(&text, &e),
    })?;
    stack.push(canon);
    if let Some(ext) = table.remove("extends") {
        let list = match ext {
            toml::Value::Array(a) => a,
            toml::Value::String(s) => vec![toml::Value::String(s)],
            _ => {
                return Err(ConfigError::ExtendsType {
                    path: file.to_path_buf(),
                })
            }
        };
        let base = file.parent().unwrap_or(Path::new("."));
        for item in list {
            let toml::Value::String(rel) = item else {
                return Err(ConfigError::ExtendsType {
                    path: file.to_path_buf(),
                });
            };
            collect_files(&normalize(&base.join(rel)), stack, out)?;
        }
    }
    stack.pop();
    out.push((file.to_path_buf(), to_dict(&table)));
    Ok(())
}

/// Removes `.` and `name/..` pairs without touching the file system, for readable sources.
fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out: Vec<Component> = Vec::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.last(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    if out.is_empty() {
        PathBuf::from(".")
    } else {
        out.iter().collect()
    }
}

/// Merges `layer` without the dotted keys `drop`.
fn merge_without(figment: Figment, drop: &[String], mut layer: Layer) -> Figment {
    for key in drop {
        remove_dotted(&mut layer.dict, key);
    }
    figment.merge(layer)
}

fn remove_dotted(dict: &mut Dict, key: &str) {
    match key.split_once('.') {
        None => {
            dict.remove(key);
        }
        Some((head, rest)) => {
            if let Some(Value::Dict(_, d)) = dict.get_mut(head) {
                remove_dotted(d, rest);
            }
        }
    }
}
