//! `[backend]`: the device, its precision and threads.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// `backend.precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

/// `[backend.loss_scale]`: with `backend.precision = "f16"` the loss is multiplied by a scale
/// before the backward, so that small gradients do not flush to zero in f16, and each gradient
/// is divided by it again in f32. A step whose gradient has an infinite or NaN value (on any
/// rank) is skipped and the scale multiplied by `backoff_factor`; after `growth_interval`
/// steps in a row without one it is multiplied by `growth_factor` (torch `GradScaler`). The
/// scale and its count are saved in checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossScaleConfig {
    /// The first scale. Default: `65536` (2^16).
    pub init_scale: f64,
    /// Greater than 1. Default: `2`.
    pub growth_factor: f64,
    /// Between 0 and 1. Default: `0.5`.
    pub backoff_factor: f64,
    /// Steps in a row without an overflow before the scale grows, at least 1. Default: `2000`.
    pub growth_interval: u64,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaleConfig {
    pub fn is_default(&self) -> bool {
        *self == LossScaleConfig::default()
    }
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    /// Burn's wgpu backend (the `wgpu` feature): Vulkan, Metal or DX12, on a GPU or on a
    /// software driver (Mesa's lavapipe).
    Wgpu,
}

/// What the checks and the launcher need to know of a device, asked here, not by comparing
/// with one kind in each place.
impl Device {
    /// Every rank of a node computes on the same device (the CPU's cores, one wgpu adapter):
    /// its ranks are threads bounded by the machine, not by a device count. On CUDA each rank
    /// has a GPU of its own.
    pub fn shared_by_ranks(self) -> bool {
        self != Device::Cuda
    }
    /// What its ranks share, in messages: "CPU", "wgpu adapter" (CUDA: "GPU").
    pub fn noun(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Cuda => "GPU",
            Device::Wgpu => "wgpu adapter",
        }
    }
    /// Ranks can reduce through NCCL (`strategy.collective = "nccl"`); a run records and
    /// exports NCCL's environment.
    pub fn has_nccl(self) -> bool {
        self == Device::Cuda
    }
    /// Ranks have device ordinals (`strategy.devices` may list them).
    pub fn has_ordinals(self) -> bool {
        self == Device::Cuda
    }
    /// GPUs a job must be granted, all driven by one kiln process per node (one thread per
    /// GPU): Slurm runs one task per node and must give it GPUs.
    pub fn needs_gpus(self) -> bool {
        self == Device::Cuda
    }
    /// Tensors in host memory, computed by a CPU backend (`backend.cpu`): RAM bounds the run.
    pub fn on_host(self) -> bool {
        self == Device::Cpu
    }
    /// An adapter is chosen (`backend.adapter`).
    pub fn has_adapters(self) -> bool {
        self == Device::Wgpu
    }
}

/// Which wgpu adapter the ranks compute on (`backend.device = "wgpu"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Adapter {
    /// wgpu's default choice (a discrete GPU, else an integrated one, else a software one).
    Auto,
    /// A software adapter (on Linux, Mesa's lavapipe).
    Cpu,
    /// The first discrete GPU.
    Discrete,
    /// The first integrated GPU.
    Integrated,
}

/// Which Burn CPU backend runs the math.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuBackend {
    /// The measured default (see CHANGELOG.md).
    Auto,
    Ndarray,
    Flex,
}

/// `[backend]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// cpu, cuda (needs the `cuda` feature) or wgpu (needs the `wgpu` feature). Default:
    /// `"cpu"`.
    pub device: Device,
    /// wgpu: the adapter, auto, cpu (a software one such as lavapipe), discrete or integrated.
    /// Default: `"auto"`.
    pub adapter: Adapter,
    /// CPU backend: auto, ndarray or flex. Default: `"auto"`.
    pub cpu: CpuBackend,
    /// CPU threads for the math of each rank; 0 shares the cores evenly among the ranks.
    /// Default: `0`.
    pub threads: usize,
    /// The compute dtype: f32, bf16 or f16 (CUDA, flex, and wgpu where the adapter has it).
    /// Below f32 it is mixed precision, like torch's autocast with FSDP's
    /// `MixedPrecisionPolicy`: the parameters and optimizer state stay f32 (the masters), each
    /// unit's parameters are cast to this dtype as it is installed, activations are in it, the
    /// loss is taken in f32 and the gradients come back in f32. f16 turns on dynamic loss
    /// scaling (`[backend.loss_scale]`). Default: `"f32"`.
    pub precision: Precision,
    /// flex in f32: the gpt's attention, LayerNorm, GELU, linear layers and the loss run kiln's
    /// fused kernels (`kiln::kernels`: custom autodiff ops, vectorized, no materialized
    /// transposes); false runs Burn's own ops, to compare. Other backends and dtypes always run
    /// Burn's ops. Default: `true`.
    #[serde(skip_serializing_if = "is_true")]
    pub fused: bool,
    /// `[backend.loss_scale]`: f16's dynamic loss scaling (torch `GradScaler`). Default: torch's
    /// values.
    #[serde(skip_serializing_if = "LossScaleConfig::is_default")]
    pub loss_scale: LossScaleConfig,
    /// CUDA: how hard cubecl searches for the fastest kernel variant the first time it meets a
    /// shape: minimal, balanced, extensive or full (its results are cached with the compiled
    /// kernels, see `kiln env`). Default: unset (cubecl's `balanced`, or
    /// `CUBECL_AUTOTUNE_LEVEL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autotune: Option<AutotuneLevel>,
    /// `[backend.nccl]`: NCCL's environment variables for this experiment, exported before
    /// NCCL loads, the same on every node (node 0's values), and recorded in the run's
    /// `config.toml` together with any other `NCCL_*` variable the environment had. Default:
    /// nothing set.
    #[serde(skip_serializing_if = "NcclConfig::is_default")]
    pub nccl: NcclConfig,
}

/// (serde: `fused` is written out only when it is off, so configs that leave it at its default
/// keep their hash)
fn is_true(b: &bool) -> bool {
    *b
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            device: Device::Cpu,
            adapter: Adapter::Auto,
            cpu: CpuBackend::Auto,
            threads: 0,
            precision: Precision::F32,
            fused: true,
            loss_scale: LossScaleConfig::default(),
            autotune: None,
            nccl: NcclConfig::default(),
        }
    }
}

impl BackendConfig {
    /// NCCL variables, threads, the wgpu adapter, loss scaling and what ndarray computes in.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        if let Some(p) = self.nccl.problems().into_iter().next() {
            return Err(r.error_of_kind(p.kind, &p.key, p.message, p.help));
        }
        if self.threads > MAX_THREADS {
            return Err(r.range_error(
                "backend.threads",
                format!(
                    "`backend.threads` = {} is out of range: at most {MAX_THREADS} threads per rank",
                    self.threads
                ),
                Some("leave it 0 to share this machine's cores among the ranks".into()),
            ));
        }
        if self.adapter != Adapter::Auto && !self.device.has_adapters() {
            return Err(r.key_error(
                "backend.adapter",
                "`backend.adapter` chooses a wgpu adapter, but `backend.device` is not \"wgpu\""
                    .into(),
                Some("set `backend.device = \"wgpu\"`, or remove `backend.adapter`".into()),
            ));
        }
        let ls = &self.loss_scale;
        if self.precision != Precision::F16 && !ls.is_default() {
            return Err(r.key_error(
                "backend.loss_scale",
                format!(
                    "`[backend.loss_scale]` applies to `backend.precision` = \"f16\" only, not \"{}\"",
                    choice_name(&self.precision)
                ),
                Some("remove `[backend.loss_scale]`, or set `backend.precision = \"f16\"` (bf16 and f32 need no loss scaling)".into()),
            ));
        }
        in_range(
            r,
            "backend.loss_scale.init_scale",
            ls.init_scale,
            ls.init_scale > 0.0 && ls.init_scale <= 1e30,
            "greater than 0 and at most 1e30",
        )?;
        in_range(
            r,
            "backend.loss_scale.growth_factor",
            ls.growth_factor,
            ls.growth_factor > 1.0 && ls.growth_factor <= 1e6,
            "greater than 1 (and at most 1e6)",
        )?;
        in_range(
            r,
            "backend.loss_scale.backoff_factor",
            ls.backoff_factor,
            ls.backoff_factor > 0.0 && ls.backoff_factor < 1.0,
            "between 0 and 1",
        )?;
        at_least(
            r,
            "backend.loss_scale.growth_interval",
            ls.growth_interval as usize,
            1,
        )?;
        if self.device.on_host()
            && self.cpu == CpuBackend::Ndarray
            && self.precision != Precision::F32
        {
            return Err(r.key_error(
                "backend.precision",
                format!(
                    "`backend.precision` = \"{}\" needs a backend that computes in it; ndarray computes in f32 only",
                    choice_name(&self.precision)
                ),
                Some("set `backend.cpu = \"flex\"` (or \"auto\"), or remove `backend.precision`".into()),
            ));
        }
        Ok(())
    }
}

/// Where `backend.threads` came from when `OMP_NUM_THREADS` set it.
pub const OMP_SOURCE: &str = "environment variable OMP_NUM_THREADS";

/// `OMP_NUM_THREADS` (which torchrun sets to 1 for each process it starts) as `backend.threads`
/// when no layer of `figment` sets a count (0, the default, shares the cores: a run's
/// config.toml holds it) (issue 58, defect 21: two processes under torchrun ran two threads
/// each on two cores): the layer, named as its source. A session setting: the run directory
/// stores 0 for it, and trial ids leave threads out.
pub(super) fn omp_threads(
    figment: &figment::Figment,
    var: &dyn Fn(&str) -> Option<String>,
) -> Option<(figment::Metadata, figment::value::Dict)> {
    let set = figment
        .find_value("backend.threads")
        .ok()
        .and_then(|v| v.deserialize::<i64>().ok())
        .is_some_and(|n| n > 0);
    let n = var("OMP_NUM_THREADS")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0 && !set)?;
    Some((
        figment::Metadata::named(OMP_SOURCE),
        super::load::nest(
            &["backend".into(), "threads".into()],
            figment::value::Value::from(n),
        ),
    ))
}
