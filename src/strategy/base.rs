//! The `Strategy` interface, memory accounting and shared helpers.

use super::hybrid::Hybrid;
use super::{Ddp, Dp, Fsdp, Single};
use std::ops::Range;

use serde::Serialize;

use crate::checkpoint::{Layout, OptState};
use crate::collective::Pending;
use crate::collective::{
    device_error, Collective, CollectiveError, GradsOps, OpKind, Overlapped, ReduceOp, WaitHook,
};
use crate::config::{Config, DecayRule, Mesh, StrategyKind};
use crate::params::{DeviceParams, DeviceTensor, Grads, Optimizer, ParamLayout, Transfers};

/// Bytes one rank holds: its model state by formula (parameters, gradients and optimizer state
/// over the shard lengths it keeps), and its measured peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    pub rank: usize,
    /// Model state: parameters kept between steps.
    pub params_bytes: usize,
    /// Model state: the gradient the update takes.
    pub grads_bytes: usize,
    /// Model state: optimizer state.
    pub optim_bytes: usize,
    /// Measured: the most bytes the rank's threads held at once during training (the counting
    /// allocator of the `kiln` binary; absent where it is not installed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_bytes: Option<u64>,
    /// Measured on a device backend: the bytes this rank's thread moved between the host and
    /// the device over the session, by kind (absent on the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_transfers: Option<Transfers>,
}

/// A rank's part of a checkpoint: the whole model and optimizer (rank 0 of a whole-parameter
/// strategy), the rank's part of every unit (fsdp, in unit order), or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub layout: Layout,
    /// `None` for ranks that write nothing.
    pub data: Option<(Vec<f32>, OptState)>,
}

/// The device copy of a whole-parameter strategy's parameters and optimizer (a device backend
/// without `strategy.offload`): made at the first forward that asks for it, ahead of the host
/// copy once it has stepped.
#[derive(Default)]
pub(super) struct DeviceCopy {
    pub dev: Option<Box<dyn DeviceParams>>,
    /// Leading parameters that never train (`ParamLayout::frozen`): the device update steps
    /// the rest.
    pub frozen: usize,
    /// Whether the host parameters lag behind `dev`.
    stale: bool,
    /// Whether the host optimizer state lags behind `dev`.
    stale_state: bool,
}

impl DeviceCopy {
    /// No device copy yet, of parameters whose first `frozen` never train.
    pub fn with_frozen(frozen: usize) -> Self {
        DeviceCopy {
            frozen,
            ..DeviceCopy::default()
        }
    }

    /// Elements `range` of the device copy, made from `params` and `opt` first; `None` when the
    /// buffer cannot keep the f32 masters (`DeviceTensor::device_params`).
    pub fn slice(
        &mut self,
        params: &[f32],
        opt: &Optimizer,
        proto: &dyn DeviceTensor,
        range: Range<usize>,
    ) -> Option<Box<dyn DeviceTensor>> {
        if self.dev.is_none() {
            self.dev = proto.device_params(params, self.frozen, opt);
        }
        self.dev.as_ref().map(|d| d.slice(range))
    }

    /// The device copy has stepped: the host copy lags.
    pub fn stepped(&mut self) {
        self.stale = true;
        self.stale_state = true;
    }

    /// Refreshes `params` (and `opt`, when given: checkpoints, leaving the device) from the
    /// device when they lag.
    pub fn sync(
        &mut self,
        rank: usize,
        params: &mut Vec<f32>,
        opt: Option<&mut Optimizer>,
    ) -> Result<(), CollectiveError> {
        let Some(dev) = &mut self.dev else {
            return Ok(());
        };
        let err = |e| device_error(rank, OpKind::Update, e);
        if self.stale {
            *params = dev.params().map_err(err)?;
            self.stale = false;
        }
        if let (true, Some(opt)) = (self.stale_state, opt) {
            opt.import_whole(&dev.export().map_err(err)?);
            self.stale_state = false;
        }
        Ok(())
    }

    /// Forgets the device copy: the host copy is the truth again.
    pub fn reset(&mut self) {
        self.dev = None;
        self.stale = false;
        self.stale_state = false;
    }

    pub fn state_bytes(&self) -> Option<usize> {
        self.dev.as_ref().map(|d| d.state_bytes())
    }

    /// `Strategy::placement` of a whole-parameter strategy.
    pub fn placement(&self, steps: &str) -> String {
        match &self.dev {
            Some(_) => format!("parameters and optimizer state: on the device, where {steps} (read to the host only for evaluation, checkpoints and the end)"),
            None => format!("parameters and optimizer state: on the host, where {steps} (parameters uploaded for each forward)"),
        }
    }
}

/// A step's whole gradient (single, dp, ddp, fsdp without sharding; and an fsdp unit's, from its
/// layout units), made at the first unit gradient handed in, on the host or the device like it.
#[derive(Default)]
pub(super) struct WholeGrads {
    grads: Option<Grads>,
}

impl WholeGrads {
    /// Adds a unit's gradient into `range` of a whole gradient of `len` elements.
    pub fn add(
        &mut self,
        rank: usize,
        len: usize,
        range: Range<usize>,
        grad: Grads,
    ) -> Result<&mut Grads, CollectiveError> {
        let err = |e| device_error(rank, OpKind::Update, e);
        let mut whole = match self.grads.take() {
            Some(g) => g,
            // one unit covers it all: its gradient is the whole gradient
            None if range.len() == len => return Ok(self.grads.insert(grad)),
            None => Grads::zeros_like(&grad, len).map_err(err)?,
        };
        whole.add_at(range.start, grad).map_err(err)?;
        Ok(self.grads.insert(whole))
    }
    /// The step's gradient (zeros on the host if nothing was handed in), leaving none.
    pub fn take(&mut self, len: usize) -> Grads {
        self.grads
            .take()
            .unwrap_or_else(|| Grads::Host(vec![0.0; len]))
    }
    pub fn non_finite(&self) -> Result<bool, String> {
        self.grads.as_ref().map_or(Ok(false), |g| g.non_finite())
    }
    /// The gradient so far, if any was handed in.
    pub fn get_mut(&mut self) -> Option<&mut Grads> {
        self.grads.as_mut()
    }
    /// The host gradient's `range`, when there is one.
    pub fn host_range(&self, range: Range<usize>) -> Option<&[f32]> {
        match &self.grads {
            Some(Grads::Host(v)) => Some(&v[range]),
            _ => None,
        }
    }
    /// Writes `values` (a reduction's result) over `range` of the whole gradient of `len`
    /// elements (made on the host when there is none; written back when it is on the device).
    pub fn set(
        &mut self,
        rank: usize,
        len: usize,
        range: Range<usize>,
        values: &[f32],
    ) -> Result<(), CollectiveError> {
        let g = self
            .grads
            .get_or_insert_with(|| Grads::Host(vec![0.0; len]));
        match g {
            Grads::Host(v) => {
                v[range].copy_from_slice(values);
                Ok(())
            }
            Grads::Device(d) => {
                crate::params::transfers::record(crate::params::Moved::GradsToDevice, values.len());
                d.write_at(range.start, values)
                    .map_err(|e| device_error(rank, OpKind::AllReduce, e))
            }
        }
    }
}

/// A unit's reduction (or gather) running beside the compute: its values when it is done.
pub(super) type Reduced = Pending<Result<Vec<f32>, CollectiveError>>;

/// Unit gradients whose reduction runs beside the compute, oldest first: each comes back as
/// `(what it belongs to, the reduced values)`.
pub(super) struct InFlight<K> {
    queue: std::collections::VecDeque<(K, Reduced)>,
}

impl<K> Default for InFlight<K> {
    fn default() -> Self {
        InFlight {
            queue: Default::default(),
        }
    }
}

impl<K> InFlight<K> {
    pub fn push(&mut self, key: K, p: Reduced) {
        self.queue.push_back((key, p));
    }
    /// Whether a reduction whose key passes `f` is still out.
    pub fn holds_any(&self, f: impl Fn(&K) -> bool) -> bool {
        self.queue.iter().any(|(k, _)| f(k))
    }
    /// Hands `done` the reductions that have finished, in submission order; with `all`, waits
    /// for every one.
    pub fn collect(
        &mut self,
        comm: &mut Overlapped,
        all: bool,
        mut done: impl FnMut(K, Vec<f32>) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        while let Some((key, p)) = self.queue.pop_front() {
            let values = if all {
                comm.wait(p)?
            } else {
                match p.try_take() {
                    Ok(r) => r?,
                    Err(p) => {
                        self.queue.push_front((key, p));
                        return Ok(());
                    }
                }
            };
            done(key, values)?;
        }
        Ok(())
    }
}

/// All-reduces (mean) `range` of `grads` in buckets of at most `bucket` elements.
pub(super) fn all_reduce_buckets(
    comm: &mut dyn Collective,
    grads: &mut Grads,
    range: Range<usize>,
    bucket: usize,
) -> Result<(), CollectiveError> {
    if comm.world() == 1 {
        return Ok(());
    }
    let mut start = range.start;
    while start < range.end {
        let end = (start + bucket.max(1)).min(range.end);
        grads.all_reduce(comm, start..end, ReduceOp::Mean)?;
        start = end;
    }
    Ok(())
}

/// Memory of a rank holding whole parameters and the gradients of the `trainable` ones.
pub(super) fn whole_memory(
    rank: usize,
    params: &[f32],
    trainable: usize,
    optim_bytes: usize,
) -> Memory {
    Memory {
        rank,
        params_bytes: std::mem::size_of_val(params),
        grads_bytes: trainable * std::mem::size_of::<f32>(),
        optim_bytes,
        peak_bytes: None,
        host_transfers: None,
    }
}

/// The snapshot of a strategy that holds whole parameters and, on rank 0, the whole optimizer.
pub(super) fn full_snapshot(rank: usize, params: &[f32], opt: Option<OptState>) -> Snapshot {
    let data = match (rank, opt) {
        (0, Some(o)) => Some((params.to_vec(), o)),
        _ => None,
    };
    Snapshot {
        layout: Layout::Full,
        data,
    }
}

/// What a strategy does at each point of a step.
pub trait Strategy {
    /// The rank's end of the collective.
    fn comm(&self) -> &dyn Collective;
    fn comm_mut(&mut self) -> &mut dyn Collective;
    fn rank(&self) -> usize {
        self.comm().rank()
    }
    fn world(&self) -> usize {
        self.comm().world()
    }
    /// Sets the initial parameters (every rank passes the same seeded init; ddp/dp then make
    /// rank 0's the truth, as torch does).
    fn init(&mut self, init: &[f32]) -> Result<(), CollectiveError>;
    /// The full parameters. fsdp gathers them, and holds them until `release_params`: outside
    /// a strategy, use `with_params`, which releases them.
    fn params(&mut self) -> Result<&[f32], CollectiveError>;
    /// Unit `unit`'s parameters (the flat `range`) for forward/backward.
    fn unit_params(
        &mut self,
        unit: usize,
        range: Range<usize>,
    ) -> Result<Vec<f32>, CollectiveError> {
        let _ = unit;
        Ok(self.params()?[range].to_vec())
    }
    /// What the strategy does for a rank that keeps its model state on a device
    /// (`DeviceResident`); `None`: it keeps it on the host.
    fn on_device(&mut self) -> Option<&mut dyn DeviceResident> {
        None
    }
    /// The weight of this rank's micro-batch gradient in the step's gradient, given its sample
    /// count and the micro-batch's total across ranks (dp weights by samples, ddp averages).
    fn grad_weight(&self, local_samples: usize, global_samples: usize) -> f64;
    /// Takes this micro-step's gradient of layout unit `unit` (flat range `range`, already
    /// weighted), handed over as soon as the backward of the unit's last use is done, in the
    /// backward's order (the same on every rank). `sync`: this micro-step's gradients are
    /// synchronised (the last micro-step of the step, or every one with `strategy.no_sync =
    /// false`): ddp all-reduces the unit's accumulated gradient at once, fsdp reduce-scatters it
    /// (fsdp does so at every micro-step, keeping only its shard).
    fn unit_grad(
        &mut self,
        unit: usize,
        range: Range<usize>,
        grad: Grads,
        sync: bool,
    ) -> Result<(), CollectiveError>;
    /// The gradients of the units whose last use was the stage whose backward just ended (in
    /// stage order), handed over together: ddp all-reduces them in one op and fsdp
    /// reduce-scatters them in one, as torch's reducer fills a bucket from the gradients ready
    /// at once. By default, one `unit_grad` each.
    fn unit_grads(
        &mut self,
        grads: Vec<(usize, Range<usize>, Grads)>,
        sync: bool,
    ) -> Result<(), CollectiveError> {
        for (unit, range, grad) in grads {
            self.unit_grad(unit, range, grad, sync)?;
        }
        Ok(())
    }
    /// The layout units of one stage will be asked for next, after the ones asked for now: fsdp
    /// starts gathering them beside the compute (torch `forward_prefetch`,
    /// `BackwardPrefetch.BACKWARD_PRE`): in one all-gather for the stage on a communication
    /// thread, one per unit on NCCL's stream. A stage that
    /// nothing prefetched is announced just before it is asked for. Every rank makes the same
    /// calls.
    fn prefetch(&mut self, units: &[usize]) -> Result<(), CollectiveError> {
        let _ = units;
        Ok(())
    }
    /// Told before each micro-step: the update it leads to (`lr`, `clip`), whether it is the
    /// step's `last` (its gradients are the step's final ones), and whether the step may be
    /// skipped (`skippable`: f16's loss scaling skips a step whose gradient overflowed). fsdp
    /// with full sharding steps each unit's shard as soon as its final gradient shard is
    /// reduced, and frees the gradient (torchtitan's `early_step_in_backward`), where nothing
    /// needs the whole gradient first (no clipping, no skipping); the parameters come out the
    /// same bits.
    fn before_micro(&mut self, lr: f64, clip: Option<f64>, last: bool, skippable: bool) {
        let _ = (lr, clip, last, skippable);
    }
    /// Whether this rank's gradient so far (its shard, for fsdp) has NaN or infinite values
    /// (waiting for the reductions still running).
    fn grads_non_finite(&mut self) -> Result<bool, CollectiveError>;
    /// Clips and updates with the gradients the step handed over (and synchronises what is left
    /// to synchronise).
    fn update(&mut self, lr: f64, clip: Option<f64>) -> Result<(), CollectiveError>;
    /// Drops the gradients the step handed over without an update (f16's loss scaling skips a
    /// step whose gradient overflowed, as torch's `GradScaler.step` does): the parameters and
    /// optimizer state stay as they are, and the next step starts from no gradient. Every rank
    /// calls it at the same step (its reductions still running finish first).
    fn discard_grads(&mut self) -> Result<(), CollectiveError>;
    /// Where this rank keeps its parameters and optimizer state now, in words (the rank log
    /// of a device run says it after the first step).
    fn placement(&mut self) -> String {
        "parameters and optimizer state: on the host, where the update runs (parameters uploaded for each forward)".into()
    }
    /// Whether no rank holds the whole parameters between steps and a unit can be gathered on
    /// its own (fsdp with full sharding by layer): evaluation then runs stage by stage on
    /// `unit_params` instead of asking for `params`.
    fn shards_params(&self) -> bool {
        false
    }
    /// Frees whole parameters that `params` gathered (fsdp with full sharding), so that the
    /// steps after an evaluation hold only shards again; nothing for strategies that keep
    /// whole parameters.
    fn release_params(&mut self) {}
    /// Calls `f` with the full parameters, in flat order, in one or several consecutive pieces
    /// (fsdp gathers one unit at a time, so no rank holds the whole model for it). Every rank
    /// takes part.
    fn visit_params(&mut self, f: &mut dyn FnMut(&[f32])) -> Result<(), CollectiveError> {
        f(self.params()?);
        Ok(())
    }
    /// Sums `values` over ranks (every rank gets the result); identity for one rank.
    fn sum(&mut self, values: &mut [f64]) -> Result<(), CollectiveError> {
        let comm = self.comm_mut();
        if comm.world() > 1 {
            comm.all_reduce_f64(values, crate::collective::ReduceOp::Sum)?;
        }
        Ok(())
    }
    /// Gathers equal-length f64 vectors from every rank, in rank order.
    fn gather(&mut self, values: &[f64]) -> Result<Vec<f64>, CollectiveError> {
        let comm = self.comm_mut();
        if comm.world() == 1 {
            return Ok(values.to_vec());
        }
        let mut out = vec![0.0; values.len() * comm.world()];
        comm.all_gather_f64(values, &mut out)?;
        Ok(out)
    }
    fn memory(&self) -> Memory;
    /// What this rank writes into a checkpoint, and how it is laid out.
    fn snapshot(&mut self) -> Result<Snapshot, CollectiveError>;
    /// Takes the optimizer state from whole (unsharded) buffers, after `init` with the saved
    /// parameters; each strategy keeps its part.
    fn load_optimizer(&mut self, opt: &OptState);
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.comm_mut().barrier()
    }
    /// Stops the other ranks (their pending collectives fail).
    fn abort(&self, reason: &str) {
        self.comm().abort(reason);
    }
}

/// Builds one rank's strategy for a model of `layout`, weight decay applied as `decay` says
/// (`Model::decay_rule`). ddp and fsdp run their communication
/// beside the compute with `strategy.overlap` (`wait` times the compute's waits for it).
pub fn build(
    c: &Config,
    layout: &ParamLayout,
    decay: DecayRule,
    comm: Box<dyn Collective>,
    hybrid: Option<Hybrid>,
    wait: Option<WaitHook>,
) -> Box<dyn Strategy> {
    let overlapped = |comm| Overlapped::new(comm, c.strategy.overlap, wait.clone());
    // weight decay spares these parameters (`optim.decay`); a whole-parameter strategy's
    // optimizer steps the trainable tail (`ParamLayout::trainable`)
    let no_decay = layout.no_decay(decay);
    let tail = within(&no_decay, layout.trainable());
    let whole = || Optimizer::new(&c.optim).with_no_decay(tail.clone());
    let mesh = Mesh::over(c, comm.world());
    match c.strategy.kind {
        StrategyKind::Single => Box::new(Single::new(c, layout, whole(), overlapped(comm))),
        StrategyKind::Dp => Box::new(Dp::new(c, layout, whole(), comm)),
        StrategyKind::Fsdp if mesh.sharded => match hybrid {
            Some(h) => Box::new(Fsdp::new(
                c,
                layout,
                &no_decay,
                overlapped(h.shard),
                Some((comm, h.replica)),
            )),
            None => Box::new(Fsdp::new(c, layout, &no_decay, overlapped(comm), None)),
        },
        // and fsdp without sharding (torch's `NO_SHARD`): whole parameters, all-reduced
        // gradients
        StrategyKind::Ddp | StrategyKind::Fsdp => {
            Box::new(Ddp::new(c, layout, whole(), overlapped(comm)))
        }
    }
}

/// What a strategy does for a rank that computes on a device backend and keeps its model state
/// there (no `strategy.offload`): its own object, which `Strategy::on_device` hands out. The
/// trainer asks it to `keep` the state there once, when it starts; the step asks it for units'
/// parameters in device buffers, and the evaluation whether they are there.
pub trait DeviceResident {
    /// From now on the rank computes on a device and keeps its state there, in buffers like
    /// `proto`. fsdp moves its shards and their optimizer state to the device now (not under
    /// HSDP or `grad_op`, which keep them on the host: see `Fsdp::keep`); the whole-parameter
    /// strategies make their device copy at the first forward, so the default does nothing.
    fn keep(&mut self, proto: &dyn DeviceTensor) {
        let _ = proto;
    }
    /// Unit `unit`'s parameters in a device buffer like `proto`, when this strategy keeps or
    /// gathers them there (its collective works on device buffers: NCCL); `None`: use
    /// `Strategy::unit_params`.
    fn unit_params(
        &mut self,
        unit: usize,
        range: Range<usize>,
        proto: &dyn DeviceTensor,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError>;
    /// Whether this rank's parameters are on the device now (`keep`, or a device copy made):
    /// evaluation then reads them there.
    fn resident(&self) -> bool;
}

/// Calls `f` with `strategy`'s whole parameters, in flat order (every rank takes part: fsdp
/// gathers them for it), then frees what was gathered, so that the steps after hold only shards
/// again: the scoped form of `Strategy::params` and `Strategy::release_params`.
pub fn with_params<T>(
    strategy: &mut dyn Strategy,
    f: impl FnOnce(&[f32]) -> T,
) -> Result<T, CollectiveError> {
    let out = f(strategy.params()?);
    strategy.release_params();
    Ok(out)
}

/// The parts of `ranges` inside `window`, shifted to start from `window.start` (the undecayed
/// ranges of a buffer that holds `window` of the flat parameters).
pub fn within(ranges: &[Range<usize>], window: Range<usize>) -> Vec<Range<usize>> {
    ranges
        .iter()
        .filter_map(|r| {
            let (s, e) = (r.start.max(window.start), r.end.min(window.end));
            (s < e).then(|| s - window.start..e - window.start)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    //! The device-gradient path (NCCL on CUDA) against the host path, with device buffers
    //! emulated in host memory: same parameters for every strategy, padding and bucketing.

    use std::time::Duration;

    use super::*;
    use crate::collective::emulated::{Emulated, HostFlat};
    use crate::collective::{LocalGroup, LocalRank};
    use crate::config::{Devices, FsdpUnit, OptimKind, Sharding};

    /// Deterministic initial parameters.
    fn init(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37) % 23) as f32 * 0.02 - 0.2)
            .collect()
    }

    /// An MLP 5 -> 7 -> 3: 5*7+7+7*3+3 = 66 parameters, units of 42 and 24, not multiples of 4.
    fn mlp_layout() -> ParamLayout {
        ParamLayout::new(vec![
            ("layers.0.weight".into(), vec![5, 7]),
            ("layers.0.bias".into(), vec![7]),
            ("layers.1.weight".into(), vec![7, 3]),
            ("layers.1.bias".into(), vec![3]),
        ])
    }

    /// `rank` run on a thread per rank of `c`'s world, over a local group; the results in rank
    /// order.
    fn on_ranks<T: Send>(c: &Config, rank: impl Fn(LocalRank) -> T + Sync) -> Vec<T> {
        let ranks = LocalGroup::ranks(c.strategy.devices.count(), Duration::from_secs(20));
        let rank = &rank;
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|l| s.spawn(move || rank(l)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// What a rank saw (gathered units, then its final parameters), how many gathers ran on the
    /// device, and its checkpoint files.
    type Out = (Vec<f32>, usize, Option<(Vec<f32>, OptState)>);

    /// Where a test's gradients and collective ops are.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Path {
        Host,
        /// Device buffers and a device collective (NCCL).
        Device,
        /// Device buffers and a host collective (wgpu, CUDA without NCCL): host-staged.
        Staged,
    }

    /// Every rank's parameters after two updates from rank-dependent gradients, preceded by the
    /// unit parameters each step gathered (and how many gathers ran on the device).
    fn run_strategy(c: &Config, layout: &ParamLayout, path: Path) -> Vec<Out> {
        let device = path != Path::Host;
        let n = layout.num_params();
        on_ranks(c, |l| {
            let r = l.rank();
            let comm: Box<dyn Collective> = if path == Path::Device {
                Box::new(Emulated::new(Box::new(l)))
            } else {
                Box::new(l)
            };
            let mut st = build(c, layout, DecayRule::All, comm, None, None);
            st.init(&init(n)).unwrap();
            let mut seen = Vec::new();
            let mut on_device = 0;
            let proto = HostFlat(vec![0.0]);
            if device {
                st.on_device().expect("a device strategy").keep(&proto);
            }
            for step in 0..2 {
                // as the step asks: the next unit announced before this one computes
                st.prefetch(&[0]).unwrap();
                for u in 0..layout.num_units() {
                    let range = layout.unit_range(u);
                    let d = if device {
                        st.on_device()
                            .expect("a device strategy")
                            .unit_params(u, range.clone(), &proto)
                            .unwrap()
                    } else {
                        None
                    };
                    let params = match d {
                        Some(mut d) => {
                            on_device += 1;
                            d.to_host().unwrap()
                        }
                        None => st.unit_params(u, range).unwrap(),
                    };
                    if u + 1 < layout.num_units() {
                        st.prefetch(&[u + 1]).unwrap();
                    }
                    seen.extend(params);
                }
                let g: Vec<f32> = (0..n)
                    .map(|i| ((i * 31 + r * 7 + step * 13) % 17) as f32 * 0.01 - 0.08)
                    .collect();
                // each unit's gradient as its backward would hand it in (a frozen unit's: none)
                for u in (0..layout.num_units()).rev() {
                    if layout.unit_frozen(u) {
                        continue;
                    }
                    let range = layout.unit_range(u);
                    let part = g[range.clone()].to_vec();
                    let grads = if device {
                        Grads::Device(Box::new(HostFlat(part)))
                    } else {
                        Grads::Host(part)
                    };
                    st.unit_grad(u, range, grads, true).unwrap();
                }
                st.update(0.1, Some(0.5)).unwrap();
            }
            seen.extend(st.params().unwrap());
            (seen, on_device, st.snapshot().unwrap().data)
        })
    }

    /// A frozen first layer (`ParamLayout::frozen`): on the host, the device (NCCL emulated)
    /// and host-staged paths alike, every strategy keeps its bits, trains the rest to the same
    /// parameters, and checkpoints optimizer state of the trainable tail only.
    #[test]
    fn frozen_units_keep_their_bits_on_every_path() {
        let layout = mlp_layout()
            .frozen_first(&[true, true, false, false])
            .unwrap();
        let (n, frozen) = (layout.num_params(), layout.frozen);
        assert_eq!(frozen, 42);
        let mut cases = vec![
            (StrategyKind::Single, Sharding::Full, 1),
            (StrategyKind::Dp, Sharding::Full, 3),
            (StrategyKind::Ddp, Sharding::Full, 3),
        ];
        for sharding in [Sharding::Full, Sharding::GradOp, Sharding::None] {
            cases.push((StrategyKind::Fsdp, sharding, 4));
        }
        for (kind, sharding, world) in cases {
            let mut c = Config::default();
            c.strategy.kind = kind;
            c.strategy.sharding = sharding;
            c.strategy.unit = FsdpUnit::Layer;
            c.strategy.devices = Devices::Count(world);
            c.strategy.bucket_cap_mb = 40.0 / (1024.0 * 1024.0);
            c.optim.kind = OptimKind::Adamw;
            c.optim.weight_decay = 0.1;
            let what = format!("{kind:?} {sharding:?}");
            let host = run_strategy(&c, &layout, Path::Host);
            let last = |o: &Out| o.0[o.0.len() - n..].to_vec();
            let params = last(&host[0]);
            assert_eq!(params[..frozen], init(n)[..frozen], "{what}: frozen moved");
            assert_ne!(
                params[frozen..],
                init(n)[frozen..],
                "{what}: nothing trained"
            );
            for path in [Path::Device, Path::Staged] {
                let other = run_strategy(&c, &layout, path);
                for (a, b) in host.iter().zip(&other) {
                    assert_eq!(last(a), last(b), "{what} {path:?}");
                    assert!(a.2 == b.2, "{what} {path:?}: checkpoints differ");
                }
            }
            // the optimizer state written covers the trainable tail
            let state: usize = host
                .iter()
                .filter_map(|o| o.2.as_ref())
                .map(|(_, o)| o.m.len())
                .sum();
            assert_eq!(state, n - frozen, "{what}");
        }
    }

    #[test]
    fn device_gradients_give_the_host_results() {
        let layout = mlp_layout();
        let mut cases = Vec::new();
        for kind in [StrategyKind::Single, StrategyKind::Dp, StrategyKind::Ddp] {
            cases.push((kind, Sharding::Full, FsdpUnit::Model, 3));
        }
        for sharding in [Sharding::Full, Sharding::GradOp, Sharding::None] {
            for unit in [FsdpUnit::Model, FsdpUnit::Layer] {
                cases.push((StrategyKind::Fsdp, sharding, unit, 4));
            }
        }
        for (kind, sharding, unit, world) in cases {
            let mut c = Config::default();
            c.strategy.kind = kind;
            c.strategy.sharding = sharding;
            c.strategy.unit = unit;
            c.strategy.devices = Devices::Count(if kind == StrategyKind::Single {
                1
            } else {
                world
            });
            // 10 elements per bucket: several all-reduces over slices of one device buffer
            c.strategy.bucket_cap_mb = 40.0 / (1024.0 * 1024.0);
            c.optim.kind = OptimKind::Adamw;
            let host = run_strategy(&c, &layout, Path::Host);
            // over a device collective (NCCL), its ops beside the compute (deferred until waited
            // for, as on NCCL's own stream) or in step order: the same bits
            c.strategy.overlap = false;
            let inline = run_strategy(&c, &layout, Path::Device);
            c.strategy.overlap = true;
            let device = run_strategy(&c, &layout, Path::Device);
            let values = |r: &[Out]| r.iter().map(|o| o.0.clone()).collect::<Vec<_>>();
            assert_eq!(
                values(&inline),
                values(&device),
                "{kind:?} {sharding:?} {unit:?}: device ops beside the compute"
            );
            let files = |r: &[Out]| r.iter().map(|o| o.2.clone()).collect::<Vec<_>>();
            assert!(
                files(&host) == files(&device),
                "{kind:?} {sharding:?} {unit:?}: checkpoints differ"
            );
            assert_eq!(
                values(&host),
                values(&device),
                "{kind:?} {sharding:?} {unit:?}"
            );
            assert!(
                host.iter().all(|p| p.0 == host[0].0),
                "{kind:?}: ranks differ"
            );
            let n = layout.num_params();
            let last = &host[0].0[host[0].0.len() - n..];
            assert_ne!(last, init(n), "{kind:?}: nothing was trained");
            // fully sharded fsdp gathers parameters on the device; ddp/single/dp keep them there
            // (and so does fsdp without sharding, which is ddp)
            let on_device = match kind {
                StrategyKind::Fsdp => sharding != Sharding::GradOp,
                StrategyKind::Single | StrategyKind::Ddp | StrategyKind::Dp => true,
            };
            let gathers = if on_device { 2 * 2 } else { 0 };
            assert!(
                device.iter().all(|o| o.1 == gathers),
                "{kind:?} {sharding:?} {unit:?}"
            );
            // host-staged, beside the compute or not: the same bits; single, ddp and fully
            // sharded fsdp keep their parameters on the device (dp keeps its on the host there)
            for overlap in [true, false] {
                c.strategy.overlap = overlap;
                let before = crate::params::transfers::counted();
                let staged = run_strategy(&c, &layout, Path::Staged);
                let what = format!("staged, overlap {overlap}: {kind:?} {sharding:?} {unit:?}");
                assert!(files(&host) == files(&staged), "{what}: checkpoints differ");
                assert_eq!(values(&host), values(&staged), "{what}");
                let resident = match kind {
                    StrategyKind::Single | StrategyKind::Ddp => true,
                    // (without sharding it is ddp)
                    StrategyKind::Fsdp => sharding != Sharding::GradOp,
                    StrategyKind::Dp => false,
                };
                let gathers = if resident { 2 * 2 } else { 0 };
                assert!(staged.iter().all(|o| o.1 == gathers), "{what}");
                // (counted on the ranks' threads, not this one)
                assert_eq!(crate::params::transfers::counted(), before);
            }
        }
    }

    /// Every rank's parameters after each of two steps, fsdp by layer, with the update run
    /// where `early` puts it: in the backward (each unit as its reduced gradient is back) or
    /// after it; and, per step, whether the parameters had changed before `update` ran.
    fn run_fsdp(
        c: &Config,
        layout: &ParamLayout,
        early: bool,
        accum: usize,
        nan: bool,
    ) -> Vec<(Vec<f32>, Vec<bool>, bool)> {
        let n = layout.num_params();
        on_ranks(c, |l| {
            let r = l.rank();
            let mut st = build(c, layout, DecayRule::All, Box::new(l), None, None);
            st.init(&init(n)).unwrap();
            let (mut out, mut moved, mut bad) = (Vec::new(), Vec::new(), false);
            for step in 0..2 {
                let before = with_params(st.as_mut(), <[f32]>::to_vec).unwrap();
                for k in 0..accum {
                    let last = k + 1 == accum;
                    // clipping needs the whole gradient first: the late update
                    st.before_micro(0.1, (!early).then_some(1e9), last, false);
                    for u in 0..layout.num_units() {
                        st.unit_params(u, layout.unit_range(u)).unwrap();
                    }
                    for u in (0..layout.num_units()).rev() {
                        let range = layout.unit_range(u);
                        let mut g: Vec<f32> = range
                            .clone()
                            .map(|i| {
                                ((i * 31 + r * 7 + step * 13 + k * 5) % 17) as f32 * 0.01 - 0.08
                            })
                            .collect();
                        if nan && r == 1 && step == 1 && u == 0 {
                            g[3] = f32::NAN;
                        }
                        st.unit_grad(u, range, Grads::Host(g), true).unwrap();
                    }
                }
                bad |= st.grads_non_finite().unwrap();
                let now = with_params(st.as_mut(), <[f32]>::to_vec).unwrap();
                moved.push(now != before);
                st.update(0.1, (!early).then_some(1e9)).unwrap();
                out.extend(with_params(st.as_mut(), <[f32]>::to_vec).unwrap());
            }
            (out, moved, bad)
        })
    }

    #[test]
    fn fsdp_steps_each_unit_in_the_backward_with_the_bits_of_the_update_after_it() {
        let layout = mlp_layout();
        for overlap in [false, true] {
            for accum in [1, 3] {
                let mut c = Config::default();
                c.strategy.kind = StrategyKind::Fsdp;
                c.strategy.unit = FsdpUnit::Layer;
                c.strategy.devices = Devices::Count(2);
                c.strategy.overlap = overlap;
                c.optim.kind = OptimKind::Adamw;
                let what = format!("overlap {overlap}, accum {accum}");
                let early = run_fsdp(&c, &layout, true, accum, false);
                let late = run_fsdp(&c, &layout, false, accum, false);
                for (e, l) in early.iter().zip(&late) {
                    assert_eq!(e.0, l.0, "{what}: the same bits");
                    assert_eq!(e.1, [true, true], "{what}: stepped in the backward");
                    assert_eq!(l.1, [false, false], "{what}: stepped in the update");
                    assert!(!e.2 && !l.2);
                }
                assert_ne!(early[0].0[..layout.num_params()], init(layout.num_params()));
                // a NaN in a rank's gradient is still found before the step is taken as good
                let nan = run_fsdp(&c, &layout, true, accum, true);
                assert!(nan.iter().any(|o| o.2), "{what}: the NaN went unseen");
            }
        }
    }
}
