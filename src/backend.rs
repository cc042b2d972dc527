//! Picks the Burn backend a run uses and runs the training on it inside a sized thread pool.
//!
//! CPU: `ndarray` or `flex`; `auto` is the one measured faster on the quickstart workload
//! (see CHANGELOG.md). CUDA needs the `cuda` feature and a device; without either the error says
//! what to do, before anything is written.

use burn::backend::{Autodiff, Flex, NdArray};

use std::path::Path;

use crate::config::{BackendConfig, CpuBackend, Device};
use crate::launch::{self, RunResult};
use crate::train::{TrainError, TrainEvent, TrainInput};

/// The CPU backend `auto` resolves to (measured, see CHANGELOG.md).
pub const AUTO_CPU: CpuBackend = CpuBackend::Flex;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("kiln was built without CUDA support, but `backend.device` = \"cuda\"\n  = help: rebuild with `cargo build --release --features cuda`, or set `backend.device = \"cpu\"`")]
    CudaNotCompiled,
    #[error("no CUDA device found; {0}\n  = help: check `nvidia-smi`, the driver (libcuda.so) and CUDA_VISIBLE_DEVICES, or set `backend.device = \"cpu\"`")]
    NoCudaDevice(String),
}

/// The concrete backend a config resolves to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    Ndarray,
    Flex,
    #[cfg(feature = "cuda")]
    Cuda,
}

impl Resolved {
    pub fn name(&self) -> &'static str {
        match self {
            Resolved::Ndarray => "ndarray",
            Resolved::Flex => "flex",
            #[cfg(feature = "cuda")]
            Resolved::Cuda => "cuda",
        }
    }
}

/// Resolves `[backend]` and checks that it can run here (before anything is written).
pub fn resolve(c: &BackendConfig) -> Result<Resolved, BackendError> {
    match c.device {
        Device::Cpu => Ok(match c.cpu {
            CpuBackend::Ndarray => Resolved::Ndarray,
            CpuBackend::Flex => Resolved::Flex,
            CpuBackend::Auto => match AUTO_CPU {
                CpuBackend::Ndarray => Resolved::Ndarray,
                _ => Resolved::Flex,
            },
        }),
        Device::Cuda => cuda_resolve(),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_resolve() -> Result<Resolved, BackendError> {
    Err(BackendError::CudaNotCompiled)
}

#[cfg(feature = "cuda")]
fn cuda_resolve() -> Result<Resolved, BackendError> {
    crate::cuda::device_count()
        .map_err(BackendError::NoCudaDevice)
        .and_then(|n| {
            if n == 0 {
                Err(BackendError::NoCudaDevice("the driver reports 0 devices".into()))
            } else {
                Ok(Resolved::Cuda)
            }
        })
}

/// Threads each rank's math uses: `backend.threads`, or the cores shared evenly among `ranks`.
pub fn threads(c: &BackendConfig, ranks: usize) -> usize {
    if c.threads > 0 {
        c.threads
    } else {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        (cores / ranks.max(1)).max(1)
    }
}

/// Trains every rank of this node on the resolved backend; `logs` receives `rank-<r>.log`.
pub fn train(
    backend: Resolved,
    c: &BackendConfig,
    input: &TrainInput<'_>,
    logs: Option<&Path>,
    on_event: &mut dyn FnMut(TrainEvent),
) -> Result<RunResult, TrainError> {
    let n = threads(c, input.plan.world_size);
    // ndarray's matmul reads its thread count once from the environment.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", n.to_string());
    }
    match backend {
        Resolved::Ndarray => launch::run::<Autodiff<NdArray>>(input, n, logs, on_event),
        Resolved::Flex => launch::run::<Autodiff<Flex>>(input, n, logs, on_event),
        #[cfg(feature = "cuda")]
        Resolved::Cuda => launch::run::<Autodiff<burn::backend::Cuda>>(input, n, logs, on_event),
    }
}
