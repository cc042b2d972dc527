//! Picks the Burn backend a run uses and runs the training on it inside a sized thread pool.
//!
//! CPU: `ndarray` or `flex`; `auto` is the one measured faster on the quickstart workload
//! (see CHANGELOG.md). CUDA needs the `cuda` feature and a device; without either the error says
//! what to do, before anything is written.

use burn::backend::{Autodiff, Flex, NdArray};

use crate::config::{BackendConfig, CpuBackend, Device};
use crate::train::{self, Outcome, TrainError, TrainEvent, TrainInput};

/// The CPU backend `auto` resolves to (measured, see CHANGELOG.md).
pub const AUTO_CPU: CpuBackend = CpuBackend::Flex;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("kiln was built without CUDA support, but `backend.device` = \"cuda\"\n  = help: rebuild with `cargo build --release --features cuda`, or set `backend.device = \"cpu\"`")]
    CudaNotCompiled,
    #[error("no CUDA device found; {0}\n  = help: check `nvidia-smi`, the driver (libcuda.so) and CUDA_VISIBLE_DEVICES, or set `backend.device = \"cpu\"`")]
    NoCudaDevice(String),
    #[error("cannot start {threads} CPU threads (backend.threads): {why}")]
    Threads { threads: usize, why: String },
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

/// Threads a run uses: `backend.threads`, or every core when 0.
pub fn threads(c: &BackendConfig) -> usize {
    if c.threads > 0 {
        c.threads
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Train(#[from] TrainError),
}

/// Trains on the resolved backend inside a thread pool of `threads(c)` threads.
pub fn train(
    backend: Resolved,
    c: &BackendConfig,
    input: &TrainInput<'_>,
    on_event: &mut (dyn FnMut(TrainEvent) + Send),
) -> Result<Outcome, RunError> {
    let n = threads(c);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| BackendError::Threads {
            threads: n,
            why: e.to_string(),
        })?;
    let out = pool.install(|| match backend {
        Resolved::Ndarray => train::train::<Autodiff<NdArray>>(input, &Default::default(), on_event),
        Resolved::Flex => train::train::<Autodiff<Flex>>(input, &Default::default(), on_event),
        #[cfg(feature = "cuda")]
        Resolved::Cuda => train::train::<Autodiff<burn::backend::Cuda>>(input, &Default::default(), on_event),
    })?;
    Ok(out)
}
