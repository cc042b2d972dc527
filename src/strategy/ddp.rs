//! `ddp`: torch DistributedDataParallel. Rank 0's initial parameters are broadcast; every rank
//! keeps a full replica and its own optimizer; at the last micro-step of a step each unit's
//! gradient is averaged by all-reduce (in buckets of at most `bucket_cap_mb`) as soon as its
//! backward is done, in the backward's order, as torch's reducer launches a bucket once its
//! gradients are ready (earlier micro-steps accumulate locally without communication, like
//! `no_sync`).
//!
//! With `strategy.overlap` (host collectives) a unit's all-reduce runs on the rank's
//! communication thread while the backward goes on to the next unit; the update waits for the
//! last one. The buckets and their order are the same either way, so are the bits. Over NCCL
//! the device gradient's all-reduce runs on NCCL's own stream instead (`DeviceOps::start`, on
//! a copy of the stage's ranges, written back when it is done) while the backward of the
//! next stage is queued on the compute stream.
//!
//! Over a device collective (NCCL) with f32 parameters, the parameters and optimizer state move
//! to the device at the first forward and stay there: the forward reads them in place and the
//! update runs there (`DeviceParams`); the host copy is refreshed only when asked for
//! (evaluation, checkpoints, the end).

use super::{
    all_reduce_buckets, full_snapshot, whole_memory, DeviceCopy, DeviceResident, InFlight, Memory,
    Snapshot, Strategy, WholeGrads,
};
use crate::checkpoint::OptState;
use std::ops::Range;

use crate::collective::{
    device_error, Collective, CollectiveError, GradsOps, OpKind, Overlapped, RawOp, ReduceOp,
    Started,
};
use crate::config::Config;
use crate::params::{clip_and_step, grads_to_host, DeviceTensor, Grads, Optimizer, ParamLayout};

pub struct Ddp {
    comm: Overlapped,
    params: Vec<f32>,
    opt: Optimizer,
    bucket_elems: usize,
    /// Parameters and optimizer state on the device, once the forward has asked for them there.
    device: DeviceCopy,
    /// Elements of the gradient: the trainable parameters (`ParamLayout::trainable`).
    num_params: usize,
    /// Leading parameters that never train: the gradient's element i is parameter
    /// `frozen + i`'s, and the optimizer steps `params[frozen..]`.
    frozen: usize,
    /// The step's gradient, each unit's part averaged across ranks as it is handed in.
    grads: WholeGrads,
    /// Units whose all-reduce runs beside the compute (those handed in together share one):
    /// their flat ranges.
    inflight: InFlight<Vec<Range<usize>>>,
    /// Over NCCL with `strategy.overlap`: ranges of the step's gradient being all-reduced on
    /// NCCL's stream, each in a copy of its own (kept alive until it is done), oldest first.
    dev_inflight: std::collections::VecDeque<(Range<usize>, Box<dyn DeviceTensor>, Started)>,
}

impl Ddp {
    /// `opt`: the optimizer of `layout`'s trainable parameters (its undecayed ranges set).
    pub fn new(c: &Config, layout: &ParamLayout, opt: Optimizer, comm: Overlapped) -> Self {
        let num_params = layout.num_trainable();
        let bucket_elems = ((c.strategy.bucket_cap_mb * 1024.0 * 1024.0 / 4.0) as usize)
            .clamp(1, num_params.max(1));
        Ddp {
            comm,
            params: Vec::new(),
            opt,
            bucket_elems,
            device: DeviceCopy::with_frozen(layout.frozen),
            num_params,
            frozen: layout.frozen,
            grads: WholeGrads::default(),
            inflight: InFlight::default(),
            dev_inflight: Default::default(),
        }
    }

    /// Starts the all-reduce of `range` of the step's device gradient on NCCL's stream, in
    /// buckets as `all_reduce_buckets` makes them (the same ops, so the same bits), on a copy:
    /// the backward goes on adding the next units into the step's gradient meanwhile.
    fn start_device(&mut self, range: Range<usize>) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let err = |e| device_error(rank, OpKind::AllReduce, e);
        let Some(Grads::Device(whole)) = self.grads.get_mut() else {
            return Err(err("a host gradient on the device path".into()));
        };
        let mut buf = whole.padded(range.clone(), range.len()).map_err(err)?;
        let raw = buf.raw().map_err(err)?;
        let bucket = self.bucket_elems.max(1);
        let ops = self
            .comm
            .device_ops()
            .ok_or_else(|| err("no device collective".into()))?;
        let mut last = None;
        let mut start = 0;
        while start < range.len() {
            let end = (start + bucket).min(range.len());
            last = Some(ops.start(RawOp::AllReduce {
                buf: raw.slice(start..end),
                op: ReduceOp::Mean,
            })?);
            start = end;
        }
        if let Some(started) = last {
            self.dev_inflight.push_back((range, buf, started));
        }
        self.collect_device(false)
    }

    /// Writes the NCCL all-reduces that have finished (`all`: every one, waiting) into the
    /// step's gradient, oldest first.
    fn collect_device(&mut self, all: bool) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let err = |e| device_error(rank, OpKind::AllReduce, e);
        while let Some(&(_, _, started)) = self.dev_inflight.front() {
            let Some(ops) = self.comm.device_ops() else {
                return Err(err("no device collective".into()));
            };
            if !all && !ops.is_done(started) {
                break;
            }
            ops.wait(started)?;
            let Some((range, mut buf, _)) = self.dev_inflight.pop_front() else {
                break;
            };
            if let Some(Grads::Device(whole)) = self.grads.get_mut() {
                whole.set_at(range.start, buf.as_mut()).map_err(err)?;
            }
        }
        Ok(())
    }

    /// Writes the all-reduces that have finished (`all`: every one, waiting) into the step's
    /// gradient.
    fn collect(&mut self, all: bool) -> Result<(), CollectiveError> {
        let (rank, len) = (self.comm.rank(), self.num_params);
        let grads = &mut self.grads;
        self.inflight
            .collect(&mut self.comm, all, |ranges, values| {
                let mut at = 0;
                for range in ranges {
                    let n = range.len();
                    grads.set(rank, len, range, &values[at..at + n])?;
                    at += n;
                }
                Ok(())
            })
    }

    /// All-reduces `send` (the gradients of `ranges`, side by side) on the communication thread.
    fn submit(
        &mut self,
        mut send: Vec<f32>,
        ranges: Vec<Range<usize>>,
    ) -> Result<(), CollectiveError> {
        let bucket = self.bucket_elems.max(1);
        let p = self.comm.submit(OpKind::AllReduce, move |c| {
            for chunk in send.chunks_mut(bucket) {
                c.all_reduce(chunk, ReduceOp::Mean)?;
            }
            Ok(send)
        });
        self.inflight.push(ranges, p);
        self.collect(false)
    }

    /// Device gradients beside the compute, host-staged: accumulated into the step's gradient
    /// on the device, their ranges read to the host side by side and all-reduced there; the
    /// averages are written back as they arrive (`collect`).
    fn submit_device(
        &mut self,
        grads: Vec<(usize, Range<usize>, Grads)>,
        ranges: Vec<Range<usize>>,
    ) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let err = |e| device_error(rank, OpKind::AllReduce, e);
        for (_, range, grad) in grads {
            self.grads.add(rank, self.num_params, range, grad)?;
        }
        let Some(Grads::Device(whole)) = self.grads.get_mut() else {
            return Err(err("a device unit gradient met a host gradient".into()));
        };
        let mut send = Vec::with_capacity(ranges.iter().map(|r| r.len()).sum());
        for r in &ranges {
            send.extend(grads_to_host(whole.as_ref(), r.clone()).map_err(err)?);
        }
        self.submit(send, ranges)
    }

    /// Brings `params` and `opt` up to date with the device.
    /// (`with_state`: the optimizer state too, for a checkpoint or the host update.)
    fn sync_host(&mut self, with_state: bool) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        self.device.sync(
            rank,
            &mut self.params,
            if with_state {
                Some(&mut self.opt)
            } else {
                None
            },
        )
    }
}

impl Drop for Ddp {
    fn drop(&mut self) {
        // a failed step leaves all-reduces in flight: their buffers outlive them (an aborted
        // communicator returns at once)
        if let Some(&(_, _, last)) = self.dev_inflight.back() {
            if let Some(ops) = self.comm.device_ops() {
                let _ = ops.wait(last);
            }
        }
    }
}

impl Strategy for Ddp {
    fn on_device(&mut self) -> Option<&mut dyn DeviceResident> {
        Some(self)
    }
    fn comm(&self) -> &dyn Collective {
        &self.comm
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        &mut self.comm
    }
    fn init(&mut self, init: &[f32]) -> Result<(), CollectiveError> {
        let mut init = init.to_vec();
        self.comm.broadcast(&mut init, 0)?;
        self.params = init;
        self.device.reset();
        Ok(())
    }
    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        self.sync_host(false)?;
        Ok(&self.params)
    }
    fn grad_weight(&self, _local: usize, _global: usize) -> f64 {
        1.0
    }
    fn unit_grad(
        &mut self,
        unit: usize,
        range: Range<usize>,
        grad: Grads,
        sync: bool,
    ) -> Result<(), CollectiveError> {
        self.unit_grads(vec![(unit, range, grad)], sync)
    }
    fn unit_grads(
        &mut self,
        grads: Vec<(usize, Range<usize>, Grads)>,
        sync: bool,
    ) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        // in the gradient's coordinates: from the first parameter that trains
        let f = self.frozen;
        let grads: Vec<_> = grads
            .into_iter()
            .map(|(u, r, g)| (u, r.start - f..r.end - f, g))
            .collect();
        // (`no_sync = false`) the previous micro-step's reductions on NCCL's stream come back
        // before anything is added to the ranges they write
        if self.dev_inflight.iter().any(|(a, _, _)| {
            grads
                .iter()
                .any(|(_, b, _)| a.start < b.end && b.start < a.end)
        }) {
            self.collect_device(true)?;
        }
        let host = grads.iter().all(|(_, _, g)| matches!(g, Grads::Host(_)));
        // device gradients go beside the compute host-staged; over NCCL they are reduced in
        // step order, where they are
        let beside = sync && self.comm.overlaps() && (host || self.comm.device_ops().is_none());
        if !beside {
            let mut ranges = Vec::with_capacity(grads.len());
            for (_, range, grad) in grads {
                self.grads.add(rank, self.num_params, range.clone(), grad)?;
                ranges.push(range);
            }
            if sync {
                // units that lie side by side go in the same buckets, as they do beside the
                // compute
                ranges.sort_by_key(|r| r.start);
                let mut merged: Vec<Range<usize>> = Vec::with_capacity(ranges.len());
                for r in ranges {
                    match merged.last_mut() {
                        Some(m) if m.end == r.start => m.end = r.end,
                        _ => merged.push(r),
                    }
                }
                // over NCCL, beside the compute on its own stream
                if !host && self.comm.overlaps_on_device() {
                    for r in merged {
                        self.start_device(r)?;
                    }
                } else if let Some(grads) = self.grads.get_mut() {
                    for r in merged {
                        all_reduce_buckets(&mut self.comm, grads, r, self.bucket_elems)?;
                    }
                }
            }
            return Ok(());
        }
        // beside the compute: the units' gradients (plus what earlier micro-steps accumulated)
        // go to the communication thread side by side, in one op, and come back averaged
        let ranges: Vec<Range<usize>> = grads.iter().map(|(_, r, _)| r.clone()).collect();
        // (`no_sync = false`) the previous micro-step's reduction of these units first
        if self.inflight.holds_any(|k: &Vec<Range<usize>>| {
            k.iter()
                .any(|a| ranges.iter().any(|b| a.start < b.end && b.start < a.end))
        }) {
            self.collect(true)?;
        }
        if !host {
            return self.submit_device(grads, ranges);
        }
        // one unit's gradient is sent as it is; several are copied side by side
        let total = if ranges.len() > 1 {
            ranges.iter().map(|r| r.len()).sum()
        } else {
            0
        };
        let mut send: Vec<f32> = Vec::with_capacity(total);
        for (_, range, grad) in grads {
            let Grads::Host(mut g) = grad else {
                continue;
            };
            match self.grads.host_range(range.clone()) {
                Some(acc) => g.iter_mut().zip(acc).for_each(|(a, b)| *a += b),
                // what the whole gradient's zeros plus this would be, to the sign of a zero
                // (`overlap = false` adds into zeros unless the unit is the model)
                None if range.len() != self.num_params => g.iter_mut().for_each(|a| *a += 0.0),
                None => {}
            }
            if ranges.len() == 1 {
                send = g;
            } else {
                send.extend_from_slice(&g);
            }
        }
        self.submit(send, ranges)
    }
    fn grads_non_finite(&mut self) -> Result<bool, CollectiveError> {
        self.collect(true)?;
        self.collect_device(true)?;
        let rank = self.comm.rank();
        self.grads
            .non_finite()
            .map_err(|e| device_error(rank, OpKind::Update, e))
    }
    fn update(&mut self, lr: f64, clip: Option<f64>) -> Result<(), CollectiveError> {
        self.collect(true)?;
        self.collect_device(true)?;
        let mut grads = self.grads.take(self.num_params);
        let rank = self.comm.rank();
        if let (Some(dev), Grads::Device(g)) = (&mut self.device.dev, &mut grads) {
            dev.step(g.as_mut(), lr, clip)
                .map_err(|e| device_error(rank, OpKind::Update, e))?;
            self.device.stepped();
            return Ok(());
        }
        self.sync_host(true)?;
        self.device.reset();
        let mut grads = grads.into_host(rank)?;
        let tail = &mut self.params[self.frozen..];
        clip_and_step(&mut self.opt, tail, &mut grads, lr, clip);
        Ok(())
    }
    fn discard_grads(&mut self) -> Result<(), CollectiveError> {
        self.collect(true)?;
        self.collect_device(true)?;
        self.grads.take(self.num_params);
        Ok(())
    }
    fn placement(&mut self) -> String {
        self.device.placement("the update runs")
    }
    fn memory(&self) -> Memory {
        let optim = self
            .device
            .state_bytes()
            .unwrap_or_else(|| self.opt.state_bytes());
        whole_memory(self.rank(), &self.params, self.num_params, optim)
    }
    fn snapshot(&mut self) -> Result<Snapshot, CollectiveError> {
        self.sync_host(true)?;
        Ok(full_snapshot(
            self.rank(),
            &self.params,
            Some(self.opt.export()),
        ))
    }
    fn load_optimizer(&mut self, opt: &OptState) {
        self.opt.import_whole(opt);
        // a device copy (if any) is made again from the host state
        self.device.reset();
    }
}

impl DeviceResident for Ddp {
    fn unit_params(
        &mut self,
        _unit: usize,
        range: Range<usize>,
        proto: &dyn DeviceTensor,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError> {
        Ok(self.device.slice(&self.params, &self.opt, proto, range))
    }
    fn resident(&self) -> bool {
        self.device.dev.is_some()
    }
}
