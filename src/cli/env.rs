//! `kiln env`: what kiln can run on here, and what to fix when something is missing. Always
//! exits 0.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::rendezvous::nccl_env;

#[derive(Debug, Args)]
pub struct EnvArgs {
    /// An experiment file, or a run directory (its `config.toml`): also show the NCCL variables
    /// a run of it exports, and where each comes from.
    pub file: Option<PathBuf>,
    /// Override a key of FILE, as for `kiln run`.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "file")]
    pub sets: Vec<String>,
    /// Print the record a run keeps in its `env.json` for this machine (and FILE), as JSON:
    /// kiln's build, Burn, rustc, OS, CPU, memory, GPUs, driver, CUDA, NVRTC, NCCL, adapters,
    /// host, command line, variables.
    #[arg(long)]
    pub json: bool,
}

pub fn env(a: &EnvArgs) -> Result<()> {
    // the experiment is read first: a bad file is exit 2 before anything is printed
    let config = match &a.file {
        Some(f) => {
            let env: Vec<(String, String)> = std::env::vars().collect();
            Some(if f.is_dir() {
                let file = crate::rundir::run_config_file(f)?;
                crate::config::load_run(&file, &env, &a.sets, &[])?
            } else {
                crate::config::load(f, &env, &a.sets)?
            })
        }
        None => None,
    };
    if a.json {
        let v = crate::rundir::record::record(config.as_ref(), true);
        crate::outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    // `main` has already looked for NCCL the way a run does
    crate::outln!(
        "kiln {} ({}, Burn {}, {})",
        env!("CARGO_PKG_VERSION"),
        env!("KILN_GIT_COMMIT"),
        env!("KILN_BURN_VERSION"),
        env!("KILN_RUSTC")
    );
    let cuda = cfg!(feature = "cuda");
    crate::outln!(
        "backends: ndarray, flex (cpu; default {}){}",
        crate::backend::AUTO_CPU_NAME,
        if cuda { ", cuda (f32, bf16, f16)" } else { "" }
    );
    if cfg!(feature = "wgpu") {
        crate::outln!("  and wgpu (f32)");
    }
    crate::outln!(
        "cpu threads: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    cuda_report();
    wgpu_report();
    nccl_vars(
        config
            .as_ref()
            .map(|r| (&r.config, r.file.display().to_string())),
    );
    Ok(())
}

/// The NCCL variables in effect, and where each comes from.
fn nccl_vars(config: Option<(&crate::config::Config, String)>) {
    let vars = nccl_env::report(config.as_ref().map(|(c, _)| *c));
    match &config {
        Some((c, file)) => crate::outln!(
            "nccl variables of a run of {file}{}:",
            if c.backend.device.has_nccl() {
                ""
            } else {
                " (exported when it runs with backend.device = \"cuda\")"
            }
        ),
        None => crate::outln!("nccl variables in this environment:"),
    }
    if vars.is_empty() {
        crate::outln!("  none set (NCCL's defaults)");
    }
    for (var, value, from) in &vars {
        let replaces = match std::env::var(var) {
            Ok(here) if here != *value => format!("; replaces {var}={here} of this environment"),
            _ => String::new(),
        };
        crate::outln!("  {var}={value}  ({from}{replaces})");
    }
    for (var, suggestion) in nccl_env::unknown_in_environment() {
        let hint = suggestion
            .map(|s| format!("; did you mean {s}?"))
            .unwrap_or_default();
        crate::outln!("  warning: {var} in this environment is not a variable NCCL reads{hint}");
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_report() {
    crate::outln!("wgpu: not compiled in");
    crate::outln!("  = help: rebuild with `cargo build --release --features wgpu` to train through Vulkan, Metal or DX12 (AMD, Intel, Apple GPUs, or a software driver)");
}

#[cfg(feature = "wgpu")]
fn wgpu_report() {
    let adapters = crate::backend::wgpu_adapters::list();
    if adapters.is_empty() {
        crate::outln!("wgpu adapters: none");
        crate::outln!("  = help: install a Vulkan driver (on Debian or Ubuntu, `apt-get install mesa-vulkan-drivers` gives lavapipe, a software one that runs on the CPU)");
        return;
    }
    crate::outln!("wgpu adapters (backend.device = \"wgpu\", backend.adapter picks one):");
    for a in adapters {
        crate::outln!("  {a}");
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_report() {
    crate::outln!("cuda: not compiled in");
    crate::outln!(
        "  = help: rebuild with `cargo build --release --features cuda` to train on NVIDIA GPUs"
    );
}

#[cfg(feature = "cuda")]
fn cuda_report() {
    use crate::cuda;
    crate::outln!("cuda bindings: CUDA 13.0 (cudarc feature cuda-13000; needs a driver for CUDA 13.0+, i.e. 580 or newer)");
    match cuda::driver_version() {
        Some((major, minor)) => crate::outln!("cuda driver: CUDA {major}.{minor}"),
        None => {
            crate::outln!("cuda driver: not found (libcuda.so could not be loaded)");
            crate::outln!("  = help: install the NVIDIA driver, or check that libcuda.so is on the library path");
        }
    }
    match cuda::device_count() {
        Ok(0) => crate::outln!("gpus: none\n  = help: check `nvidia-smi` and CUDA_VISIBLE_DEVICES"),
        Ok(_) => {
            for (i, (name, mem)) in cuda::gpus().iter().enumerate() {
                crate::outln!(
                    "gpu {i}: {name} ({:.1} GiB)",
                    *mem as f64 / (1u64 << 30) as f64
                );
            }
        }
        Err(why) => {
            crate::outln!(
                "gpus: none ({why})\n  = help: check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
            )
        }
    }
    match cuda::find_toolkit() {
        Ok(t) => crate::outln!(
            "cuda toolkit: {} ({}): include/cuda_runtime.h, {}",
            t.root.display(),
            t.from,
            t.nvrtc.display()
        ),
        Err(why) => {
            crate::outln!(
                "cuda toolkit: not found (headers and NVRTC, which compile kiln's kernels)"
            );
            for w in why {
                crate::outln!("  looked at {w}");
            }
            crate::outln!("  = help: {}", cuda::toolkit::HELP);
        }
    }
    let driver = cuda::driver_version();
    match cuda::nvrtc_version() {
        Some((major, minor)) => {
            crate::outln!("nvrtc: {major}.{minor}");
            if let Some((dm, dn)) = driver.filter(|&d| (major, minor) > d) {
                crate::outln!("  warning: NVRTC {major}.{minor} is newer than the driver's CUDA {dm}.{dn}: the kernels it compiles will not load");
                crate::outln!("  = help: update the NVIDIA driver, or use NVRTC {dm}.{dn} (`pip install \"nvidia-cuda-nvrtc=={dm}.{dn}.*\"`)");
            }
        }
        None => {
            crate::outln!("nvrtc: not loadable");
            crate::outln!("  = help: {}", cuda::toolkit::HELP);
        }
    }
    let cache = cuda::kernel_cache_dir();
    crate::outln!(
        "kernel cache: {} (compiled kernels and autotune results; clear it with `rm -rf {}`)",
        cache.display(),
        cache.display()
    );
    if let Some(done) = cuda::prepared() {
        crate::outln!("environment prepared by kiln (re-executed): {done}");
    }
    match (cuda::nccl_version(), cuda::find_nccl()) {
        (Some(v), path) => {
            let linked = std::env::var("KILN_NCCL_SHIM")
                .map(|p| format!(", linked by kiln as libnccl.so from {p}"))
                .unwrap_or_default();
            let at = path
                .map(|p| format!(" ({})", p.display()))
                .unwrap_or_default();
            crate::outln!("nccl: {v}{at}{linked}");
        }
        (None, _) => {
            crate::outln!("nccl: not loadable");
            crate::outln!("  = help: {}", cuda::nccl_hint());
        }
    }
}
