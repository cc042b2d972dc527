//! Where a run lives: choosing `<output_dir>/<name>` (or the next free `-N`), finding the newest
//! unfinished run, the config as stored in a run directory, and atomic JSON files.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::checkpoint::Store;
use crate::config::{self, Config, Resolved};
use crate::error::{Error, Result};

pub fn is_empty_dir(p: &Path) -> bool {
    fs::read_dir(p)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
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
    let status = fs::read_to_string(dir.join("summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["status"].as_str().map(str::to_string));
    status.as_deref() != Some("finished")
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
    let tmp = path.with_extension("json.tmp");
    fs::write(&tmp, text + "\n").map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// The config as stored in a run directory: data paths made absolute, so the run directory can
/// be resumed from anywhere.
pub fn stored_config(r: &Resolved) -> Config {
    let mut c = r.config.clone();
    let abs = |key: &str, v: &str| {
        let p = r.path_of(key, v);
        p.canonicalize().unwrap_or(p).display().to_string()
    };
    let d = &mut c.data;
    for (key, value) in [
        ("data.path", &mut d.path),
        ("data.eval_path", &mut d.eval_path),
        ("data.labels_path", &mut d.labels_path),
        ("data.eval_labels_path", &mut d.eval_labels_path),
    ] {
        *value = value.as_deref().map(|v| abs(key, v));
    }
    c.model.init_from = c
        .model
        .init_from
        .as_deref()
        .map(|v| abs("model.init_from", v));
    c
}

/// The config of the run in `run_dir` as stored, without the checks a run makes of its data
/// files (exporting or sampling never reads the data, which may have moved since).
pub fn run_config(run_dir: &Path) -> Result<Resolved> {
    let file = run_dir.join("config.toml");
    if !file.is_file() {
        return Err(Error::Usage(format!(
            "`{}` is not a kiln run directory (no config.toml); pass the directory `kiln run` printed",
            run_dir.display()
        )));
    }
    let figment = config::build_figment(&file, &[], &[])?;
    Ok(Resolved {
        config: config::extract(&figment)?,
        figment,
        file,
    })
}

/// The checkpoint store of a run directory (`checkpoint.dir` of its `config.toml`).
pub fn checkpoint_store(run_dir: &Path) -> Result<Store> {
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
    Ok(Store::new(run_dir.join(dir)))
}
