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
    let cpu_model = cpu_model();
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

/// The CPU's model name: x86's, else what other architectures call it ("unknown" without
/// `/proc/cpuinfo`).
pub fn cpu_model() -> String {
    ["model name", "Model", "cpu model", "Processor", "cpu"]
        .iter()
        .find_map(|k| proc_field("/proc/cpuinfo", k))
        .unwrap_or_else(|| "unknown".into())
}

/// The GPUs and their software: driver, CUDA, NVRTC, NCCL (a CUDA build), wgpu adapters (a
/// wgpu build, when `wgpu_too`: the probe makes Vulkan's loader print to stderr where there is
/// no display session, so a run off wgpu does not probe: issue 45, defect 27); `null` where
/// the build has no such backend or it was not probed.
pub fn accelerators(wgpu_too: bool) -> Value {
    json!({ "cuda": cuda(), "wgpu": if wgpu_too { wgpu() } else { Value::Null } })
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

/// kiln's own variables whose values `env.json` shows (none is a secret).
const SHOWN: [&str; 11] = [
    "KILN_WORKER_RUN_DIR",
    "KILN_WORKER_ROUND",
    "KILN_NCCL_SHIM",
    "KILN_NCCL_LIBRARY",
    "KILN_CUDA_PATH_FROM",
    "KILN_CUDA_REEXEC",
    "KILN_CUDA_ENV",
    "KILN_CACHE_DIR",
    "KILN_STORE_FD",
    "KILN_GIT_COMMIT",
    "KILN_RUSTC",
];

/// Whether `env.json` shows a variable's value, or records it as set (`<set>`) only. Masked by
/// default: shown are NCCL's settings, kiln's own variables above and the config's
/// `KILN_<SECTION>__<KEY>` overrides, unless the name has a word of a secret in it (`TOKEN`,
/// `SECRET`, `PASS` (`PASSWORD`, `PASSWD`), `KEY`, `AUTH`, `CRED`, `PRIVATE`, `CERT`,
/// `SESSION`, `COOKIE`).
fn shown(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    // by `_`-separated word: `KILN_DATA__TOKENIZER` is no token, `KILN_PASSWD` a password
    let secret = n.split('_').any(|w| {
        ["TOKEN", "KEY", "KEYS", "APIKEY"].contains(&w)
            || [
                "PASS", "SECRET", "AUTH", "CRED", "PRIVATE", "CERT", "SESSION", "COOKIE",
            ]
            .iter()
            .any(|p| w.starts_with(p))
    });
    let known = n.starts_with("NCCL_")
        || SHOWN.contains(&n.as_str())
        || (n.starts_with("KILN_") && n.contains("__"));
    known && !secret
}

/// The `NCCL_*` and `KILN_*` variables of this process (the value of one not `shown` as
/// `<set>`).
pub fn variables() -> Value {
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("NCCL_") || k.starts_with("KILN_"))
        .map(|(k, v)| {
            let v = if shown(&k) {
                crate::config::redact(&v)
            } else {
                "<set>".to_string()
            };
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
pub fn record(r: Option<&Resolved>, probe_all: bool) -> Value {
    let mut v = json!({
        "time": crate::ui::rfc3339(std::time::SystemTime::now()),
        "kiln": build(),
        "machine": machine(),
        // `kiln env` probes every backend; a run only its own
        "accelerators": accelerators(
            probe_all || r.is_some_and(|r| r.config.backend.device == crate::config::Device::Wgpu)
        ),
        "pid": std::process::id(),
        "command_line": std::env::args().map(|a| crate::config::redact(&a)).collect::<Vec<_>>(),
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
    let mut session = record(Some(r), false);
    session["backend"]["name"] = Value::String(backend.to_string());
    sessions.push(session);
    super::write_json(&path, &json!({ "sessions": sessions }))
}

#[cfg(test)]
mod tests {
    use super::shown;

    /// Issue 45, defect 26: a variable is masked unless it is known not to be a secret.
    #[test]
    fn env_json_masks_every_variable_it_does_not_know_to_be_safe() {
        for name in [
            "KILN_JOB_TOKEN",
            "KILN_PASSWD",
            "KILN_PASS",
            "KILN_AUTH",
            "KILN_CREDENTIALS",
            "KILN_PRIVATE",
            "KILN_API_KEY",
            "KILN_SOMETHING_NEW",
            "KILN_DB__PASSWORD",
            "KILN_MLFLOW__AUTH_HEADER",
        ] {
            assert!(!shown(name), "{name} is shown");
        }
        for name in [
            "NCCL_DEBUG",
            "NCCL_SOCKET_IFNAME",
            "KILN_OPTIM__LR",
            "KILN_LAUNCH__TOKEN_FILE_DIR",
            "KILN_DATA__TOKENIZER",
            "KILN_DATA__TOKENS",
            "KILN_STORE_FD",
            "KILN_WORKER_ROUND",
        ] {
            let want = !name.contains("TOKEN_");
            assert_eq!(shown(name), want, "{name}");
        }
    }
}
