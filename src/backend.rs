//! Layer: backend (beside `train`: above `model`, `params`, `cuda` and `config`).
//!
//! Picks the Burn backend, the device of every rank and the collective a run uses (`launch`
//! runs the training on them).
//!
//! CPU: `ndarray` or `flex`; `auto` is the one measured faster on the quickstart workload (see
//! CHANGELOG.md). CUDA needs the `cuda` feature and a device; without either the error says what
//! to do, before anything is written. NCCL refuses two ranks on one GPU (before NCCL 2.30), so
//! such placements use host-staged collectives.

use burn::backend::{Autodiff, Flex, NdArray};

use crate::config::{CollectiveKind, Config, CpuBackend, Device, Precision};
use crate::params::RawFn;

/// The CPU backend `auto` resolves to (measured, see CHANGELOG.md).
pub const AUTO_CPU: CpuBackend = CpuBackend::Flex;
/// Its name.
pub const AUTO_CPU_NAME: &str = "flex";

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("kiln was built without CUDA support, but `backend.device` = \"cuda\"\n  = help: rebuild with `cargo build --release --features cuda`, or set `backend.device = \"cpu\"`")]
    CudaNotCompiled,
    #[error("no CUDA device found; {0}\n  = help: check `nvidia-smi`, the driver (libcuda.so) and CUDA_VISIBLE_DEVICES, or set `backend.device = \"cpu\"` (`kiln env` shows what kiln sees)")]
    NoCudaDevice(String),
    #[error("no CUDA toolkit found: cubecl compiles kernels with NVRTC against the CUDA headers (include/cuda_runtime.h){0}\n  = help: {1} (`kiln env` shows what kiln sees)")]
    NoToolkit(String, &'static str),
    #[error("`strategy.devices` names GPU {ordinal} but {found} CUDA device(s) were found\n  = help: list ordinals below {found}, or check CUDA_VISIBLE_DEVICES")]
    NoSuchGpu { ordinal: usize, found: usize },
    #[error("kiln was built without wgpu support, but `backend.device` = \"wgpu\"\n  = help: rebuild with `cargo build --release --features wgpu`, or set `backend.device = \"cpu\"`")]
    WgpuNotCompiled,
    #[error("no wgpu adapter {wanted}; wgpu sees {found}\n  = help: install a Vulkan driver (on Debian or Ubuntu, `apt-get install mesa-vulkan-drivers` gives lavapipe, a software one), choose another `backend.adapter`, or set `backend.device = \"cpu\"` (`kiln env` lists the adapters)")]
    NoAdapter { wanted: String, found: String },
    #[error(
        "`backend.precision` = \"{precision}\": {device} cannot compute in it\n  = help: {help}"
    )]
    Precision {
        precision: String,
        device: String,
        help: String,
    },
    #[error("`strategy.collective` = \"nccl\" but ranks share a GPU ({ranks} ranks on {gpus} GPU(s)); NCCL refuses two ranks on one GPU (before NCCL 2.30)\n  = help: set `strategy.collective = \"host\"` for host-staged collectives, or use at most {gpus} devices")]
    SharedGpu { ranks: usize, gpus: usize },
}

macro_rules! resolved {
    ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
        /// The concrete backend a config resolves to: one per entry of
        /// `model::for_each_backend!`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum BackendKind {
            $($(#[$a])* $v,)*
        }

        impl BackendKind {
            /// Its name in logs and `summary.json` (`flex`, `cuda`, `wgpu`).
            pub fn name(&self) -> &'static str {
                match self {
                    $($(#[$a])* BackendKind::$v => $name,)*
                }
            }
        }
    };
}
crate::model::for_each_backend!(resolved);

/// How the ranks of this node talk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommKind {
    /// Shared memory between the rank threads (host-staged on CUDA).
    Host,
    /// NCCL, one communicator per rank.
    Nccl,
}

/// Backend, rank devices and collective of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub backend: BackendKind,
    /// The device ordinal of each rank (0 for CPU ranks).
    pub ordinals: Vec<usize>,
    pub collective: CommKind,
    /// Why the collective is what it is, when that is worth a log line.
    pub note: Option<String>,
}

/// Resolves `[backend]` and `[strategy]` placement, checking it can run here (before anything is
/// written).
pub fn resolve(c: &Config) -> Result<Placement, BackendError> {
    let world = c.strategy.devices.count();
    match c.backend.device {
        Device::Cpu => Ok(Placement {
            backend: match c.backend.cpu {
                CpuBackend::Ndarray => BackendKind::Ndarray,
                CpuBackend::Flex => BackendKind::Flex,
                CpuBackend::Auto => match AUTO_CPU {
                    CpuBackend::Ndarray => BackendKind::Ndarray,
                    _ => BackendKind::Flex,
                },
            },
            ordinals: vec![0; world],
            collective: CommKind::Host,
            note: None,
        }),
        Device::Cuda => cuda_placement(c, world),
        Device::Wgpu => wgpu_placement(c, world),
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_placement(_c: &Config, _world: usize) -> Result<Placement, BackendError> {
    Err(BackendError::WgpuNotCompiled)
}

/// Every rank on the one adapter `backend.adapter` picks, reducing through the host.
#[cfg(feature = "wgpu")]
fn wgpu_placement(c: &Config, world: usize) -> Result<Placement, BackendError> {
    let adapters = wgpu_adapters::list();
    let kind = wgpu_adapters::kind(c.backend.adapter);
    if !adapters.iter().any(|a| kind.is_none_or(|k| a.kind == k)) {
        let found = if adapters.is_empty() {
            "none".to_string()
        } else {
            adapters
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        };
        let wanted = match c.backend.adapter {
            crate::config::Adapter::Auto => "at all".to_string(),
            other => format!(
                "of kind `{}` (backend.adapter)",
                format!("{other:?}").to_lowercase()
            ),
        };
        return Err(BackendError::NoAdapter { wanted, found });
    }
    if c.backend.precision != Precision::F32 {
        use burn::tensor::backend::Backend;
        type W = Autodiff<burn::backend::Wgpu>;
        let device = <W as RankBackend>::rank_device(&c.backend, 0);
        let dtype = crate::params::float_dtype(c.backend.precision);
        if !<W as Backend>::supports_dtype(&device, dtype.into()) {
            return Err(BackendError::Precision {
                precision: crate::config::choice_name(&c.backend.precision),
                device: "this wgpu adapter".into(),
                help: "use `backend.precision = \"f16\"` where the adapter has shader f16, or \"f32\"; bf16 needs CUDA (or flex on the CPU)".into(),
            });
        }
    }
    Ok(Placement {
        backend: BackendKind::Wgpu,
        ordinals: vec![0; world],
        collective: CommKind::Host,
        note: (world > 1)
            .then(|| "collective: host-staged (wgpu has no device collective)".to_string()),
    })
}

/// The adapters wgpu sees (`kiln env`, and the check before a wgpu run).
#[cfg(feature = "wgpu")]
pub mod wgpu_adapters {
    use crate::config::Adapter;

    /// One adapter: its name, kind and graphics API.
    #[derive(Debug, Clone)]
    pub struct AdapterLine {
        pub name: String,
        pub kind: wgpu::DeviceType,
        pub api: wgpu::Backend,
        pub driver: String,
    }

    impl std::fmt::Display for AdapterLine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} ({:?}, {:?}", self.name, self.kind, self.api)?;
            if !self.driver.is_empty() {
                write!(f, ", {}", self.driver)?;
            }
            write!(f, ")")
        }
    }

    /// The device kind `adapter` asks for (`None`: any).
    pub fn kind(adapter: Adapter) -> Option<wgpu::DeviceType> {
        match adapter {
            Adapter::Auto => None,
            Adapter::Cpu => Some(wgpu::DeviceType::Cpu),
            Adapter::Discrete => Some(wgpu::DeviceType::DiscreteGpu),
            Adapter::Integrated => Some(wgpu::DeviceType::IntegratedGpu),
        }
    }

    /// Every adapter of every graphics API wgpu was built with.
    pub fn list() -> Vec<AdapterLine> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        block_on(instance.enumerate_adapters(wgpu::Backends::all()))
            .into_iter()
            .map(|a| {
                let i = a.get_info();
                AdapterLine {
                    name: i.name,
                    kind: i.device_type,
                    api: i.backend,
                    driver: [i.driver, i.driver_info]
                        .into_iter()
                        .filter(|s| !s.is_empty())
                        .collect::<Vec<_>>()
                        .join(" "),
                }
            })
            .collect()
    }

    /// Runs a future that native wgpu completes without waiting (adapter enumeration).
    fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
        let mut f = std::pin::pin!(f);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if let std::task::Poll::Ready(t) = f.as_mut().poll(&mut cx) {
                return t;
            }
            std::thread::yield_now();
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_placement(_c: &Config, _world: usize) -> Result<Placement, BackendError> {
    Err(BackendError::CudaNotCompiled)
}

#[cfg(feature = "cuda")]
fn cuda_placement(c: &Config, world: usize) -> Result<Placement, BackendError> {
    let gpus = crate::cuda::device_count().map_err(BackendError::NoCudaDevice)?;
    if gpus == 0 {
        return Err(BackendError::NoCudaDevice(
            "the driver reports 0 devices".into(),
        ));
    }
    match crate::cuda::find_toolkit() {
        Ok(_) if crate::cuda::nvrtc_loadable() => {}
        // an install kiln's search does not know, where cubecl's own finds the headers
        _ if crate::cuda::nvrtc_loadable() && crate::cuda::cubecl_finds_headers() => {}
        Ok(t) => {
            return Err(BackendError::NoToolkit(
                format!("; NVRTC at {} does not load", t.nvrtc.display()),
                crate::cuda::toolkit::HELP,
            ))
        }
        Err(why) => {
            let tried = if why.is_empty() {
                String::new()
            } else {
                format!("; looked at: {}", why.join("; "))
            };
            return Err(BackendError::NoToolkit(tried, crate::cuda::toolkit::HELP));
        }
    }
    crate::cuda::configure_kernels(c.backend.autotune);
    let mut placement = place_on_gpus(c, world, gpus)?;
    if placement.collective == CommKind::Nccl
        && world == 1
        && c.strategy.collective == CollectiveKind::Auto
        && !crate::cuda::nccl_loadable()
    {
        // one rank needs no communication: run without NCCL rather than fail
        placement.collective = CommKind::Host;
        placement.note =
            Some("collective: host (one rank; NCCL was not found, see `kiln env`)".into());
    }
    Ok(placement)
}

/// Ranks onto `gpus` GPUs: ordinals, and NCCL unless ranks share a GPU.
pub fn place_on_gpus(c: &Config, world: usize, gpus: usize) -> Result<Placement, BackendError> {
    // a process a launcher started for one GPU (torchrun's LOCAL_RANK) takes that GPU
    let ordinals = match (c.launch.local_rank, &c.strategy.devices) {
        (Some(l), crate::config::Devices::Count(1)) => vec![l],
        _ => c.strategy.devices.ordinals(gpus),
    };
    if let Some(&ordinal) = ordinals.iter().find(|&&o| o >= gpus) {
        return Err(BackendError::NoSuchGpu {
            ordinal,
            found: gpus,
        });
    }
    let mut distinct = ordinals.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let shared = distinct.len() < ordinals.len();
    let (collective, note) = match (c.strategy.collective, shared) {
        (CollectiveKind::Nccl, true) => return Err(BackendError::SharedGpu { ranks: world, gpus: distinct.len() }),
        (CollectiveKind::Nccl, false) | (CollectiveKind::Auto, false) => (CommKind::Nccl, None),
        (CollectiveKind::Auto, true) => (
            CommKind::Host,
            Some(format!(
                "collective: host-staged, because {world} ranks share {} GPU(s) and NCCL refuses two ranks on one GPU",
                distinct.len()
            )),
        ),
        (CollectiveKind::Host, _) => (CommKind::Host, Some("collective: host-staged (strategy.collective = \"host\")".into())),
    };
    #[cfg(feature = "cuda")]
    let backend = BackendKind::Cuda;
    #[cfg(not(feature = "cuda"))]
    let backend = BackendKind::Flex;
    Ok(Placement {
        backend,
        ordinals,
        collective,
        note,
    })
}

/// Backends kiln runs on, with the device of a rank.
pub trait RankBackend: crate::model::ComputeOn {
    /// The device of the rank placed on device `ordinal` (0 for CPU ranks).
    fn rank_device(c: &crate::config::BackendConfig, ordinal: usize) -> Self::Device;
    /// Device backends (CUDA, wgpu): how to reach the device address of a flat tensor, for a
    /// device collective (CUDA; wgpu buffers have none, `params::no_address`). With it the
    /// step keeps parameters, gradients and optimizer state on the device. `None`: a CPU
    /// backend, everything on the host.
    fn raw_fn() -> Option<RawFn<Self::InnerBackend>> {
        None
    }
    /// Whether the device runs work asynchronously (CUDA streams): the step-time breakdown then
    /// synchronises it at phase boundaries.
    fn asynchronous() -> bool {
        false
    }
    /// Makes `precision` the dtype every float tensor created on `device` gets by default (the
    /// model's activations, masks and the compute copy of its parameters), before the rank
    /// creates any; kiln's master buffers ask for f32 explicitly. Burn keeps one setting per
    /// device and process, fixed once set: a second rank on the device (or a restarted
    /// session) finds it set, which is fine when it is the same dtype.
    fn prepare(device: &Self::Device, precision: Precision) -> Result<(), String> {
        use burn::tensor::backend::Backend;
        use burn::tensor::Element;
        let want = crate::params::float_dtype(precision);
        if !<Self as Backend>::supports_dtype(device, want.into()) {
            return Err(format!(
                "`backend.precision` = \"{}\": this device cannot compute in {want:?}",
                crate::config::choice_name(&precision)
            ));
        }
        let int = <Self::IntElem as Element>::dtype();
        if burn::tensor::set_default_dtypes::<Self>(device, want, int).is_ok() {
            return Ok(());
        }
        let have = burn::tensor::get_device_settings::<Self>(device).float_dtype;
        if have == want {
            Ok(())
        } else {
            Err(format!(
                "`backend.precision` = \"{}\": this process already computes in {have:?} on the device (one precision per process and device)",
                crate::config::choice_name(&precision)
            ))
        }
    }
}

impl RankBackend for Autodiff<NdArray> {
    fn rank_device(_c: &crate::config::BackendConfig, _ordinal: usize) -> Self::Device {
        Default::default()
    }
}

impl RankBackend for Autodiff<Flex> {
    fn rank_device(_c: &crate::config::BackendConfig, _ordinal: usize) -> Self::Device {
        Default::default()
    }
}

/// wgpu: every rank on the adapter `backend.adapter` chose (checked by `resolve`).
#[cfg(feature = "wgpu")]
impl RankBackend for Autodiff<burn::backend::Wgpu> {
    fn rank_device(c: &crate::config::BackendConfig, _ordinal: usize) -> Self::Device {
        use burn::backend::wgpu::WgpuDevice;
        match c.adapter {
            crate::config::Adapter::Auto => WgpuDevice::DefaultDevice,
            crate::config::Adapter::Cpu => WgpuDevice::Cpu,
            crate::config::Adapter::Discrete => WgpuDevice::DiscreteGpu(0),
            crate::config::Adapter::Integrated => WgpuDevice::IntegratedGpu(0),
        }
    }
    fn raw_fn() -> Option<RawFn<Self::InnerBackend>> {
        Some(crate::params::no_address::<Self::InnerBackend>)
    }
    fn asynchronous() -> bool {
        true
    }
}

#[cfg(feature = "cuda")]
impl RankBackend for Autodiff<burn::backend::Cuda<f32>> {
    fn asynchronous() -> bool {
        true
    }
    fn rank_device(_c: &crate::config::BackendConfig, ordinal: usize) -> Self::Device {
        burn::backend::cuda::CudaDevice::new(ordinal)
    }
    fn raw_fn() -> Option<RawFn<Self::InnerBackend>> {
        Some(crate::cuda::raw_buf::<f32>)
    }
}

/// Whether this process's `main` owns its environment (`own_process_env`): only then does kiln
/// set a variable that a library reads once (ndarray's `MATMUL_NUM_THREADS`). Tests that train
/// in threads of one process never do: setting a variable races with every thread reading one.
static OWNS_ENV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Called by the process's `main` (`kiln::cli::main_with`) before any thread exists.
pub fn own_process_env() {
    OWNS_ENV.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// ndarray's matmul reads its thread count once from the environment: `threads` for each rank,
/// unless the user set it, and only where `main` owns the environment.
pub fn set_matmul_threads(threads: usize) {
    if OWNS_ENV.load(std::sync::atomic::Ordering::SeqCst)
        && std::env::var_os("MATMUL_NUM_THREADS").is_none()
    {
        std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    }
}

/// Threads each rank's math uses: `backend.threads`, or the cores shared evenly among `ranks`,
/// less the rank's `loaders` (data loader threads), at least 1.
pub fn threads(c: &crate::config::BackendConfig, ranks: usize, loaders: usize) -> usize {
    if c.threads > 0 {
        c.threads
    } else {
        (cores() / ranks.max(1)).saturating_sub(loaders).max(1)
    }
}

/// Each rank's share of the CPU in words: "2 threads per rank", or with data loader threads
/// "1 math thread + 1 data loader thread per rank", and whose cores they are.
pub fn cpu_split(c: &crate::config::Config) -> String {
    let ranks = c.strategy.devices.count();
    let math = threads(&c.backend, ranks, c.data.workers);
    let s = |n: usize| if n == 1 { "" } else { "s" };
    let split = match c.data.workers {
        0 => format!("{math} thread{} per rank", s(math)),
        w => format!(
            "{math} math thread{} + {w} data loader thread{} per rank",
            s(math),
            s(w)
        ),
    };
    if c.backend.threads > 0 {
        format!("{split} (backend.threads)")
    } else {
        let cores = cores();
        format!(
            "{split} ({cores} core{} shared by {ranks} rank{})",
            s(cores),
            s(ranks)
        )
    }
}

/// The cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
