//! `kiln env`: what kiln can run on here, and what to fix when something is missing. Always
//! exits 0.

use crate::error::Result;

pub fn env() -> Result<()> {
    // `main` has already looked for NCCL the way a run does
    println!("kiln {}", env!("CARGO_PKG_VERSION"));
    let cuda = cfg!(feature = "cuda");
    println!(
        "backends: ndarray, flex (cpu; default {}){}",
        crate::backend::AUTO_CPU_NAME,
        if cuda { ", cuda (f32, bf16, f16)" } else { "" }
    );
    println!(
        "cpu threads: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    cuda_report();
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn cuda_report() {
    println!("cuda: not compiled in");
    println!(
        "  = help: rebuild with `cargo build --release --features cuda` to train on NVIDIA GPUs"
    );
}

#[cfg(feature = "cuda")]
fn cuda_report() {
    use crate::cuda;
    println!("cuda bindings: CUDA 13.0 (cudarc feature cuda-13000; needs a driver for CUDA 13.0+, i.e. 580 or newer)");
    match cuda::driver_version() {
        Some((major, minor)) => println!("cuda driver: CUDA {major}.{minor}"),
        None => {
            println!("cuda driver: not found (libcuda.so could not be loaded)");
            println!("  = help: install the NVIDIA driver, or check that libcuda.so is on the library path");
        }
    }
    match cuda::device_count() {
        Ok(0) => println!("gpus: none\n  = help: check `nvidia-smi` and CUDA_VISIBLE_DEVICES"),
        Ok(_) => {
            for (i, (name, mem)) in cuda::gpus().iter().enumerate() {
                println!(
                    "gpu {i}: {name} ({:.1} GiB)",
                    *mem as f64 / (1u64 << 30) as f64
                );
            }
        }
        Err(why) => {
            println!("gpus: none ({why})\n  = help: check `nvidia-smi` and CUDA_VISIBLE_DEVICES")
        }
    }
    match (cuda::nccl_version(), cuda::find_nccl()) {
        (Some(v), path) => {
            let linked = std::env::var("KILN_NCCL_SHIM")
                .map(|p| format!(", linked by kiln as libnccl.so from {p}"))
                .unwrap_or_default();
            let at = path
                .map(|p| format!(" ({})", p.display()))
                .unwrap_or_default();
            println!("nccl: {v}{at}{linked}");
        }
        (None, _) => {
            println!("nccl: not loadable");
            println!("  = help: {}", cuda::nccl_hint());
        }
    }
}
