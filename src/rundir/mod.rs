//! Layer: rundir (above train, backend and error; below track, launch and everything that reads
//! runs).
//!
//! Where a run lives: choosing `<output_dir>/<name>` (or the next free `-N`), finding the newest
//! unfinished run, its lock, the config as stored in a run directory, atomic files and output
//! paths that are never inside a run; what a run's files say (`summary` written, `files` read
//! back typed) and what produced each session (`record`, `env.json`).

mod files;
pub mod inputs;
pub mod record;
pub mod summary;

pub use files::{MetricsFile, SummaryFile};
pub use summary::Summary;

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checkpoint::CheckpointDir;
use crate::config::{self, Config, Resolved};
use crate::error::{Error, Result};

/// Whether `p` is a directory with nothing in it but (perhaps) a run lock file.
pub fn is_empty_dir(p: &Path) -> bool {
    empty_but_lock(p)
}

/// `<output_dir>/<name>`, or the next free `<name>-2`, `<name>-3`, ... when it holds a run.
pub fn choose_run_dir(output_dir: &Path, name: &str) -> PathBuf {
    let free = |p: &Path| !p.exists() || is_empty_dir(p);
    let base = output_dir.join(name);
    if free(&base) {
        return base;
    }
    (2..)
        .map(|i| output_dir.join(format!("{name}-{i}")))
        .find(|p| free(p))
        .unwrap_or(base)
}

/// Whether a run directory holds a run that did not finish.
pub fn is_unfinished(dir: &Path) -> bool {
    if !dir.join("config.toml").is_file() {
        return false;
    }
    SummaryFile::read(dir).is_none_or(|s| s.status != "finished")
}

/// The newest unfinished run of experiment `name` (highest `-N` suffix first).
pub fn newest_unfinished(output_dir: &Path, name: &str) -> Option<PathBuf> {
    let mut candidates: Vec<(usize, PathBuf)> = fs::read_dir(output_dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let idx = if n == name {
                Some(1)
            } else {
                n.strip_prefix(&format!("{name}-"))
                    .and_then(|s| s.parse::<usize>().ok())
            };
            idx.map(|i| (i, e.path()))
        })
        .filter(|(_, p)| is_unfinished(p))
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, p)| p)
}

pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| {
        Error::io(
            format!("serialising {}", path.display()),
            std::io::Error::other(e),
        )
    })?;
    // a failed write (a full disk) names the file meant
    replace_file(path, (text + "\n").as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Replaces `path` with `bytes` through a temporary file beside it, fsynced and renamed, so
/// `path` is the previous file or the whole new one, never a part. A failed write (a full disk)
/// leaves no temporary file behind.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    replace_file_with(path, |f| f.write_all(bytes))
}

/// `replace_file` with the contents written by `write` (a copy from another file, streamed).
pub fn replace_file_with(
    path: &Path,
    write: impl FnOnce(&mut fs::File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    // a stale temporary file (or a link planted under its name) is removed, never written
    // through: `create_new` does not follow links
    let _ = fs::remove_file(&tmp);
    let written = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| write(&mut f).and_then(|_| f.sync_all()))
        .and_then(|_| fs::rename(&tmp, path))
        .and_then(|_| fs::File::open(&dir).and_then(|d| d.sync_all()));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The config as stored in a run directory: data paths made absolute, so the run directory can
/// be resumed from anywhere.
pub fn stored_config(r: &Resolved) -> Config {
    stored_config_with(r, std::env::vars())
}

/// `stored_config` for a job that runs elsewhere (a Slurm submission): the NCCL variables of
/// this (login) node's environment are not the job's, so none are recorded.
pub fn stored_config_for_elsewhere(r: &Resolved) -> Config {
    stored_config_with(r, std::iter::empty())
}

/// `stored_config`, with the process environment `env`.
fn stored_config_with(r: &Resolved, env: impl IntoIterator<Item = (String, String)>) -> Config {
    // input files by their absolute paths: the run directory resumes from anywhere, and
    // `kiln sample` and `eval` find its tokenizer.json (issue 45, defect 14)
    let mut c = r.canonical();
    // no secret in a file: a tracking server's password stays with the session (issue 58,
    // defect 9)
    c.log.mlflow = c.log.mlflow.as_ref().map(|m| m.stored());
    // threads from `OMP_NUM_THREADS` are this session's (a resume elsewhere shares its cores)
    if config::describe_source(&r.figment, "backend.threads") == config::OMP_SOURCE {
        c.backend.threads = 0;
    }
    // a CUDA run records the NCCL variables of its environment too: its config.toml then
    // reproduces the environment NCCL saw
    if c.backend.device.has_nccl() {
        c.backend.nccl = c.backend.nccl.with_environment(env);
    }
    c
}

/// `run_dir/config.toml`, or an error saying `run_dir` is not a run directory.
pub fn run_config_file(run_dir: &Path) -> Result<PathBuf> {
    let file = run_dir.join("config.toml");
    if !file.is_file() {
        return Err(Error::Usage(format!(
            "`{}` is not a kiln run directory (no config.toml); pass the directory `kiln run` printed",
            run_dir.display()
        )));
    }
    Ok(file)
}

/// The config of the run in `run_dir` as stored, without the checks a run makes of its data
/// files (exporting or sampling never reads the data, which may have moved since).
pub fn run_config(run_dir: &Path) -> Result<Resolved> {
    let file = run_config_file(run_dir)?;
    let figment = config::build_run_figment(&file)?;
    Ok(Resolved {
        config: config::extract(&figment)?,
        figment,
        file,
        left_out: Vec::new(),
    })
}

/// The checkpoint store of a run directory (`checkpoint.dir` of its `config.toml`).
pub fn checkpoint_store(run_dir: &Path) -> Result<CheckpointDir> {
    let cfg = run_dir.join("config.toml");
    let text = std::fs::read_to_string(&cfg).map_err(|_| {
        Error::Usage(format!(
            "`{}` is not a kiln run directory (no config.toml)",
            run_dir.display()
        ))
    })?;
    let dir = toml::from_str::<toml::Table>(&text)
        .ok()
        .and_then(|t| {
            t.get("checkpoint")?
                .get("dir")?
                .as_str()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "checkpoints".into());
    // a hand-edited config.toml must not send a reader (or retention) outside the run
    let outside = || {
        Error::Usage(format!(
            "`{}`: `checkpoint.dir` = {dir:?} is not a directory inside the run directory\n  = help: give a relative path without `..` (the run's checkpoints are where it saved them, e.g. \"checkpoints\")",
            cfg.display()
        ))
    };
    if !config::checkpoint_dir_inside(&dir) {
        return Err(outside());
    }
    // (a `checkpoints/` that is a link, to a scratch disk say, is read through; a run never
    // writes through it: `refuse_links`)
    Ok(CheckpointDir::new(run_dir.join(dir)))
}

/// The run (or sweep) directory `dir` lies in, if any: the nearest of `dir` and its ancestors
/// that holds a run's `config.toml` with its lock, metrics or summary, or a sweep's
/// `sweep.json` with its ledger.
pub fn enclosing_run(dir: &Path) -> Option<PathBuf> {
    let dir = dir.canonicalize().ok()?;
    dir.ancestors()
        .find(|a| {
            let has = |n: &str| a.join(n).exists();
            // every run directory kiln made has its lock file
            (has("config.toml") && has(LOCK_FILE) && (has("metrics.jsonl") || has("summary.json")))
                || (has("sweep.json") && has("sweep.jsonl"))
        })
        .map(Path::to_path_buf)
}

/// Refuses an output file (`-o`) inside a run or sweep directory, whose files it could
/// replace (`kiln report RUN -o RUN/metrics.jsonl`); `allowed` is the one file there a command
/// writes by design (`kiln report RUN`'s `RUN/report.html`).
pub fn refuse_inside_run(path: &Path, flag: &str, allowed: Option<&Path>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(run) = enclosing_run(&dir) else {
        return Ok(());
    };
    let canonical = |p: &Path| -> Option<PathBuf> {
        let parent = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Some(parent.canonicalize().ok()?.join(p.file_name()?))
    };
    if allowed.is_some_and(|a| canonical(a).is_some() && canonical(a) == canonical(path)) {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{flag} `{}` is inside the run directory `{}`, whose files kiln does not write over\n  = help: write it outside the run directory",
        path.display(),
        run.display()
    )))
}

/// The name of a run directory's lock file (held with `flock` while a kiln process uses it).
pub const LOCK_FILE: &str = ".kiln.lock";

/// A run directory this process holds: its `.kiln.lock` locked (`flock`), so that no other kiln
/// process runs in it while the guard lives. Dropping the guard lets go (another process, such
/// as the Slurm job of a submission, may take the directory then), and so does the end of the
/// process, however it ends. Whoever runs in a directory owns its guard: a session takes it
/// once, before its first check of the directory, and nothing locks a directory twice.
#[must_use = "the directory is held only while its RunLock lives"]
pub struct RunLock {
    dir: PathBuf,
    _file: fs::File,
}

impl RunLock {
    /// The directory held.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl std::fmt::Debug for RunLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RunLock({})", self.dir.display())
    }
}

/// `opts` opening `path` without following a symbolic link in its last component (a link
/// there is `ELOOP`): kiln never writes through a link inside a run directory, where a planted
/// `.kiln.lock -> ~/.ssh/authorized_keys` would otherwise be truncated.
pub fn open_no_follow(opts: &mut fs::OpenOptions, path: &Path) -> std::io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    opts.custom_flags(libc::O_NOFOLLOW).open(path)
}

/// The error for a symbolic link where kiln writes in a run directory (exit 2).
pub fn link_refused(path: &Path) -> Error {
    Error::Usage(format!(
        "`{}` is a symbolic link; kiln does not write through links inside a run directory\n  = help: replace it with the file or directory itself (or remove it), then run again",
        path.display()
    ))
}

/// An error opening `path` for writing: a link (`ELOOP` under `O_NOFOLLOW`) is refused with
/// exit 2 naming it, anything else is an I/O error saying what was being done.
pub fn open_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        link_refused(path)
    } else {
        Error::io(format!("{what} {}", path.display()), e)
    }
}

/// The names in a run directory that kiln writes or replaces (files and directories): none may
/// be a symbolic link. `checkpoint_dir` is the run's `checkpoint.dir`, relative to `dir`.
pub fn refuse_links(dir: &Path, checkpoint_dir: &str) -> Result<()> {
    let is_link = |p: &Path| {
        fs::symlink_metadata(p)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
    };
    let mut paths: Vec<PathBuf> = [
        LOCK_FILE,
        "config.toml",
        "metrics.jsonl",
        "summary.json",
        "env.json",
        "logs",
        "evals",
        "trace",
        "tb",
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect();
    // the checkpoint directory and each directory on the way to it
    let mut at = dir.to_path_buf();
    for part in Path::new(checkpoint_dir).components() {
        at.push(part);
        paths.push(at.clone());
    }
    for sub in ["logs", "evals", "trace", "tb"] {
        if let Ok(rd) = fs::read_dir(dir.join(sub)) {
            if !is_link(&dir.join(sub)) {
                paths.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
    }
    match paths.iter().find(|p| is_link(p)) {
        Some(p) => Err(link_refused(p)),
        None => Ok(()),
    }
}

/// Tries to lock `dir` (which exists): `Ok(None)` when another process holds it. `patient`:
/// a few tries over 50 ms first (a directory named by the user, which another process's
/// `holder` may be probing); a new run's claim takes the next name at once instead (a holder
/// that let go meanwhile may have filled the directory).
fn try_lock(dir: &Path, patient: bool) -> std::io::Result<Option<fs::File>> {
    use std::io::{Seek, Write};
    use std::os::unix::io::AsRawFd;
    let mut f = open_no_follow(
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false),
        &dir.join(LOCK_FILE),
    )?;
    // SAFETY: flock on a descriptor this function owns.
    let lock = || unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    // another process's `holder` takes the lock for a moment to see whether it is held: a few
    // tries over 50 ms ride over that probe (issue 45: it could refuse a free directory)
    let mut tries = 0;
    while lock() != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) && patient && tries < 10 {
            tries += 1;
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        }
        return match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => Ok(None),
            // file systems without flock (Lustre without -o flock, some NFS): run unlocked
            Some(libc::ENOSYS | libc::ENOLCK | libc::EOPNOTSUPP) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    crate::ui::note(&format!(
                        "warning: {} does not support file locks ({e}); kiln cannot keep a second process out of this run directory",
                        dir.display()
                    ))
                });
                Ok(Some(f))
            }
            _ => Err(e),
        };
    }
    // the pid in one write of a fixed width over the old one: a reader sees a whole pid, never
    // an empty or half-written file (issue 45: `holder` could read "" between the two)
    f.rewind()?;
    f.write_all(format!("{:<20}", std::process::id()).as_bytes())?;
    f.set_len(20)?;
    Ok(Some(f))
}

/// Holds `dir` (created when missing) while the returned guard lives, so that no other kiln
/// process runs in it at the same time; exit 2 naming the holder's pid when one does.
pub fn lock_run_dir(dir: &Path) -> Result<RunLock> {
    fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating run directory {}", dir.display()), e))?;
    match try_lock(dir, true).map_err(|e| open_error("locking", &dir.join(LOCK_FILE), e))? {
        Some(f) => Ok(RunLock {
            dir: dir.to_path_buf(),
            _file: f,
        }),
        None => {
            let pid = read_pid(dir);
            Err(Error::Usage(format!(
                "run directory `{}` is in use by another kiln process (pid {}); wait for it to finish or stop it",
                dir.display(),
                pid.trim()
            )))
        }
    }
}

/// The pid of another process that holds `dir`'s lock, if one does (the lock file is only
/// read, never created).
pub fn holder(dir: &Path) -> Option<String> {
    use std::os::unix::io::AsRawFd;
    let f = open_no_follow(fs::OpenOptions::new().read(true), &dir.join(LOCK_FILE)).ok()?;
    // SAFETY: flock on a descriptor this function owns; a lock taken here is released when `f`
    // is dropped below.
    let busy = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK);
    busy.then(|| read_pid(dir))
}

/// The pid a lock file holds (never read through a link, and at most a few bytes of it).
fn read_pid(dir: &Path) -> String {
    use std::io::Read as _;
    let mut text = String::new();
    if let Ok(f) = open_no_follow(fs::OpenOptions::new().read(true), &dir.join(LOCK_FILE)) {
        let _ = f.take(32).read_to_string(&mut text);
    }
    let pid = text.trim();
    if pid.bytes().all(|b| b.is_ascii_digit()) {
        pid.to_string()
    } else {
        "unknown".into()
    }
}

/// Whether `dir` holds nothing but (perhaps) a lock file.
fn empty_but_lock(dir: &Path) -> bool {
    fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok()).all(|e| e.file_name() == LOCK_FILE))
        .unwrap_or(false)
}

/// The outermost of `dir` and its ancestors that does not exist yet (what creating `dir`
/// creates), if any.
pub fn first_missing(dir: &Path) -> Option<PathBuf> {
    dir.ancestors()
        .take_while(|a| !a.as_os_str().is_empty() && !a.exists())
        .last()
        .map(Path::to_path_buf)
}

/// After bad input: removes `dir` when it holds nothing but its lock, and the directories up to
/// `root` that creating it made (a run refused before it wrote anything leaves nothing).
pub fn release_unused(dir: &Path, root: Option<&Path>) {
    if !empty_but_lock(dir) {
        return;
    }
    let _ = fs::remove_file(dir.join(LOCK_FILE));
    let Some(root) = root else {
        return;
    };
    for a in dir.ancestors() {
        if fs::remove_dir(a).is_err() || a == root {
            break;
        }
    }
}

/// Creates and locks a new run directory: `<output_dir>/<name>`, or the next free
/// `<name>-2`, ... Race-free: a directory is taken by creating it (or, when it exists empty, by
/// locking it), never by checking first; one created by another process that has not locked
/// it yet is left to that process. Returns the directory's guard and the outermost directory
/// this call created (for `release_unused`).
pub fn claim_run_dir(output_dir: &Path, name: &str) -> Result<(RunLock, Option<PathBuf>)> {
    let made_output = first_missing(output_dir);
    fs::create_dir_all(output_dir)
        .map_err(|e| Error::io(format!("creating {}", output_dir.display()), e))?;
    for i in 1usize.. {
        let p = if i == 1 {
            output_dir.join(name)
        } else {
            output_dir.join(format!("{name}-{i}"))
        };
        match fs::create_dir(&p) {
            Ok(()) => {
                match try_lock(&p, false)
                    .map_err(|e| open_error("locking", &p.join(LOCK_FILE), e))?
                {
                    // (still empty: no process that took it first ran in it and let go)
                    Some(f) if empty_but_lock(&p) => {
                        let made = made_output.or(Some(p.clone()));
                        return Ok((RunLock { dir: p, _file: f }, made));
                    }
                    // taken (empty) by another process between our create and our lock
                    _ => continue,
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if !p.is_dir() || !empty_but_lock(&p) {
                    continue;
                }
                match try_lock(&p, false) {
                    // still empty once it is ours: nobody else claimed it first
                    Ok(Some(f)) if empty_but_lock(&p) => {
                        return Ok((RunLock { dir: p, _file: f }, made_output));
                    }
                    _ => continue,
                }
            }
            Err(e) => {
                return Err(Error::io(
                    format!("creating run directory {}", p.display()),
                    e,
                ))
            }
        }
    }
    unreachable!("the run directory candidates are unbounded")
}

/// Where an output file of `flag` goes: its directory must exist, and the path must not be a
/// directory, a symlink or a special file (it is replaced by a new regular file). Returns the
/// canonical directory joined with the file name.
pub fn output_path(path: &Path, flag: &str) -> Result<PathBuf> {
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
    refuse_inside_run(path, flag, None)?;
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
    replace_file(path, bytes).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19: a CUDA run's config.toml holds its `[backend.nccl]` and the NCCL variables of
    /// the environment it ran in, so resuming it (which reads config.toml) exports them again.
    #[test]
    fn a_cuda_runs_record_reproduces_its_nccl_environment() {
        let d = crate::testdir::tempdir().unwrap();
        let file = d.path().join("x.toml");
        std::fs::write(
            &file,
            "[backend]\ndevice = \"cuda\"\n[backend.nccl]\nalgo = \"Ring\"\n",
        )
        .unwrap();
        let r = crate::config::load(&file, &[], &[]).unwrap();
        let env = [
            ("NCCL_ALGO", "Tree"),
            ("NCCL_IB_HCA", "mlx5"),
            ("HOME", "/h"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()));
        let text = crate::config::to_toml(&stored_config_with(&r, env.clone()));
        let again = d.path().join("config.toml");
        std::fs::write(&again, &text).unwrap();
        let back = crate::config::load(&again, &[], &[]).unwrap();
        let vars: Vec<(String, String)> = back
            .config
            .backend
            .nccl
            .vars()
            .into_iter()
            .map(|(v, x, _)| (v, x))
            .collect();
        let want = [("NCCL_ALGO", "Ring"), ("NCCL_IB_HCA", "mlx5")]
            .map(|(a, b)| (a.to_string(), b.to_string()));
        assert_eq!(vars, want.to_vec(), "{text}");
        // a CPU run records no NCCL variables (it never loads NCCL)
        let mut cpu = r;
        cpu.config.backend.device = crate::config::Device::Cpu;
        assert_eq!(
            stored_config_with(&cpu, env).backend.nccl.vars().len(),
            1,
            "only the section's own"
        );
    }
}
