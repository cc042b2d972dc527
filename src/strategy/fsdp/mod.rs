//! `fsdp`: torch FullyShardedDataParallel. The parameters of each unit (the whole model, or one
//! top-level layer) are flattened into one buffer, padded to a multiple of the world size and
//! split evenly; rank r owns shard r. A step all-gathers a unit's parameters just before a stage
//! of the forward uses it (and again for its backward when the stage is recomputed), the stage
//! drops them when it is done, each unit's gradient is reduce-scattered (mean) as soon as its
//! backward is done so each rank keeps only its shard's gradient, and the update touches only
//! the local shard, whose optimizer state exists only there. With accumulation every
//! micro-step's gradient is reduce-scattered (torch FSDP outside `no_sync`): only shards are
//! accumulated.
//!
//! `sharding = "full"` (ZeRO-3, FSDP2's `reshard_after_forward=True`) keeps only the shard
//! between steps; `"grad_op"` (ZeRO-2) keeps the whole parameters and re-gathers them after each
//! update. `"none"` (whole parameters, all-reduced gradients: torch's `NO_SHARD`) is ddp, and
//! `strategy::build` makes a ddp for it. Padding is zero and stays zero under every optimizer,
//! so it is invisible in results.
//!
//! With `strategy.overlap` (host collectives) the step's `prefetch` calls start the next stage's
//! all-gather on the rank's communication thread while the current stage computes, in the
//! forward and in a recomputing backward (torch `forward_prefetch`, `BACKWARD_PRE`), and each
//! stage's reduce-scatter runs there while the backward goes on; the update waits for the last.
//! One more stage's parameters are alive at a time, as in torch; the bits are the same.
//!
//! Over NCCL with device shards the same overlap runs on NCCL's own stream (`DeviceOps::start`):
//! `prefetch` queues the next stage's all-gathers into device buffers, and each unit's
//! reduce-scatter is queued as its backward ends, while the compute goes on on the backend's
//! stream; a unit's gather is waited for when the stage asks for it, the reduce-scatters when
//! the update needs them (one op per unit there; the same ops as without overlap).
//!
//! The units of a stage (the gpt's `wte` and `wpe`) travel together, with overlap or without:
//! one all-gather of the rank's shards side by side, one reduce-scatter of the units'
//! gradients laid out so that each rank receives its shard of each (torch FSDP2 copies a
//! module's parameters in and out of one buffer the same way). Each element is reduced as on
//! its own, so the bits do not change.
//!
//! Where the shards live is one value, `Shards`, chosen once: on the host, or (sharding =
//! "full" on a device backend, not HSDP: `Fsdp::new` decides `host_only` and says why) on the
//! device from `DeviceResident::keep` on. Each method below matches on it once and delegates to the host
//! path (`shards.rs`) or the device path (`device.rs`); the host collectives both use are in
//! `host.rs`.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use super::{DeviceResident, InFlight, Memory, Reduced, Snapshot, Strategy, WholeGrads};
use crate::checkpoint::{Layout, OptState, ShardUnit as Unit};
use crate::collective::{
    device_error, Collective, CollectiveError, GradsOps, OpKind, Overlapped, RawOp, ReduceOp,
    Started,
};
use crate::config::{Config, FsdpUnit, Sharding};
use crate::params::{
    clip_by_norm, sum_squares, DeviceParams, DeviceTensor, Grads, Optimizer, ParamLayout,
};

mod device;
mod host;
mod shards;

use device::gather_host_shard;
use host::Ahead;
use shards::{HostShards, HostState, Shards};

/// HSDP's replica group, shared with the communication thread.
type Replica = Arc<Mutex<Box<dyn Collective>>>;

fn lock(r: &Replica) -> std::sync::MutexGuard<'_, Box<dyn Collective>> {
    r.lock().unwrap_or_else(|p| p.into_inner())
}

/// HSDP: a gradient shard (the mean over the shard group) averaged across the replicas, in
/// place; nothing without them.
fn across_replicas(replica: Option<&Replica>, shard: &mut [f32]) -> Result<(), CollectiveError> {
    match replica {
        Some(r) => lock(r).all_reduce(shard, ReduceOp::Mean),
        None => Ok(()),
    }
}

/// The flat units of a model for `unit` granularity: the whole model, or each of the layout's
/// units (a layer, a block).
pub fn units(layout: &ParamLayout, unit: FsdpUnit, world: usize) -> Vec<Unit> {
    match unit {
        FsdpUnit::Model => vec![Unit::new("model", 0..layout.num_params(), world)],
        FsdpUnit::Layer => layout
            .units
            .iter()
            .map(|u| Unit::new(&u.name, u.range.clone(), world))
            .collect(),
    }
}

pub struct Fsdp {
    /// The ranks that shard the model state: every rank, or (HSDP) this rank's shard group.
    comm: Overlapped,
    /// HSDP (`strategy.shard_size`): every rank (the trainer's sums and barriers), and the
    /// ranks that hold this rank's shard in the other groups. Each gradient shard is averaged
    /// across them right after its reduce-scatter, by the same thread (the communication
    /// thread with overlap): every rank then issues the two groups' ops in one order, so no
    /// rank can wait in one group for a rank that waits in the other.
    world: Option<Box<dyn Collective>>,
    replica: Option<Replica>,
    /// `sharding = "full"`: only the shard is kept between steps (else `"grad_op"`: the whole
    /// parameters are, gathered again after each update).
    reshard: bool,
    units: Vec<Unit>,
    num_params: usize,
    /// Leading flat elements that never train (`ParamLayout::frozen`): the fsdp units inside
    /// them are sharded and gathered, never reduced or stepped, and have no optimizer state.
    frozen: usize,
    /// This rank's shards, their optimizer states and gradients: on the host, or on the device.
    shards: Shards,
    /// Whether the shards stay on the host on a device backend too (decided at build, where
    /// `new` says why); else `DeviceResident::keep` moves them to the device.
    host_only: bool,
    /// Whole parameters: at rest for grad_op; for full only while a step needs them.
    whole: Option<Vec<f32>>,
    /// unit = "model" over a device collective: the gathered parameters on the device, for the
    /// current step only.
    device_whole: Option<Box<dyn DeviceTensor>>,
    /// The fsdp unit of each layout unit.
    unit_of: Vec<usize>,
    /// Layout units per fsdp unit, and how many of them handed in their gradient this
    /// micro-step.
    members: Vec<usize>,
    arrived: Vec<usize>,
    /// Per fsdp unit: the micro-step's gradient being assembled (unit = "model": from every
    /// layout unit), until the unit is complete and reduce-scattered.
    pending: Vec<WholeGrads>,
    /// All-gathers `prefetch` started on the communication thread, until the step asks.
    ahead: Ahead,
    /// Reduce-scatters running beside the compute: the fsdp units whose shards come back, and
    /// the learning rate to step them with as soon as they are back (`step_in_backward`).
    inflight: InFlight<(Vec<usize>, Option<f64>)>,
}

impl Drop for Fsdp {
    fn drop(&mut self) {
        // (a failed step leaves ops in flight: their buffers outlive them)
        if let Shards::Device(d) = &mut self.shards {
            d.settle(&mut self.comm);
        }
    }
}

impl Fsdp {
    /// `no_decay`: the flat ranges weight decay spares (`optim.decay`). `hybrid`: HSDP's whole
    /// world and replica group, `comm` then being the shard group.
    pub fn new(
        c: &Config,
        layout: &ParamLayout,
        no_decay: &[Range<usize>],
        comm: Overlapped,
        hybrid: Option<(Box<dyn Collective>, Box<dyn Collective>)>,
    ) -> Self {
        let units = units(layout, c.strategy.unit, comm.world());
        let rank = comm.rank();
        assert!(
            c.strategy.sharding != Sharding::None,
            "sharding = \"none\" is ddp: strategy::build makes one"
        );
        // each optimizer steps its unit's shard
        let opts = units
            .iter()
            .map(|u| {
                let own = u.owned(rank);
                let window = u.start + own.start..u.start + own.end;
                Optimizer::new(&c.optim).with_no_decay(super::base::within(no_decay, window))
            })
            .collect();
        let unit_of: Vec<usize> = match c.strategy.unit {
            FsdpUnit::Model => vec![0; layout.num_units()],
            FsdpUnit::Layer => (0..layout.num_units()).collect(),
        };
        // (the layout units that hand in gradients: those that train)
        let mut members = vec![0; units.len()];
        for (lu, &u) in unit_of.iter().enumerate() {
            if !layout.unit_frozen(lu) {
                members[u] += 1;
            }
        }
        let reshard = c.strategy.sharding == Sharding::Full;
        // The one place fsdp's placement is decided. The shards stay on the host:
        // - under HSDP (`strategy.shard_size`): each reduced gradient shard is averaged across
        //   the replicas on host buffers (`across_replicas`), on the thread that reduce-scatters
        //   it, in one op order over both groups; the device path has no replica step (the
        //   rank log and the strategies chapter say so);
        // - with `strategy.sharding = "grad_op"`: the whole parameters stay on the host.
        let host_only = hybrid.is_some() || !reshard;
        let (world, replica) = match hybrid {
            Some((w, r)) => (Some(w), Some(r)),
            None => (None, None),
        };
        Fsdp {
            unit_of,
            arrived: vec![0; units.len()],
            pending: units.iter().map(|_| WholeGrads::default()).collect(),
            members,
            ahead: Ahead::new(units.len()),
            inflight: InFlight::default(),
            comm,
            world,
            replica: replica.map(|r| Arc::new(Mutex::new(r))),
            reshard,
            units,
            num_params: layout.num_params(),
            frozen: layout.frozen,
            shards: Shards::Host(HostShards::new(HostState {
                shards: Vec::new(),
                opts,
            })),
            host_only,
            whole: None,
            device_whole: None,
        }
    }

    /// Back to the host path (the host copy is the truth again: `init`, `load_optimizer`),
    /// with nothing of the state being replaced in flight.
    fn reset(&mut self) {
        self.device_whole = None;
        self.ahead.clear();
        self.inflight = InFlight::default();
        self.shards.move_to_host(&mut self.comm);
    }

    fn shard_of(&self, u: &Unit, whole: &[f32]) -> Vec<f32> {
        let mut shard = vec![0f32; u.shard_len];
        let own = u.owned(self.comm.rank());
        shard[..own.len()].copy_from_slice(&whole[u.start + own.start..u.start + own.end]);
        shard
    }

    /// The learning rate to step a unit with as soon as its gradient shard is reduced, if this
    /// micro-step's gradients are final and the update needs nothing of the whole gradient:
    /// host shards, full sharding by layer (a unit = "model" gathers once a step anyway).
    fn step_in_backward(&self) -> Option<f64> {
        match &self.shards {
            Shards::Host(h) => h
                .backward_lr
                .filter(|_| self.reshard && self.units.len() > 1 && self.whole.is_none()),
            Shards::Device(_) => None,
        }
    }

    /// Steps fsdp unit `i`'s host shard with its final gradient shard (`step_in_backward`).
    fn step_unit(&mut self, i: usize, lr: f64) {
        if let Shards::Host(h) = &mut self.shards {
            h.step_unit(i, self.units[i].shard_len, lr);
        }
    }

    /// Broadcasts rank 0's `buf` to every rank: across the replicas (HSDP), then within the
    /// shard group.
    fn broadcast_init(&mut self, buf: &mut [f32]) -> Result<(), CollectiveError> {
        if let Some(r) = &self.replica {
            lock(r).broadcast(buf, 0)?;
        }
        self.comm.broadcast(buf, 0)
    }

    fn shard_elems(&self) -> usize {
        self.units.iter().map(|u| u.shard_len).sum()
    }

    /// Whether fsdp unit `u` trains (units never straddle `frozen`: fsdp refuses
    /// `unit = "model"` with frozen parameters).
    fn trains(&self, u: &Unit) -> bool {
        u.start >= self.frozen
    }
}

impl Strategy for Fsdp {
    fn on_device(&mut self) -> Option<&mut dyn DeviceResident> {
        Some(self)
    }
    fn comm(&self) -> &dyn Collective {
        match &self.world {
            Some(w) => w.as_ref(),
            None => &self.comm,
        }
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        match &mut self.world {
            Some(w) => w.as_mut(),
            None => &mut self.comm,
        }
    }

    fn init(&mut self, init: &[f32]) -> Result<(), CollectiveError> {
        self.reset();
        // sync_module_states: rank 0's initialisation is the truth
        let (shards, whole) = if !self.reshard {
            let mut full = init.to_vec();
            self.broadcast_init(&mut full)?;
            let shards = self.units.iter().map(|u| self.shard_of(u, &full)).collect();
            (shards, Some(full))
        } else {
            // a unit at a time: no rank makes a copy of the whole model
            let mut shards = Vec::with_capacity(self.units.len());
            for i in 0..self.units.len() {
                let range = self.units[i].range();
                let mut unit = init[range].to_vec();
                self.broadcast_init(&mut unit)?;
                let u = Unit {
                    start: 0,
                    ..self.units[i].clone()
                };
                shards.push(self.shard_of(&u, &unit));
            }
            (shards, None)
        };
        self.whole = whole;
        let Shards::Host(host) = &mut self.shards else {
            unreachable!("reset made the host path")
        };
        host.state.shards = shards;
        Ok(())
    }

    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        if self.whole.is_none() {
            self.whole = Some(self.gather_all()?);
        }
        Ok(self.whole.as_deref().unwrap_or(&[]))
    }

    fn unit_params(
        &mut self,
        unit: usize,
        range: Range<usize>,
    ) -> Result<Vec<f32>, CollectiveError> {
        if let Some(full) = &self.whole {
            return Ok(full[range].to_vec());
        }
        match self.units.len() {
            // unit = "model": gather everything once; it stays until the update reshards
            1 => Ok(self.params()?[range].to_vec()),
            // unit = "layer": gather only this unit (or take the gather `prefetch` started),
            // hand it straight to the autodiff graph
            _ => match self
                .ahead
                .take(&mut self.comm, &self.units, self.unit_of[unit])?
            {
                Some(p) => Ok(p),
                None => self.gather_unit(unit),
            },
        }
    }

    fn prefetch(&mut self, units: &[usize]) -> Result<(), CollectiveError> {
        let device = matches!(self.shards, Shards::Device(_));
        // over NCCL with device shards: queued on NCCL's stream, waited for when asked
        if let Shards::Device(d) = &mut self.shards {
            if self.whole.is_none() && self.units.len() > 1 && self.comm.overlaps_on_device() {
                for &u in units {
                    let i = self.unit_of[u];
                    d.start_gather(&mut self.comm, &self.units[i], i)?;
                }
                return Ok(());
            }
        }
        // whole parameters need no gather; unit = "model" gathers once, when asked; over a
        // device collective the gather happens on the device, when asked
        // device shards of one rank need no gather
        if self.whole.is_some()
            || self.units.len() == 1
            || self.comm.device_ops().is_some()
            || (device && self.comm.world() == 1)
        {
            return Ok(());
        }
        let mut group: Vec<usize> = Vec::with_capacity(units.len());
        for &u in units {
            let i = self.unit_of[u];
            if !self.ahead.holds(i) && !group.contains(&i) {
                group.push(i);
            }
        }
        // one unit is gathered ahead only beside the compute (inline it would be the same
        // gather, just earlier); several go together either way
        if group.is_empty() || (group.len() == 1 && !self.comm.overlaps()) {
            return Ok(());
        }
        let (rank, world) = (self.comm.rank(), self.comm.world());
        let block: usize = group.iter().map(|&i| self.units[i].shard_len).sum();
        let mut send = Vec::with_capacity(block);
        for &i in &group {
            // (host-staged on the device path: the device shard read to the host)
            self.shards.read_shard(i, rank, &mut send)?;
        }
        let one = match group[..] {
            [i] => Some(self.units[i].len),
            _ => None,
        };
        // the output buffer is made when the gather runs, after the reduce-scatters queued
        // before it have let go of theirs (made here, it would coexist with them: a unit more
        // at the backward's peak); kiln's allocator maps a block of 64 KiB or more apart
        // (Linux, 4 KiB pages: `memory`), so the compute thread that frees it gives it back
        let n = block * world;
        let p = self.comm.submit(OpKind::AllGather, move |c| {
            let mut out = vec![0f32; n];
            c.all_gather(&send, &mut out)?;
            if let Some(len) = one {
                out.truncate(len);
            }
            Ok(out)
        });
        self.ahead.push(group, p);
        Ok(())
    }

    fn grad_weight(&self, _local: usize, _global: usize) -> f64 {
        1.0
    }

    fn unit_grad(
        &mut self,
        unit: usize,
        range: Range<usize>,
        grad: Grads,
        // every micro-step's gradient is reduce-scattered (only shards are accumulated), as
        // torch FSDP does outside `no_sync`
        _sync: bool,
    ) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let i = self.unit_of[unit];
        self.arrived[i] += 1;
        let complete = self.arrived[i] == self.members[i];
        if complete {
            self.arrived[i] = 0;
        }
        let u = &self.units[i];
        // the unit's gradient: this layout unit's, or assembled from its layout units
        let len = u.len;
        let offset = range.start - u.start;
        self.pending[i].add(rank, len, offset..offset + range.len(), grad)?;
        if !complete {
            return Ok(());
        }
        // complete: reduce-scatter now (or beside the compute); this rank keeps its shard's
        // mean gradient
        let shard_len = u.shard_len;
        let mut pending = self.pending[i].take(len);
        let staged = self.comm.world() > 1 && self.comm.device_ops().is_none();
        if let Shards::Device(d) = &mut self.shards {
            if !(staged && self.comm.overlaps()) {
                return d.reduce_scatter(&mut self.comm, &self.units[i], i, pending);
            }
            // host-staged beside the compute: the unit's gradient read to the host here and
            // reduce-scattered like a host one; `collect` writes its shard back
            if let Grads::Device(d) = &pending {
                let err = |e| device_error(rank, OpKind::ReduceScatter, e);
                pending =
                    Grads::Host(crate::params::grads_to_host(d.as_ref(), 0..len).map_err(err)?);
            }
        }
        match pending {
            Grads::Host(g) if self.comm.overlaps() => {
                // padded and given its shard here, so the communication thread allocates
                // nothing (its allocator would keep what it made)
                let padded = shard_len * self.comm.world();
                let send = if padded == len {
                    g
                } else {
                    let mut send = vec![0f32; padded];
                    send[..len].copy_from_slice(&g);
                    send
                };
                let mut out = vec![0f32; shard_len];
                let replica = self.replica.clone();
                let p = self.comm.submit(OpKind::ReduceScatter, move |c| {
                    c.reduce_scatter(&send, &mut out, ReduceOp::Mean)?;
                    across_replicas(replica.as_ref(), &mut out)?;
                    Ok(out)
                });
                let lr = self.step_in_backward();
                self.inflight.push((vec![i], lr), p);
                self.collect(false)
            }
            mut pending => {
                let mut shard = pending.reduce_scatter_to_host(
                    &mut self.comm,
                    0..len,
                    shard_len,
                    ReduceOp::Mean,
                )?;
                across_replicas(self.replica.as_ref(), &mut shard)?;
                drop(pending);
                self.shards.add_grad(i, rank, shard)?;
                if let Some(lr) = self.step_in_backward() {
                    self.step_unit(i, lr);
                }
                Ok(())
            }
        }
    }

    fn unit_grads(
        &mut self,
        grads: Vec<(usize, Range<usize>, Grads)>,
        sync: bool,
    ) -> Result<(), CollectiveError> {
        // several whole units (unit = "layer", sharded) on the host: one reduce-scatter
        let together = grads.len() > 1
            && self.units.len() > 1
            && grads.iter().all(|(u, r, g)| {
                matches!(g, Grads::Host(v) if v.len() == r.len())
                    && self.units[self.unit_of[*u]].range() == *r
            });
        if !together {
            for (unit, range, grad) in grads {
                self.unit_grad(unit, range, grad, sync)?;
            }
            return Ok(());
        }
        let mut group = Vec::with_capacity(grads.len());
        let mut host = Vec::with_capacity(grads.len());
        for (u, _, g) in grads {
            group.push(self.unit_of[u]);
            if let Grads::Host(v) = g {
                host.push(v);
            }
        }
        self.reduce_scatter_together(group, host)
    }

    fn before_micro(&mut self, lr: f64, clip: Option<f64>, last: bool, skippable: bool) {
        // clipping scales by the norm of the whole gradient, and whether the step is skipped
        // depends on every unit's: both are known only after the backward
        if let Shards::Host(h) = &mut self.shards {
            h.backward_lr = (last && clip.is_none() && !skippable).then_some(lr);
        }
    }

    fn grads_non_finite(&mut self) -> Result<bool, CollectiveError> {
        let rank = self.comm.rank();
        self.collect(true)?;
        match &mut self.shards {
            Shards::Host(h) => Ok(h.grads_non_finite()),
            Shards::Device(d) => {
                d.collect(&mut self.comm, true)?;
                d.grads_non_finite(rank)
            }
        }
    }

    fn update(&mut self, lr: f64, clip: Option<f64>) -> Result<(), CollectiveError> {
        self.collect(true)?;
        // a gather started for a unit the step never asked for is of parameters this update
        // replaces
        self.ahead.clear();
        self.device_whole = None;
        for (p, u) in self.pending.iter_mut().zip(&self.units) {
            p.take(u.len);
        }
        match &mut self.shards {
            Shards::Device(d) => {
                d.collect(&mut self.comm, true)?;
                d.drop_ahead(&mut self.comm)?;
                d.update(&mut self.comm, &self.units, self.frozen, lr, clip)?;
                // whole parameters an evaluation gathered are of the parameters this replaced
                self.whole = None;
                return Ok(());
            }
            Shards::Host(h) => h.update(&mut self.comm, &self.units, self.frozen, lr, clip)?,
        }
        self.whole = match self.reshard {
            // ZeRO-3: reshard, free the whole parameters
            true => None,
            // ZeRO-2: parameters stay whole between steps
            false => Some(self.gather_all()?),
        };
        Ok(())
    }

    fn discard_grads(&mut self) -> Result<(), CollectiveError> {
        self.collect(true)?;
        match &mut self.shards {
            Shards::Host(h) => h.discard(),
            Shards::Device(d) => {
                d.collect(&mut self.comm, true)?;
                d.drop_ahead(&mut self.comm)?;
                d.grads.iter_mut().for_each(|g| *g = None);
            }
        }
        // what `update` forgets, less the update itself
        self.ahead.clear();
        self.device_whole = None;
        for (p, u) in self.pending.iter_mut().zip(&self.units) {
            p.take(u.len);
        }
        if self.reshard {
            self.whole = None;
        }
        Ok(())
    }

    fn shards_params(&self) -> bool {
        self.reshard && self.units.len() > 1 && self.whole.is_none()
    }

    fn release_params(&mut self) {
        if self.reshard {
            self.whole = None;
            self.device_whole = None;
        }
    }

    fn visit_params(&mut self, f: &mut dyn FnMut(&[f32])) -> Result<(), CollectiveError> {
        if let Some(full) = &self.whole {
            f(full);
            return Ok(());
        }
        // one unit at a time: no rank holds the whole model for this
        for i in 0..self.units.len() {
            f(&self.gather_unit(i)?);
        }
        Ok(())
    }

    fn placement(&mut self) -> String {
        if let Shards::Device(_) = self.shards {
            let gathered = if self.comm.world() == 1 {
                "one rank's shard is its unit (nothing to gather)"
            } else if self.comm.device_ops().is_some() {
                "all-gathered on the device for the forward"
            } else {
                "all-gathered host-staged for the forward (the shard read to the host, the unit written back)"
            };
            return format!("parameters: shards on the device, {gathered}; optimizer state: on the device shard, where the update runs (read to the host only for evaluation, checkpoints and the end)");
        }
        let gathered = if self.comm.device_ops().is_some() && self.reshard {
            "all-gathered into device buffers for the forward"
        } else {
            "gathered on the host and uploaded for each forward"
        };
        let hybrid = match &self.replica {
            Some(r) => format!(
                " (hybrid: sharded over groups of {} ranks, replicated {} times; on the host \
                 on a device backend too, where each gradient shard is averaged across the \
                 replicas)",
                self.comm.world(),
                lock(r).world()
            ),
            None => String::new(),
        };
        format!(
            "parameters: {} on the host{hybrid}, {gathered}; optimizer state: on the host shard, where the update runs",
            if self.reshard { "shards" } else { "whole" }
        )
    }

    fn memory(&self) -> Memory {
        let whole = self.num_params * 4;
        let shard = self.shard_elems() * 4;
        let params_bytes = if self.reshard { shard } else { whole };
        let grads_bytes: usize = self
            .units
            .iter()
            .filter(|u| self.trains(u))
            .map(|u| u.shard_len * 4)
            .sum();
        Memory {
            rank: self.rank(),
            params_bytes,
            grads_bytes,
            optim_bytes: self.shards.state_bytes(),
            peak_bytes: None,
            host_transfers: None,
        }
    }

    fn snapshot(&mut self) -> Result<Snapshot, CollectiveError> {
        let rank = self.comm.rank();
        let host = self.shards.host(rank, true)?;
        let layout = Layout::Sharded {
            world: self.comm.world(),
            units: self.units.clone(),
        };
        // (HSDP: the first shard group writes; the others hold the same shards)
        if self.replica.as_ref().is_some_and(|r| lock(r).rank() > 0) {
            return Ok(Snapshot { layout, data: None });
        }
        // (the optimizer state: of the units that train, which have it)
        let trains: Vec<bool> = self.units.iter().map(|u| u.start >= self.frozen).collect();
        let steps = host
            .opts
            .iter()
            .zip(&trains)
            .find(|(_, &t)| t)
            .map(|(o, _)| o.steps)
            .unwrap_or(0);
        // each unit's owned part, without the padding of the last ranks
        let owned = |bufs: &mut dyn Iterator<Item = (&Unit, &Vec<f32>)>| -> Vec<f32> {
            let mut out = Vec::new();
            for (u, b) in bufs {
                out.extend_from_slice(&b[..u.owned(rank).len().min(b.len())]);
            }
            out
        };
        let stepped = || {
            self.units
                .iter()
                .zip(&host.opts)
                .zip(&trains)
                .filter(|(_, &t)| t)
                .map(|(p, _)| p)
        };
        let pick = |f: fn(&Optimizer) -> &Vec<f32>| -> Vec<f32> {
            if stepped().any(|(_, o)| f(o).is_empty()) {
                Vec::new()
            } else {
                owned(&mut stepped().map(|(u, o)| (u, f(o))))
            }
        };
        let opt = OptState {
            steps,
            m: pick(|o| &o.m),
            v: pick(|o| &o.v),
        };
        let params = owned(&mut self.units.iter().zip(&host.shards));
        Ok(Snapshot {
            layout,
            data: Some((params, opt)),
        })
    }

    fn load_optimizer(&mut self, opt: &OptState) {
        // device shards (if any) are made again from the host state
        let rank = self.comm.rank();
        self.reset();
        let Shards::Host(host) = &mut self.shards else {
            unreachable!("reset made the host path")
        };
        // (the state covers the units that train, from the first of them)
        let f = self.frozen;
        for (u, o) in self.units.iter().zip(&mut host.state.opts) {
            if u.start >= f {
                let own = u.owned(rank);
                o.import(
                    opt,
                    u.start + own.start - f..u.start + own.end - f,
                    u.shard_len,
                );
            }
        }
    }
}

impl DeviceResident for Fsdp {
    fn keep(&mut self, proto: &dyn DeviceTensor) {
        // (`host_only` was decided at build)
        if !self.host_only {
            self.shards.move_to_device(proto);
        }
    }
    fn unit_params(
        &mut self,
        unit: usize,
        range: Range<usize>,
        proto: &dyn DeviceTensor,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError> {
        // whole parameters on the host (grad_op, none) need no gather
        if self.whole.is_some() {
            return Ok(None);
        }
        let i = self.unit_of[unit];
        let comm = &mut self.comm;
        match &mut self.shards {
            Shards::Device(d) => {
                // unit = "model": gathered once per step; layers are slices of it
                if self.units.len() == 1 {
                    if self.device_whole.is_none() {
                        self.device_whole = Some(d.gather(comm, &self.units[0], 0, proto)?);
                    }
                    return Ok(self.device_whole.as_ref().map(|d| d.slice(range)));
                }
                // a gather `prefetch` queued on NCCL's stream
                if let Some(p) = d.take_gathered(comm, &self.units[i], i)? {
                    return Ok(Some(p));
                }
                // host-staged: a gather `prefetch` started beside the compute, written to the
                // device, or one now
                if let Some(p) = self.ahead.take(comm, &self.units, i)? {
                    crate::params::transfers::record(crate::params::Moved::ParamsToDevice, p.len());
                    let rank = comm.rank();
                    return proto
                        .upload(&p)
                        .map(Some)
                        .map_err(|e| device_error(rank, OpKind::AllGather, e));
                }
                Ok(Some(d.gather(comm, &self.units[i], i, proto)?))
            }
            // host shards over NCCL: gathered into device buffers
            Shards::Host(h) if comm.device_ops().is_some() => match self.units.len() {
                // unit = "model": gather once per step on the device; layers are slices of it
                1 => {
                    if self.device_whole.is_none() {
                        let g = gather_host_shard(comm, &h.state.shards[0], &self.units[0], proto)?;
                        self.device_whole = Some(g);
                    }
                    Ok(self.device_whole.as_ref().map(|d| d.slice(range)))
                }
                _ => Ok(Some(gather_host_shard(
                    comm,
                    &h.state.shards[i],
                    &self.units[i],
                    proto,
                )?)),
            },
            Shards::Host(_) => Ok(None),
        }
    }
    fn resident(&self) -> bool {
        matches!(self.shards, Shards::Device(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_unit_with_padding() {
        let u = Unit::new("u", 10..17, 3); // 7 elements
        assert_eq!((u.shard_len, u.padded_len(3)), (3, 9));
        assert_eq!(u.owned(0), 0..3);
        assert_eq!(u.owned(2), 6..7);
        let u = Unit::new("u", 0..2, 4);
        assert_eq!(u.owned(3), 2..2);
    }
}
