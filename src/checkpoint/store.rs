//! The checkpoint directory: the crash-safe write protocol, verification, listing, retention and
//! loading (with resharding to whole tensors).
//!
//! Write protocol: files go into `step-N.tmp/` and are fsynced; then `state.json`, then
//! `MANIFEST.json` (size and sha256 of every file), fsync; `step-N.tmp/` is renamed to `step-N/`
//! and the parent directory fsynced. A crash at any moment leaves either the previous set or the
//! new one: a `.tmp` directory or a `step-N/` whose manifest does not verify is never resumed from.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::format::{decode_f32, decode_opt, Layout, Manifest, ManifestEntry, OptState, State};
use super::retention;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint I/O on `{path}`: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint `{path}` is invalid: {why}")]
    Invalid { path: PathBuf, why: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
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

#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|f| f.sync_all()).map_err(io(dir))
}

fn sha256_file(path: &Path) -> Result<(u64, String), std::io::Error> {
    let bytes = fs::read(path)?;
    let digest = Sha256::digest(&bytes);
    Ok((
        bytes.len() as u64,
        digest.iter().map(|b| format!("{b:02x}")).collect(),
    ))
}

impl Store {
    pub fn new(dir: PathBuf) -> Self {
        Store { dir }
    }

    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.dir.join(format!("step-{step:08}"))
    }

    fn tmp_dir(&self, step: u64) -> PathBuf {
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
        let mut files = Vec::new();
        for name in names {
            let p = tmp.join(&name);
            let (size, sha256) = sha256_file(&p).map_err(io(&p))?;
            files.push(ManifestEntry { name, size, sha256 });
        }
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
            fs::remove_dir_all(&fin).map_err(io(&fin))?;
        }
        fs::rename(&tmp, &fin).map_err(io(&fin))?;
        sync_dir(&self.dir)?;
        self.retain(keep_last, keep_every)
    }

    /// Deletes what the retention policy says, among complete checkpoints only.
    pub fn retain(&self, keep_last: usize, keep_every: u64) -> Result<(), CheckpointError> {
        let steps: Vec<u64> = self
            .list()?
            .into_iter()
            .filter(|e| !e.path.to_string_lossy().ends_with(".tmp"))
            .map(|e| e.step)
            .collect();
        for step in retention::to_delete(&steps, keep_last, keep_every) {
            let p = self.step_dir(step);
            fs::remove_dir_all(&p).map_err(io(&p))?;
        }
        Ok(())
    }

    /// Removes unfinished `.tmp` directories left by a crash.
    pub fn clean_tmp(&self) -> Result<(), CheckpointError> {
        for e in self.list()? {
            if e.path.to_string_lossy().ends_with(".tmp") {
                fs::remove_dir_all(&e.path).map_err(io(&e.path))?;
            }
        }
        Ok(())
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
            let Some(rest) = name.strip_prefix("step-") else {
                continue;
            };
            let (num, tmp) = match rest.strip_suffix(".tmp") {
                Some(n) => (n, true),
                None => (rest, false),
            };
            let Ok(step) = num.parse::<u64>() else {
                continue;
            };
            let path = e.path();
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

/// Checks a step directory against its manifest: every file present, of the listed size and
/// sha256, and nothing essential missing.
pub fn verify(dir: &Path) -> Result<(), String> {
    let text =
        fs::read(dir.join("MANIFEST.json")).map_err(|_| "missing MANIFEST.json".to_string())?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|e| format!("MANIFEST.json does not parse: {e}"))?;
    if !manifest.files.iter().any(|f| f.name == "state.json") {
        return Err("the manifest does not list state.json".into());
    }
    for f in &manifest.files {
        let p = dir.join(&f.name);
        let (size, sha) = sha256_file(&p).map_err(|_| format!("missing file {}", f.name))?;
        if size != f.size {
            return Err(format!(
                "{}: size {size} bytes, manifest says {}",
                f.name, f.size
            ));
        }
        if sha != f.sha256 {
            return Err(format!("{}: checksum mismatch", f.name));
        }
    }
    Ok(())
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

/// Loads a verified step directory, reassembling sharded parameters and optimizer state into
/// whole buffers (so any world size and strategy can take its part).
pub fn load(dir: &Path) -> Result<Loaded, CheckpointError> {
    verify(dir).map_err(|why| invalid(dir, why))?;
    let state: State = serde_json::from_slice(&read(dir, "state.json")?)
        .map_err(|e| invalid(dir, format!("state.json: {e}")))?;
    let n = state.num_params;
    let (params, opt) = match &state.params {
        Layout::Full => {
            let params = decode_f32(&read(dir, "model.bin")?)
                .map_err(|e| invalid(dir, format!("model.bin: {e}")))?;
            let opt = decode_opt(&read(dir, "optim.bin")?)
                .map_err(|e| invalid(dir, format!("optim.bin: {e}")))?;
            (params, opt)
        }
        Layout::Sharded { world, units } => {
            let mut params = vec![0f32; n];
            let mut opt = OptState::default();
            let total_shard: usize = units.iter().map(|u| u[2]).sum();
            for r in 0..*world {
                let name = format!("model-rank-{r}.bin");
                let shard = decode_f32(&read(dir, &name)?)
                    .map_err(|e| invalid(dir, format!("{name}: {e}")))?;
                let name = format!("optim-rank-{r}.bin");
                let o = decode_opt(&read(dir, &name)?)
                    .map_err(|e| invalid(dir, format!("{name}: {e}")))?;
                if shard.len() != total_shard {
                    return Err(invalid(
                        dir,
                        format!(
                            "model-rank-{r}.bin has {} values, expected {total_shard}",
                            shard.len()
                        ),
                    ));
                }
                opt.steps = o.steps;
                let has_m = !o.m.is_empty();
                let has_v = !o.v.is_empty();
                if r == 0 {
                    opt.m = if has_m { vec![0f32; n] } else { Vec::new() };
                    opt.v = if has_v { vec![0f32; n] } else { Vec::new() };
                }
                let mut off = 0;
                for &[start, len, shard_len] in units {
                    let lo = (r * shard_len).min(len);
                    let hi = ((r + 1) * shard_len).min(len);
                    let take = hi - lo;
                    params[start + lo..start + hi].copy_from_slice(&shard[off..off + take]);
                    if has_m && o.m.len() == total_shard && opt.m.len() == n {
                        opt.m[start + lo..start + hi].copy_from_slice(&o.m[off..off + take]);
                    }
                    if has_v && o.v.len() == total_shard && opt.v.len() == n {
                        opt.v[start + lo..start + hi].copy_from_slice(&o.v[off..off + take]);
                    }
                    off += shard_len;
                }
            }
            (params, opt)
        }
    };
    if params.len() != n {
        return Err(invalid(
            dir,
            format!("{} parameters, state.json says {n}", params.len()),
        ));
    }
    Ok(Loaded { state, params, opt })
}
