//! The checkpoint directory: the crash-safe write protocol, verification, listing, retention and
//! loading (with resharding to whole tensors).
//!
//! Write protocol: files go into `step-N.tmp/` and are fsynced; then `state.json`, then
//! `MANIFEST.json` (size and sha256 of every file), fsync; `step-N.tmp/` is renamed to `step-N/`
//! and the parent directory fsynced. A crash at any moment leaves either the previous set or the
//! new one: a `.tmp` directory or a `step-N/` whose manifest does not verify is never resumed from.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::format::{placements, Layout, Manifest, ManifestEntry, OptState, State, Whole, FORMAT};
use super::retention;
use super::tensors::{self, TensorFile};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O on `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint `{path}` is invalid: {why}\n  = help: `kiln ckpt list RUN_DIR` shows every checkpoint; resume from an older one with `--from step-N`")]
    Invalid { path: PathBuf, why: String },
    /// A background save (`checkpoint.async`) that could not finish.
    #[error("checkpoint `{path}` was not saved: {why}\n  = help: the newest saved checkpoint is intact; `kiln resume` continues from it")]
    Unsaved { path: PathBuf, why: String },
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What `list` found for one step directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub step: u64,
    pub path: PathBuf,
    pub bytes: u64,
    /// `Ok` when the manifest verifies, else why not.
    pub status: Result<(), String>,
}

/// Everything a resume needs, with tensors made whole.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub state: State,
    pub params: Vec<f32>,
    pub opt: OptState,
}

/// A run's checkpoint directory: its `step-N` checkpoints, written, listed, kept (keep-k, keep-best)
/// and read (not the rendezvous store of `rendezvous::store`).
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    pub dir: PathBuf,
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(io(dir))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn sha256_file(path: &Path) -> Result<(u64, String), std::io::Error> {
    let bytes = fs::read(path)?;
    Ok((bytes.len() as u64, sha256_hex(&bytes)))
}

impl CheckpointDir {
    pub fn new(dir: PathBuf) -> Self {
        CheckpointDir { dir }
    }

    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}"))
    }

    pub(super) fn tmp_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}.tmp"))
    }

    /// Starts checkpoint `step` (rank 0): a fresh `step-N.tmp/`.
    pub fn begin(&self, step: u64) -> Result<(), CheckpointError> {
        fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let tmp = self.tmp_dir(step);
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp))?;
        }
        fs::create_dir(&tmp).map_err(io(&tmp))
    }

    /// Writes and fsyncs one file of checkpoint `step` (any rank, after `begin`).
    pub fn write_file(&self, step: u64, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let path = self.tmp_dir(step).join(name);
        let mut f = File::create(&path).map_err(io(&path))?;
        f.write_all(bytes).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))
    }

    /// Finishes checkpoint `step` (rank 0, after every rank wrote its files): state, manifest,
    /// rename, fsync. Then applies retention.
    pub fn commit(
        &self,
        step: u64,
        state: &State,
        keep_last: usize,
        keep_every: u64,
    ) -> Result<(), CheckpointError> {
        let tmp = self.tmp_dir(step);
        let state_json =
            serde_json::to_vec_pretty(state).map_err(|e| CheckpointError::Invalid {
                path: tmp.clone(),
                why: e.to_string(),
            })?;
        self.write_file(step, "state.json", &state_json)?;
        let mut names: Vec<String> = fs::read_dir(&tmp)
            .map_err(io(&tmp))?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        // hashed in parallel: the checksums are most of a commit's time
        let files = names
            .into_par_iter()
            .map(|name| {
                let p = tmp.join(&name);
                let (size, sha256) = sha256_file(&p).map_err(io(&p))?;
                Ok(ManifestEntry { name, size, sha256 })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let manifest = serde_json::to_vec_pretty(&Manifest { files }).map_err(|e| {
            CheckpointError::Invalid {
                path: tmp.clone(),
                why: e.to_string(),
            }
        })?;
        self.write_file(step, "MANIFEST.json", &manifest)?;
        sync_dir(&tmp)?;
        let fin = self.step_dir(step);
        if fin.exists() {
            // an older save of the same step (e.g. before a resume): replace it
            remove_checkpoint(&fin)?;
        }
        fs::rename(&tmp, &fin).map_err(io(&fin))?;
        sync_dir(&self.dir)?;
        // the best checkpoint so far is never retention's to delete
        let best = state.best.as_ref().map(|b| b.best_step as u64);
        self.retain(keep_last, keep_every, best)
    }

    /// Deletes what the retention policy says, among complete checkpoints whose manifests
    /// verify only (never a directory kiln did not write, whatever its name), and never step
    /// `keep` (the best checkpoint).
    pub fn retain(
        &self,
        keep_last: usize,
        keep_every: u64,
        keep: Option<u64>,
    ) -> Result<(), CheckpointError> {
        let steps: Vec<u64> = self
            .list()?
            .into_iter()
            .filter(|e| !e.path.to_string_lossy().ends_with(".tmp") && e.status.is_ok())
            .map(|e| e.step)
            .collect();
        for step in retention::to_delete(&steps, keep_last, keep_every)
            .into_iter()
            .filter(|s| Some(*s) != keep)
        {
            remove_checkpoint(&self.step_dir(step))?;
        }
        Ok(())
    }

    /// Removes unfinished `.tmp` directories left by a crash (and a file under such a name).
    pub fn clean_tmp(&self) -> Result<(), CheckpointError> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Ok(());
        };
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            // and what a deletion interrupted by a crash left (`remove_checkpoint`)
            if !step_of(&name).is_some_and(|(tmp, _)| tmp) && !name.starts_with(".deleting-") {
                continue;
            }
            let p = e.path();
            let is_dir = fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir());
            let removed = if is_dir {
                fs::remove_dir_all(&p)
            } else {
                fs::remove_file(&p)
            };
            removed.map_err(|e| CheckpointError::Io {
                path: p.clone(),
                source: std::io::Error::new(
                    e.kind(),
                    format!("cannot remove this unfinished checkpoint ({e}); remove it yourself: it is what an interrupted save left"),
                ),
            })?;
        }
        Ok(())
    }

    /// Whether a save or a deletion is under way (or was interrupted): a `step-N.tmp` or a
    /// `.deleting-` entry is there.
    pub fn is_changing(&self) -> bool {
        fs::read_dir(&self.dir).is_ok_and(|rd| {
            rd.filter_map(|e| e.ok()).any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with(".deleting-") || step_of(&n).is_some_and(|(tmp, _)| tmp)
            })
        })
    }

    /// Entries named `step-...` that are not checkpoints kiln reads: a name other than `step-`
    /// and exactly 8 digits (and perhaps `.tmp`), or not a directory. `list` skips them; the
    /// caller says so.
    pub fn strays(&self) -> Vec<PathBuf> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                // an unfinished `.tmp` is `clean_tmp`'s
                name.starts_with("step-")
                    && !step_of(&name).is_some_and(|(tmp, _)| tmp)
                    && (step_of(&name).is_none()
                        || !fs::symlink_metadata(e.path()).is_ok_and(|m| m.is_dir()))
            })
            .map(|e| e.path())
            .collect();
        out.sort();
        out
    }

    /// Every step directory (finished or `.tmp`), newest first, each verified.
    pub fn list(&self) -> Result<Vec<Entry>, CheckpointError> {
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for e in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let e = e.map_err(io(&self.dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            // `step-` and exactly 8 digits, a directory (not a link): anything else is not
            // kiln's (`strays` names them)
            let Some((tmp, step)) = step_of(&name) else {
                continue;
            };
            let path = e.path();
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            let bytes = fs::read_dir(&path)
                .map(|d| {
                    d.filter_map(|f| f.ok()?.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            let status = if tmp {
                Err("unfinished (.tmp): the save was interrupted".to_string())
            } else {
                verify(&path)
            };
            out.push(Entry {
                step,
                path,
                bytes,
                status,
            });
        }
        out.sort_by(|a, b| b.step.cmp(&a.step).then(a.path.cmp(&b.path)));
        Ok(out)
    }
}

/// `(unfinished, step)` of a checkpoint directory's name: `step-` and exactly 8 ASCII digits,
/// perhaps followed by `.tmp`; `None` for any other name (`step-+3`, `step-3`, `step-00000003x`).
pub fn step_of(name: &str) -> Option<(bool, u64)> {
    let rest = name.strip_prefix("step-")?;
    let (num, tmp) = match rest.strip_suffix(".tmp") {
        Some(n) => (n, true),
        None => (rest, false),
    };
    if num.len() != 8 || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((tmp, num.parse().ok()?))
}

/// Removes a checkpoint directory: renamed aside first (`.deleting-step-N`), so a reader never
/// finds a half-deleted checkpoint under its name.
fn remove_checkpoint(p: &Path) -> Result<(), CheckpointError> {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let aside = p.with_file_name(format!(".deleting-{name}-{}", std::process::id()));
    match fs::rename(p, &aside) {
        Ok(()) => fs::remove_dir_all(&aside).map_err(io(&aside)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => fs::remove_dir_all(p).map_err(io(p)),
    }
}

/// Checks a step directory against its manifest: every file present, of the listed size and
/// sha256, and nothing essential missing.
pub fn verify(dir: &Path) -> Result<(), String> {
    verify_read(dir, |_| false)?;
    // the manifest holds; `state.json`'s fields must too
    read_state(dir).map(|_| ()).map_err(|e| match e {
        CheckpointError::Invalid { why, .. } => why,
        other => other.to_string(),
    })
}

/// `verify`, keeping the bytes of the files that `keep` names (read once, checked, returned).
/// Files are read and hashed in parallel.
fn verify_read(
    dir: &Path,
    keep: impl Fn(&str) -> bool + Sync,
) -> Result<HashMap<String, Vec<u8>>, String> {
    let text =
        fs::read(dir.join("MANIFEST.json")).map_err(|_| "missing MANIFEST.json".to_string())?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| format!("MANIFEST.json does not parse: {e}"))?;
    if !manifest.files.iter().any(|f| f.name == "state.json") {
        return Err("the manifest does not list state.json".into());
    }
    let kept = manifest
        .files
        .par_iter()
        .map(|f| {
            if f.name.is_empty() || f.name.contains(['/', '\\']) || f.name == ".." || f.name == "."
            {
                return Err(format!(
                    "MANIFEST.json lists `{}`, which is not a file of this directory",
                    f.name
                ));
            }
            let path = dir.join(&f.name);
            // never read a pipe or a device, nor a file of another size than listed
            match fs::metadata(&path) {
                Err(_) => return Err(format!("missing file {}", f.name)),
                Ok(m) if !m.is_file() => return Err(format!("{} is not a regular file", f.name)),
                Ok(m) if m.len() != f.size => {
                    return Err(format!(
                        "{}: size {} bytes, manifest says {}",
                        f.name,
                        m.len(),
                        f.size
                    ))
                }
                Ok(_) => {}
            }
            let bytes = fs::read(&path).map_err(|_| format!("missing file {}", f.name))?;
            let (size, sha) = (bytes.len() as u64, sha256_hex(&bytes));
            if size != f.size {
                return Err(format!(
                    "{}: size {size} bytes, manifest says {}",
                    f.name, f.size
                ));
            }
            if sha != f.sha256 {
                return Err(format!("{}: checksum mismatch", f.name));
            }
            Ok(keep(&f.name).then(|| (f.name.clone(), bytes)))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(kept.into_iter().flatten().collect())
}

fn read(dir: &Path, name: &str) -> Result<Vec<u8>, CheckpointError> {
    let p = dir.join(name);
    fs::read(&p).map_err(io(&p))
}

fn invalid(dir: &Path, why: String) -> CheckpointError {
    CheckpointError::Invalid {
        path: dir.to_path_buf(),
        why,
    }
}

/// The most ranks a checkpoint may say wrote it (a `world_size` past it is not a run's).
pub const MAX_WORLD: usize = 1 << 20;

/// `state.json`'s fields against each other, the layout and the directory's name: what no
/// run writes is refused (a step other than the directory's, a world of a billion ranks, an
/// unknown strategy), before a resume, an evaluation or an export acts on it. Positions that
/// need the data (a cursor past the samples) are the run's to check (`check_position`).
fn check_state(dir: &Path, s: &State) -> Result<(), String> {
    const MAX: usize = 1 << 30;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if s.step == 0 {
        return Err("`step` = 0, but a checkpoint is saved after a step".into());
    }
    if let Some((_, n)) = step_of(&name) {
        if n != s.step as u64 {
            return Err(format!(
                "`step` = {} but the directory is {name}: the two must agree",
                s.step
            ));
        }
    }
    if !(1..=MAX_WORLD).contains(&s.world_size) {
        return Err(format!(
            "`world_size` = {} is not a number of ranks (1 to {MAX_WORLD})",
            s.world_size
        ));
    }
    const STRATEGIES: [&str; 4] = ["single", "dp", "ddp", "fsdp"];
    if !STRATEGIES.contains(&s.strategy.as_str()) {
        return Err(format!(
            "`strategy` = {:?} is not one of {}",
            s.strategy,
            STRATEGIES.join(", ")
        ));
    }
    if s.strategy == "single" && s.world_size != 1 {
        return Err(format!(
            "`strategy` = \"single\" with `world_size` = {}",
            s.world_size
        ));
    }
    // (HSDP: sharded over each group of `world` ranks, a divisor of the world size)
    if let super::Layout::Sharded { world, .. } = &s.params {
        if *world == 0 || !s.world_size.is_multiple_of(*world) || s.strategy != "fsdp" {
            return Err(format!(
                "the parameters are sharded over {world} ranks, but `world_size` = {} and `strategy` = {:?}",
                s.world_size, s.strategy
            ));
        }
    }
    for (key, v) in [
        ("micro_batch", s.micro_batch),
        ("grad_accum_steps", s.grad_accum_steps),
    ] {
        if !(1..=MAX).contains(&v) {
            return Err(format!("`{key}` = {v} is out of range (1 to {MAX})"));
        }
    }
    // a checkpoint is saved between steps, where no micro-batch of the next is accumulated
    if s.accum_position != 0 {
        return Err(format!(
            "`accum_position` = {}, but a checkpoint is saved between steps (at 0)",
            s.accum_position
        ));
    }
    if s.optimizer.steps > s.step as u64 || s.scheduler.last_step > s.step {
        return Err(format!(
            "`optimizer.steps` = {} and `scheduler.last_step` = {} cannot pass `step` = {}",
            s.optimizer.steps, s.scheduler.last_step, s.step
        ));
    }
    // each micro-batch ends one epoch at most, and a step has at most MAX micro-batches (a
    // resume may have changed the accumulation since: the bound is the largest there is)
    let most = (s.step as u64).saturating_mul(MAX as u64).saturating_add(1);
    if s.position.epoch > most {
        return Err(format!(
            "`position.epoch` = {} is more epochs than {} steps could pass",
            s.position.epoch, s.step
        ));
    }
    for (key, w) in [("best", &s.best), ("early_stopping", &s.early_stopping)] {
        if let Some(w) = w {
            if w.best_step > s.step || !w.best.is_finite() {
                return Err(format!(
                    "`{key}` ({} = {} at step {}) is not of a step up to {}",
                    w.metric, w.best, w.best_step, s.step
                ));
            }
        }
    }
    Ok(())
}

/// Reads `state.json`, refusing a checkpoint of another format with the version that wrote it.
pub fn read_state(dir: &Path) -> Result<State, CheckpointError> {
    let bytes = read(dir, "state.json")?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| invalid(dir, format!("state.json: {e}")))?;
    let format = value.get("format").and_then(|f| f.as_str());
    if format != Some(FORMAT) {
        let by = value
            .get("kiln_version")
            .and_then(|v| v.as_str())
            .unwrap_or("an unknown version");
        let what = match format {
            None => "kiln's old binary format (KILNF32/KILNOPT)".to_string(),
            Some(f) => format!("format `{f}`"),
        };
        return Err(invalid(
            dir,
            format!(
                "written by kiln {by} in {what}; this kiln {} reads `{FORMAT}` checkpoints \
                 only\n  = help: export the weights with the kiln that wrote it (or start the \
                 run again); to continue from them, set model.init_from to the export",
                env!("CARGO_PKG_VERSION")
            ),
        ));
    }
    let state: State =
        serde_json::from_value(value).map_err(|e| invalid(dir, format!("state.json: {e}")))?;
    check_state(dir, &state).map_err(|why| invalid(dir, format!("state.json: {why}")))?;
    if let Some(ls) = &state.loss_scale {
        if !(ls.scale > 0.0 && ls.scale <= f64::from(f32::MAX)) {
            return Err(invalid(
                dir,
                format!(
                    "state.json: `loss_scale.scale` = {} is not a loss scale (a positive number within f32's range)",
                    ls.scale
                ),
            ));
        }
    }
    Ok(state)
}

/// Loads a verified step directory of a model whose parameters are `specs` (name and shape, in
/// flat order), reassembling sharded parameters and optimizer state into whole buffers (so any
/// world size and strategy can take its part).
pub fn load(dir: &Path, specs: &[(String, Vec<usize>)]) -> Result<Loaded, CheckpointError> {
    let mut files =
        verify_read(dir, |name| name.ends_with(".safetensors")).map_err(|why| invalid(dir, why))?;
    let state = read_state(dir)?;
    let n: usize = specs.iter().map(|(_, s)| s.iter().product::<usize>()).sum();
    if state.num_params != n {
        return Err(invalid(
            dir,
            format!(
                "it holds {} parameters, the model has {n}",
                state.num_params
            ),
        ));
    }
    let ranks = ranks_of(dir, &state.params, n, files.len())?;
    let names: Vec<String> = (0..ranks)
        .flat_map(|r| [state.params.model_file(r), state.params.optim_file(r)])
        .collect();
    let bytes: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|name| match files.remove(name) {
            Some(b) => Ok((name.clone(), b)),
            None => Err(invalid(
                dir,
                format!("{name} is missing (not in the manifest)"),
            )),
        })
        .collect::<Result<_, _>>()?;
    let mut decoded = bytes
        .par_iter()
        .map(|(name, b)| tensors::decode(b).map_err(|e| invalid(dir, format!("{name}: {e}"))))
        .collect::<Result<Vec<TensorFile>, _>>()?
        .into_iter();
    let frozen = state.frozen_params;
    if frozen > n {
        return Err(invalid(
            dir,
            format!(
                "state.json: `frozen_params` = {frozen} is more than the model's {n} parameters"
            ),
        ));
    }
    let mut whole = Whole::new(n, n - frozen);
    for r in 0..ranks {
        let (mname, oname) = (state.params.model_file(r), state.params.optim_file(r));
        let (Some(model), Some(optim)) = (decoded.next(), decoded.next()) else {
            break;
        };
        whole
            .read(
                &model,
                &optim,
                &placements(&state.params, r, specs, 0),
                &placements(&state.params, r, specs, frozen),
            )
            .map_err(|e| invalid(dir, format!("{mname}/{oname}: {e}")))?;
    }
    let (params, opt) = whole.finish().map_err(|e| invalid(dir, e))?;
    // no run saves a weight that is not finite (a diverged step is never applied)
    all_finite(dir, specs, &params)?;
    // the state the checkpoint's optimizer keeps must all be there
    let kind = state.optimizer.kind.as_str();
    let adam = kind.starts_with("adam");
    let lacks = if adam && opt.steps > 0 && (opt.m.is_empty() || opt.v.is_empty()) {
        Some("exp_avg.* and exp_avg_sq.* (Adam's moments)")
    } else if !adam && !opt.v.is_empty() {
        Some("only momentum_buffer.* (it holds exp_avg_sq.*)")
    } else {
        None
    };
    if let Some(what) = lacks {
        return Err(invalid(
            dir,
            format!(
                "the optimizer is {kind} after {} steps, but {} should hold {what}",
                opt.steps,
                state.params.optim_file(0)
            ),
        ));
    }
    Ok(Loaded { state, params, opt })
}

/// How many ranks' files hold the parameters of `layout`: 1 when whole; when sharded, its
/// units must tile the model's `n` parameters in order, each split as fsdp splits it, with a
/// model and an optimizer file per rank among the manifest's `files`.
fn ranks_of(dir: &Path, layout: &Layout, n: usize, files: usize) -> Result<usize, CheckpointError> {
    Ok(match layout {
        Layout::Full => 1,
        Layout::Sharded { world, units } => {
            // units must tile the model in order, each split as fsdp splits it
            let mut end = 0usize;
            for u in units {
                let split = (*world > 0).then(|| u.len.div_ceil(*world));
                if u.start != end || split != Some(u.shard_len) {
                    return Err(invalid(
                        dir,
                        format!(
                            "state.json: shard unit `{}` (start {}, len {}, shard_len {}) does not follow the previous unit (ending at {end}) split over {world} ranks",
                            u.name, u.start, u.len, u.shard_len
                        ),
                    ));
                }
                end = end
                    .checked_add(u.len)
                    .ok_or_else(|| invalid(dir, "state.json: shard units overflow".into()))?;
            }
            if end != n {
                return Err(invalid(
                    dir,
                    format!("state.json: shard units cover {end} parameters, the model has {n}"),
                ));
            }
            if world.saturating_mul(2) > files {
                return Err(invalid(
                    dir,
                    format!(
                        "state.json says {world} ranks, the manifest lists {} safetensors files",
                        files
                    ),
                ));
            }
            *world
        }
    })
}

/// An error naming the first parameter (by `specs`' names) that holds a value that is not
/// finite.
fn all_finite(
    dir: &Path,
    specs: &[(String, Vec<usize>)],
    params: &[f32],
) -> Result<(), CheckpointError> {
    for (what, values) in [("parameter", params)] {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            let mut at = i;
            let name = specs
                .iter()
                .find(|(_, shape)| {
                    let n: usize = shape.iter().product();
                    if at < n {
                        true
                    } else {
                        at -= n;
                        false
                    }
                })
                .map_or("?", |(n, _)| n.as_str());
            return Err(invalid(
                dir,
                format!(
                    "{what} `{name}` holds {} (element {at}); a checkpoint's values are finite",
                    values[i]
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::ShardUnit;
    use crate::checkpoint::{encode_files, DataPosition, OptimizerInfo, RngState, SchedulerInfo};

    fn state(n: usize, params: Layout) -> State {
        State {
            format: FORMAT.into(),
            step: 1,
            position: DataPosition {
                epoch: 0,
                cursor: 0,
                segment_start: 0,
                segment_micro: 0,
            },
            accum_position: 0,
            rng: RngState {
                init_seed: 0,
                dropout_seed: 0,
                sampler_seed: 0,
                data_seed: 0,
            },
            world_size: 3,
            strategy: "fsdp".into(),
            micro_batch: 1,
            grad_accum_steps: 1,
            num_params: n,
            frozen_params: 0,
            input_shape: vec![2],
            params,
            optimizer: OptimizerInfo {
                kind: "adamw".into(),
                steps: 1,
            },
            scheduler: SchedulerInfo {
                kind: "constant".into(),
                last_step: 1,
                last_lr: 0.1,
            },
            last_loss: 0.0,
            config_hash: String::new(),
            kiln_version: "test".into(),
            early_stopping: None,
            best: None,
            loss_scale: None,
            documents: None,
        }
    }

    /// Rank `r`'s part of every unit of `layout` in the whole buffer `b`.
    fn part(layout: &Layout, r: usize, b: &[f32]) -> Vec<f32> {
        let Layout::Sharded { units, .. } = layout else {
            return b.to_vec();
        };
        units
            .iter()
            .flat_map(|u| {
                let own = u.owned(r);
                b[u.start + own.start..u.start + own.end].to_vec()
            })
            .collect()
    }

    /// Two parameters (2x2 and 3) in one unit of 7 over 3 ranks (3, 3, 1) and one of 2 (rank 2
    /// owns none of it), saved sharded and whole: both load back to the same buffers.
    #[test]
    fn shards_and_whole_models_load_back_whole() {
        let specs = vec![
            ("a.weight".to_string(), vec![2, 2]),
            ("a.bias".to_string(), vec![3]),
            ("b.bias".to_string(), vec![2]),
        ];
        let params: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let opt = OptState {
            steps: 4,
            m: params.iter().map(|x| x * 10.0).collect(),
            v: params.iter().map(|x| x * 100.0).collect(),
        };
        let d = crate::testdir::tempdir().unwrap();
        let store = CheckpointDir::new(d.path().to_path_buf());
        let units = vec![
            ShardUnit {
                name: "a".into(),
                start: 0,
                len: 7,
                shard_len: 3,
            },
            ShardUnit {
                name: "b".into(),
                start: 7,
                len: 2,
                shard_len: 1,
            },
        ];
        let sharded = Layout::Sharded { world: 3, units };
        // every rank's shard saved as checkpoint `step` (rank `no_moments` without its moments)
        let save_sharded = |step: u64, no_moments: Option<usize>| {
            store.begin(step).unwrap();
            for r in 0..3 {
                let part = |b: &[f32]| part(&sharded, r, b);
                let o = if no_moments == Some(r) {
                    OptState {
                        steps: 4,
                        ..OptState::default()
                    }
                } else {
                    OptState {
                        steps: 4,
                        m: part(&opt.m),
                        v: part(&opt.v),
                    }
                };
                for (name, bytes) in
                    encode_files(&sharded, r, &specs, 0, &part(&params), &o).unwrap()
                {
                    store.write_file(step, &name, &bytes).unwrap();
                }
            }
            store
                .commit(
                    step,
                    &State {
                        step: step as usize,
                        ..state(9, sharded.clone())
                    },
                    5,
                    0,
                )
                .unwrap();
        };
        save_sharded(1, None);
        let l = load(&store.step_dir(1), &specs).unwrap();
        assert_eq!(
            (l.params.clone(), l.opt.clone()),
            (params.clone(), opt.clone())
        );

        store.begin(2).unwrap();
        for (name, bytes) in encode_files(&Layout::Full, 0, &specs, 0, &params, &opt).unwrap() {
            store.write_file(2, &name, &bytes).unwrap();
        }
        store
            .commit(
                2,
                &State {
                    step: 2,
                    ..state(9, Layout::Full)
                },
                5,
                0,
            )
            .unwrap();
        let w = load(&store.step_dir(2), &specs).unwrap();
        assert_eq!((w.params, w.opt), (params.clone(), opt.clone()));

        // a model of other names is refused, naming the tensors
        let other = vec![("z".to_string(), vec![9])];
        let e = load(&store.step_dir(2), &other).unwrap_err().to_string();
        assert!(e.contains("none of the model's tensors"), "{e}");

        // one rank without its Adam moments: refused, not zeros
        save_sharded(3, Some(1));
        let e = load(&store.step_dir(3), &specs).unwrap_err().to_string();
        assert!(e.contains("is in 2 of the 3 ranks' files"), "{e}");
    }
}
