//! The environment on record: what produced a run (kiln's build, Burn, rustc, the OS, CPU,
//! memory, GPUs and their driver, CUDA, NVRTC and NCCL, wgpu adapters, host, process, command
//! line, the experiment file's sha256 and the `NCCL_*` / `KILN_*` variables in effect), as
//! `env.json` in every run directory (one entry per session: a resume appends) and as
//! `kiln env --json` for this machine. Papers and bug reports need exactly that.

use std::path::Path;

use serde_json::{json, Value};

use crate::config::Resolved;
use crate::error::Result;

/// kiln's build: version, git commit, features, Burn and rustc (from `build.rs`).
pub fn build() -> Value {
    let mut features = Vec::new();
    if cfg!(feature = "cuda") {
        features.push("cuda");
    }
    if cfg!(feature = "wgpu") {
        features.push("wgpu");
    }
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "git_commit": env!("KILN_GIT_COMMIT"),
        "features": features,
        "burn": env!("KILN_BURN_VERSION"),
        "rustc": env!("KILN_RUSTC"),
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
    })
}

/// The first `key: value` of a `/proc` file whose key is `key`.
fn proc_field(file: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// This host's name.
pub fn hostname() -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we read up to the first NUL only.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) } == 0;
    if !ok {
        return "unknown".into();
    }
    let end = host.iter().position(|b| *b == 0).unwrap_or(host.len());
    String::from_utf8_lossy(&host[..end]).into_owned()
}

/// The machine: OS, CPU, cores, memory, host.
pub fn machine() -> Value {
    let os_release = std::fs::read_to_string("/etc/os-release").ok();
    let pretty = os_release.as_deref().and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|v| v.trim_matches('"').to_string())
    });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string());
    let memory = proc_field("/proc/meminfo", "MemTotal").and_then(|v| {
        v.trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
            .map(|kb| kb * 1024)
    });
    // x86's name, else what other architectures call it
    let cpu_model = ["model name", "Model", "cpu model", "Processor", "cpu"]
        .iter()
        .find_map(|k| proc_field("/proc/cpuinfo", k))
        .unwrap_or_else(|| "unknown".into());
    json!({
        "os": {
            "name": std::env::consts::OS,
            "arch": std::env::consts::ARCH,
            "release": pretty,
            "kernel": kernel,
        },
        "cpu": {
            "model": cpu_model,
            "cores": crate::backend::cores(),
        },
        "memory_bytes": memory,
        "host": hostname(),
    })
}

/// The GPUs and their software: driver, CUDA, NVRTC, NCCL (a CUDA build), wgpu adapters (a
/// wgpu build); `null` where the build has no such backend.
pub fn accelerators() -> Value {
    json!({ "cuda": cuda(), "wgpu": wgpu() })
}

#[cfg(feature = "cuda")]
fn cuda() -> Value {
    use crate::cuda as c;
    let gpus: Vec<Value> = c::gpus()
        .into_iter()
        .enumerate()
        .map(|(i, (name, mem))| json!({ "ordinal": i, "name": name, "memory_bytes": mem }))
        .collect();
    json!({
        "bindings": "CUDA 13.0",
        "driver_cuda": c::driver_version().map(|(a, b)| format!("{a}.{b}")),
        "gpus": gpus,
        "nvrtc": c::nvrtc_version().map(|(a, b)| format!("{a}.{b}")),
        "nccl": c::nccl_version(),
        "visible_devices": std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    })
}

#[cfg(not(feature = "cuda"))]
fn cuda() -> Value {
    Value::Null
}

#[cfg(feature = "wgpu")]
fn wgpu() -> Value {
    let adapters: Vec<String> = crate::backend::wgpu_adapters::list()
        .iter()
        .map(|a| a.to_string())
        .collect();
    json!({ "adapters": adapters })
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() -> Value {
    Value::Null
}

/// Whether a variable's value is a secret (a job token), recorded as set but not shown.
fn secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    n.contains("TOKEN") || n.contains("SECRET") || n.contains("PASSWORD") || n.contains("KEY")
}

/// The `NCCL_*` and `KILN_*` variables of this process (a secret's value as `<set>`).
pub fn variables() -> Value {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("KILN_"))
        .map(|(k, v)| {
            let v = if secret(&k) { "<set>".to_string() } else { v };
            (k, v)
        })
        .collect();
    vars.sort();
    Value::Object(
        vars.into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect(),
    )
}

/// The sha256 of a file, in hex.
fn sha256(path: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).ok()?;
    Some(
        Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// Everything about this process and machine, for the experiment `r` when there is one: what
/// `kiln env --json` prints and one session of `env.json`.
pub fn record(r: Option<&Resolved>) -> Value {
    let mut v = json!({
        "time": crate::ui::rfc3339(std::time::SystemTime::now()),
        "kiln": build(),
        "machine": machine(),
        "accelerators": accelerators(),
        "pid": std::process::id(),
        "command_line": std::env::args().collect::<Vec<_>>(),
        "working_directory": std::env::current_dir().ok().map(|d| d.display().to_string()),
        "variables": variables(),
    });
    if let Some(r) = r {
        let c = &r.config;
        v["experiment"] = json!({
            "file": r.file.canonicalize().unwrap_or(r.file.clone()).display().to_string(),
            "sha256": sha256(&r.file),
            "config_hash": crate::config::config_hash(c),
        });
        v["backend"] = json!({
            "device": crate::config::choice_name(&c.backend.device),
            "precision": crate::config::choice_name(&c.backend.precision),
            "strategy": crate::config::choice_name(&c.strategy.kind),
            "devices": c.strategy.devices.count(),
            "nodes": c.launch.nnodes,
            "node_rank": c.launch.node_rank,
        });
    }
    v
}

/// Appends this session's record to `run_dir/env.json` (`{"sessions": [...]}`), replacing the
/// file whole (a session that cannot read an old file starts a new list, keeping the old one
/// beside it as `env.json.unreadable`).
pub fn append_session(run_dir: &Path, r: &Resolved, backend: &str) -> Result<()> {
    let path = run_dir.join("env.json");
    let mut sessions = match std::fs::read(&path) {
        Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
            Ok(v) if v["sessions"].is_array() => {
                v["sessions"].as_array().cloned().unwrap_or_default()
            }
            _ => {
                let _ = std::fs::rename(&path, run_dir.join("env.json.unreadable"));
                Vec::new()
            }
        },
        Err(_) => Vec::new(),
    };
    let mut session = record(Some(r));
    session["backend"]["name"] = Value::String(backend.to_string());
    sessions.push(session);
    super::write_json(&path, &json!({ "sessions": sessions }))
}
