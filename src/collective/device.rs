//! Collectives on device buffers. On CUDA the gradients a backward pass produces are Burn tensors
//! in GPU memory; NCCL reduces them where they are (the pointer comes from cubecl's
//! `get_resource`), and only the reduced result crosses to the host, where kiln's optimizers run.
//!
//! `DeviceOps` is what a collective that can work on raw device buffers offers
//! (`Collective::device_ops`). `GradsOps` reduces a step's `Grads` (params layer) with a
//! collective: on the device when the gradient is there and the collective can, else on the host.

use std::ops::Range;

use super::{Collective, CollectiveError, OpId, OpKind, ReduceOp};
use crate::params::transfers::{record, Moved};
use crate::params::{grads_to_host, DeviceTensor, Grads, RawBuf};

/// One collective op on raw device buffers, to run beside the compute (`DeviceOps::start`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawOp {
    /// In place: every rank ends with the reduction.
    AllReduce { buf: RawBuf, op: ReduceOp },
    /// `send` (world x `recv.len`) reduced across ranks; rank r keeps chunk r in `recv`.
    ReduceScatter {
        send: RawBuf,
        recv: RawBuf,
        op: ReduceOp,
    },
    /// `recv` (world x `send.len`) holds every rank's `send`, in rank order.
    AllGather { send: RawBuf, recv: RawBuf },
}

impl RawOp {
    pub fn kind(&self) -> OpKind {
        match self {
            RawOp::AllReduce { .. } => OpKind::AllReduce,
            RawOp::ReduceScatter { .. } => OpKind::ReduceScatter,
            RawOp::AllGather { .. } => OpKind::AllGather,
        }
    }
    /// The bytes the op moves (its larger buffer).
    pub fn bytes(&self) -> usize {
        let b = |r: &RawBuf| r.len * r.dtype.size();
        match self {
            RawOp::AllReduce { buf, .. } => b(buf),
            RawOp::ReduceScatter { send, .. } => b(send),
            RawOp::AllGather { recv, .. } => b(recv),
        }
    }
}

/// An op `DeviceOps::start` started: its ticket (tickets grow in start order) and kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started {
    pub ticket: u64,
    pub kind: OpKind,
}

/// Collective ops on raw device buffers. Each synchronous call has finished (results readable
/// by the backend) when it returns; `start` runs an op beside the compute.
pub trait DeviceOps {
    /// Starts `op` and returns without waiting for it: on NCCL it is queued on the
    /// communicator's own stream, after every op started before it, while the caller goes on
    /// queueing compute on the backend's stream. The buffers' writes must have finished (their
    /// `raw` waits for them), and the buffers must stay alive and untouched until `wait` has
    /// returned for the op. A collective without a stream of its own runs it now. Ops finish in
    /// the order they were started, and before any synchronous op issued after them.
    fn start(&mut self, op: RawOp) -> Result<Started, CollectiveError> {
        let kind = op.kind();
        self.run_raw(op)?;
        Ok(Started { ticket: 0, kind })
    }
    /// Waits until `op` (and every op started before it) has finished. Returns the started
    /// ops that finished since the last report with their time on the device, where the
    /// collective measures it (NCCL: CUDA events around each op).
    fn wait(
        &mut self,
        op: Started,
    ) -> Result<Vec<(Started, std::time::Duration)>, CollectiveError> {
        let _ = op;
        Ok(Vec::new())
    }
    /// Whether `op` has finished, without waiting (a failure shows in `wait`).
    fn is_done(&mut self, op: Started) -> bool {
        let _ = op;
        true
    }
    /// Runs `op` now, synchronously.
    fn run_raw(&mut self, op: RawOp) -> Result<(), CollectiveError> {
        match op {
            RawOp::AllReduce { buf, op } => self.all_reduce_raw(buf, op),
            RawOp::ReduceScatter { send, recv, op } => self.reduce_scatter_raw(send, recv, op),
            RawOp::AllGather { send, recv } => self.all_gather_raw(send, recv),
        }
    }
    /// In place: every rank ends with the reduction.
    fn all_reduce_raw(&mut self, buf: RawBuf, op: ReduceOp) -> Result<(), CollectiveError>;
    /// In place: `root` ends with the reduction; the others' buffers are unspecified afterwards.
    fn reduce_raw(&mut self, buf: RawBuf, op: ReduceOp, root: usize)
        -> Result<(), CollectiveError>;
    /// `send` (world x `recv.len`) reduced across ranks; rank r keeps chunk r in `recv`.
    fn reduce_scatter_raw(
        &mut self,
        send: RawBuf,
        recv: RawBuf,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;
    /// `recv` (world x `send.len`) holds every rank's `send`, in rank order.
    fn all_gather_raw(&mut self, send: RawBuf, recv: RawBuf) -> Result<(), CollectiveError>;
    /// In place: every rank ends with `root`'s buffer.
    fn broadcast_raw(&mut self, buf: RawBuf, root: usize) -> Result<(), CollectiveError>;
}

/// A device failure under `kind` on `rank` (outside the numbered collective ops).
pub fn device_error(rank: usize, kind: OpKind, reason: String) -> CollectiveError {
    CollectiveError::Device {
        rank,
        op: OpId { seq: 0, kind },
        reason,
    }
}

/// Collective ops on a step's gradient.
pub trait GradsOps {
    /// The gradient on the host (copied from the device when it is there).
    fn into_host(self, rank: usize) -> Result<Vec<f32>, CollectiveError>;
    /// Reduces `range` of the gradient in place across ranks: on the device when the gradient
    /// is there and the collective can, otherwise on the host.
    fn all_reduce(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;
    /// Reduces the whole gradient onto `root` (host result there; other ranks get theirs back).
    fn reduce_to_host(
        self,
        comm: &mut dyn Collective,
        op: ReduceOp,
        root: usize,
    ) -> Result<Vec<f32>, CollectiveError>;
    /// Reduce-scatters `range` of a device gradient (zero-padded to `world * shard_len`): this
    /// rank's chunk of the reduction, in a device buffer (host-staged without a device
    /// collective).
    fn reduce_scatter_device(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        shard_len: usize,
        op: ReduceOp,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError>;
    /// Reduce-scatters `range` (zero-padded to `world * shard_len`): this rank's chunk of the
    /// reduction, on the host.
    fn reduce_scatter_to_host(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        shard_len: usize,
        op: ReduceOp,
    ) -> Result<Vec<f32>, CollectiveError>;
}

impl GradsOps for Grads {
    fn into_host(self, rank: usize) -> Result<Vec<f32>, CollectiveError> {
        self.to_host_vec()
            .map_err(|e| device_error(rank, OpKind::AllReduce, e))
    }

    fn all_reduce(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let rank = comm.rank();
        match self {
            Grads::Host(v) => comm.all_reduce(&mut v[range], op),
            Grads::Device(d) => {
                match comm.device_ops() {
                    Some(ops) => {
                        let raw = d
                            .raw()
                            .map_err(|e| device_error(rank, OpKind::AllReduce, e))?;
                        ops.all_reduce_raw(raw.slice(range), op)
                    }
                    None => {
                        // host-staged: the range to the host, reduced there, written back (the
                        // gradient stays on the device, where the update runs)
                        let err = |e| device_error(rank, OpKind::AllReduce, e);
                        let mut host = grads_to_host(d.as_ref(), range.clone()).map_err(err)?;
                        comm.all_reduce(&mut host, op)?;
                        record(Moved::GradsToDevice, host.len());
                        d.write_at(range.start, &host).map_err(err)
                    }
                }
            }
        }
    }

    fn reduce_to_host(
        self,
        comm: &mut dyn Collective,
        op: ReduceOp,
        root: usize,
    ) -> Result<Vec<f32>, CollectiveError> {
        let rank = comm.rank();
        match self {
            Grads::Device(mut d) if comm.device_ops().is_some() => {
                let raw = d.raw().map_err(|e| device_error(rank, OpKind::Reduce, e))?;
                if let Some(ops) = comm.device_ops() {
                    ops.reduce_raw(raw, op, root)?;
                }
                record(Moved::GradsToHost, d.len());
                d.to_host()
                    .map_err(|e| device_error(rank, OpKind::Reduce, e))
            }
            g => {
                let mut v = g.into_host(rank)?;
                comm.reduce(&mut v, op, root)?;
                Ok(v)
            }
        }
    }

    fn reduce_scatter_device(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        shard_len: usize,
        op: ReduceOp,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
        let rank = comm.rank();
        let err = |e: String| device_error(rank, OpKind::ReduceScatter, e);
        let Grads::Device(d) = self else {
            return Err(err("a host gradient where a device one was expected".into()));
        };
        let padded = shard_len * comm.world();
        if comm.world() == 1 && padded == range.len() {
            // one rank: its shard is the unit
            return Ok(d.slice(range));
        }
        if comm.device_ops().is_none() {
            let mut host = grads_to_host(d.as_ref(), range.clone()).map_err(err)?;
            host.resize(padded, 0.0);
            let mut out = vec![0f32; shard_len];
            comm.reduce_scatter(&host, &mut out, op)?;
            record(Moved::GradsToDevice, out.len());
            return d.upload(&out).map_err(err);
        }
        let mut send = d.padded(range, padded).map_err(err)?;
        let mut recv = d.zeros(shard_len).map_err(err)?;
        let (send_raw, recv_raw) = (send.raw().map_err(err)?, recv.raw().map_err(err)?);
        if let Some(ops) = comm.device_ops() {
            ops.reduce_scatter_raw(send_raw, recv_raw, op)?;
        }
        drop(send);
        Ok(recv)
    }

    fn reduce_scatter_to_host(
        &mut self,
        comm: &mut dyn Collective,
        range: Range<usize>,
        shard_len: usize,
        op: ReduceOp,
    ) -> Result<Vec<f32>, CollectiveError> {
        let rank = comm.rank();
        let padded = shard_len * comm.world();
        let err = |e: String| device_error(rank, OpKind::ReduceScatter, e);
        match self {
            Grads::Device(d) if comm.device_ops().is_some() => {
                let mut send = if padded == range.len() {
                    None
                } else {
                    Some(d.padded(range.clone(), padded).map_err(err)?)
                };
                let send_raw = match &mut send {
                    Some(s) => s.raw().map_err(err)?,
                    None => d.raw().map_err(err)?.slice(range),
                };
                let mut recv = d.zeros(shard_len).map_err(err)?;
                let recv_raw = recv.raw().map_err(err)?;
                if let Some(ops) = comm.device_ops() {
                    ops.reduce_scatter_raw(send_raw, recv_raw, op)?;
                }
                drop(send);
                record(Moved::GradsToHost, shard_len);
                recv.to_host().map_err(err)
            }
            Grads::Device(d) => {
                let host = d.to_host().map_err(err)?;
                record(Moved::GradsToHost, host.len());
                *self = Grads::Host(host);
                self.reduce_scatter_to_host(comm, range, shard_len, op)
            }
            Grads::Host(v) => {
                let mut out = vec![0f32; shard_len];
                if padded == range.len() {
                    // no padding: reduce from the gradient itself, no copy
                    comm.reduce_scatter(&v[range], &mut out, op)?;
                } else {
                    let mut send = vec![0f32; padded];
                    send[..range.len()].copy_from_slice(&v[range]);
                    comm.reduce_scatter(&send, &mut out, op)?;
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod emulated {
    //! Device buffers in host memory and device ops over a host collective: the strategies'
    //! device path, checked on machines without a GPU.

    use std::any::Any;

    use super::*;
    use crate::params::{DevDType, DeviceParams, DeviceTensor, Optimizer};

    pub struct HostFlat(pub Vec<f32>);

    impl HostFlat {
        fn raw_of(v: &mut [f32]) -> Result<RawBuf, String> {
            Ok(RawBuf {
                ptr: v.as_mut_ptr() as u64,
                len: v.len(),
                dtype: DevDType::F32,
            })
        }
    }

    impl DeviceTensor for HostFlat {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn raw(&mut self) -> Result<RawBuf, String> {
            HostFlat::raw_of(&mut self.0)
        }
        fn zeros(&self, len: usize) -> Result<Box<dyn DeviceTensor>, String> {
            Ok(Box::new(HostFlat(vec![0.0; len])))
        }
        fn upload(&self, values: &[f32]) -> Result<Box<dyn DeviceTensor>, String> {
            Ok(Box::new(HostFlat(values.to_vec())))
        }
        fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor> {
            Box::new(HostFlat(self.0[range].to_vec()))
        }
        fn padded(
            &self,
            range: Range<usize>,
            padded: usize,
        ) -> Result<Box<dyn DeviceTensor>, String> {
            let mut v = self.0[range].to_vec();
            v.resize(padded, 0.0);
            Ok(Box::new(HostFlat(v)))
        }
        fn to_host(&mut self) -> Result<Vec<f32>, String> {
            Ok(self.0.clone())
        }
        fn write_at(&mut self, offset: usize, values: &[f32]) -> Result<(), String> {
            self.0[offset..offset + values.len()].copy_from_slice(values);
            Ok(())
        }
        fn add_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String> {
            let b = other.to_host()?;
            for (x, y) in self.0[offset..offset + b.len()].iter_mut().zip(&b) {
                *x += y;
            }
            Ok(())
        }
        fn set_at(&mut self, offset: usize, other: &mut dyn DeviceTensor) -> Result<(), String> {
            let b = other.to_host()?;
            self.0[offset..offset + b.len()].copy_from_slice(&b);
            Ok(())
        }
        fn non_finite(&self) -> Result<bool, String> {
            Ok(!crate::params::all_finite(&self.0))
        }
        fn sum_squares(&self) -> Result<f64, String> {
            Ok(crate::params::sum_squares(&self.0))
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
        fn device_params(
            &self,
            params: &[f32],
            frozen: usize,
            opt: &Optimizer,
        ) -> Option<Box<dyn DeviceParams>> {
            Some(Box::new(HostParams(params.to_vec(), opt.clone(), frozen)))
        }
    }

    /// Device parameters in host memory, updated by the host optimizer (which steps the
    /// elements after the frozen head).
    pub struct HostParams(pub Vec<f32>, pub Optimizer, pub usize);

    impl DeviceParams for HostParams {
        fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor> {
            Box::new(HostFlat(self.0[range].to_vec()))
        }
        fn step_scaled(
            &mut self,
            grads: &mut dyn DeviceTensor,
            lr: f64,
            coef: Option<f64>,
        ) -> Result<(), String> {
            let mut g = grads.to_host()?;
            if let Some(c) = coef {
                g.iter_mut().for_each(|v| *v *= c as f32);
            }
            self.1.step(&mut self.0[self.2..], &g, lr);
            Ok(())
        }
        fn params(&mut self) -> Result<Vec<f32>, String> {
            Ok(self.0.clone())
        }
        fn raw(&mut self) -> Result<RawBuf, String> {
            HostFlat::raw_of(&mut self.0)
        }
        fn export(&mut self) -> Result<crate::params::OptState, String> {
            Ok(self.1.export())
        }
        fn state_bytes(&self) -> usize {
            self.1.state_bytes()
        }
    }

    /// A host collective that also takes `HostFlat` addresses as device buffers. Ops started
    /// beside the compute (`DeviceOps::start`) are deferred, as on NCCL's own stream: they run
    /// in start order when waited for (up to the one waited for, no further), before any
    /// synchronous op, or when asked whether they are done while a later one is pending (so
    /// the early collection of a strategy runs too; the newest op is never done before it is
    /// waited for). A strategy that reads a result before waiting for it, or frees a buffer in
    /// flight, gets other bits than the host path.
    pub struct Emulated {
        inner: Box<dyn Collective>,
        deferred: std::collections::VecDeque<(u64, RawOp)>,
        tickets: u64,
    }

    impl Emulated {
        pub fn new(inner: Box<dyn Collective>) -> Self {
            Emulated {
                inner,
                deferred: Default::default(),
                tickets: 0,
            }
        }
        /// Runs the deferred ops up to `ticket` (all: `u64::MAX`), in order.
        fn flush(&mut self, ticket: u64) -> Result<(), CollectiveError> {
            while self.deferred.front().is_some_and(|(t, _)| *t <= ticket) {
                if let Some((_, op)) = self.deferred.pop_front() {
                    self.run_now(op)?;
                }
            }
            Ok(())
        }
        /// `op` on the host collective, now (nothing else flushed).
        fn run_now(&mut self, op: RawOp) -> Result<(), CollectiveError> {
            match op {
                RawOp::AllReduce { buf, op } => self.inner.all_reduce(view(buf), op),
                RawOp::ReduceScatter { send, recv, op } => {
                    let send = view(send).to_vec();
                    self.inner.reduce_scatter(&send, view(recv), op)
                }
                RawOp::AllGather { send, recv } => {
                    let send = view(send).to_vec();
                    self.inner.all_gather(&send, view(recv))
                }
            }
        }
    }

    // SAFETY (all three): a `RawBuf` here always comes from a live `HostFlat` of f32 on this
    // thread, which the caller keeps alive and does not touch during the call (or, for a
    // started op, until it has waited for it).
    fn view<'a>(b: RawBuf) -> &'a mut [f32] {
        unsafe { std::slice::from_raw_parts_mut(b.ptr as *mut f32, b.len) }
    }

    impl DeviceOps for Emulated {
        fn start(&mut self, op: RawOp) -> Result<Started, CollectiveError> {
            self.tickets += 1;
            self.deferred.push_back((self.tickets, op));
            Ok(Started {
                ticket: self.tickets,
                kind: op.kind(),
            })
        }
        fn wait(
            &mut self,
            op: Started,
        ) -> Result<Vec<(Started, std::time::Duration)>, CollectiveError> {
            self.flush(op.ticket)?;
            Ok(Vec::new())
        }
        fn is_done(&mut self, op: Started) -> bool {
            if op.ticket < self.tickets {
                // (every rank asks at the same points, so they run the same ops in one order)
                return self.flush(op.ticket).is_ok();
            }
            !self.deferred.iter().any(|(t, _)| *t <= op.ticket)
        }
        fn all_reduce_raw(&mut self, buf: RawBuf, op: ReduceOp) -> Result<(), CollectiveError> {
            self.flush(u64::MAX)?;
            self.inner.all_reduce(view(buf), op)
        }
        fn reduce_raw(
            &mut self,
            buf: RawBuf,
            op: ReduceOp,
            root: usize,
        ) -> Result<(), CollectiveError> {
            self.flush(u64::MAX)?;
            self.inner.reduce(view(buf), op, root)
        }
        fn reduce_scatter_raw(
            &mut self,
            send: RawBuf,
            recv: RawBuf,
            op: ReduceOp,
        ) -> Result<(), CollectiveError> {
            self.flush(u64::MAX)?;
            let send = view(send).to_vec();
            self.inner.reduce_scatter(&send, view(recv), op)
        }
        fn all_gather_raw(&mut self, send: RawBuf, recv: RawBuf) -> Result<(), CollectiveError> {
            self.flush(u64::MAX)?;
            let send = view(send).to_vec();
            self.inner.all_gather(&send, view(recv))
        }
        fn broadcast_raw(&mut self, buf: RawBuf, root: usize) -> Result<(), CollectiveError> {
            self.flush(u64::MAX)?;
            self.inner.broadcast(view(buf), root)
        }
    }

    impl crate::collective::Decorator for Emulated {
        fn place(&self) -> (usize, usize) {
            (self.inner.rank(), self.inner.world())
        }
        /// Runs the deferred ops first.
        fn around<T>(
            &mut self,
            _op: OpKind,
            _bytes: usize,
            run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
        ) -> Result<T, CollectiveError> {
            self.flush(u64::MAX)?;
            run(self.inner.as_mut())
        }
        fn stop(&self, reason: &str) {
            self.inner.abort(reason)
        }
        fn device(&mut self) -> Option<&mut dyn DeviceOps> {
            Some(self)
        }
    }
}
