//! The `Collective` trait over NCCL (cudarc, feature `cuda`): one communicator per rank thread,
//! all created from one unique id.
//!
//! Gradients are reduced where the backward pass left them: `DeviceOps` runs NCCL on the device
//! buffers of Burn tensors (addresses from cubecl's `get_resource`, see `cuda::raw_buf`). What
//! lives on the host by design (parameters, the shards of fsdp, losses and norms) goes through
//! the host-buffer ops, which copy to the GPU, run NCCL there and copy back.
//!
//! NCCL ops are asynchronous: after enqueueing one, the rank polls its completion, the shared
//! abort flag (set by any rank of this process that fails) and NCCL's asynchronous error. When
//! the op does not finish within `strategy.timeout_secs`, or another rank aborted, the rank
//! aborts its communicator (`ncclCommAbort`, which also releases peers blocked in the op) and
//! returns an error naming the op. This is what PyTorch's NCCL watchdog does.

mod init;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

pub use cudarc::nccl::safe::Id;
pub use init::{new_id, RankGroup};

use super::{Collective, CollectiveError, DeviceOps, OpId, OpKind, RawOp, ReduceOp, Started};
use crate::params::{DevDType, RawBuf};
use init::{async_state, device_error, init_within, RawComm, RealInit, SplitInit, SETUP};

fn nccl_dtype(d: DevDType) -> sys::ncclDataType_t {
    match d {
        DevDType::F32 => sys::ncclDataType_t::ncclFloat32,
        DevDType::F16 => sys::ncclDataType_t::ncclFloat16,
        DevDType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Mean => sys::ncclRedOp_t::ncclAvg,
    }
}

/// Host element types the staged ops move.
trait HostElem: DeviceRepr + ValidAsZeroBits + Copy + Default {
    const NCCL: sys::ncclDataType_t;
}
impl HostElem for f32 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat32;
}
impl HostElem for f64 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat64;
}

/// An op queued on a rank's stream: its number and kind, CUDA events before and after it, and
/// when it was queued (its timeout counts from there).
struct Queued {
    op: OpId,
    begin: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
    since: Instant,
}

impl Queued {
    /// The op's time on the GPU, between its events (once both have completed; 0 when CUDA
    /// cannot say).
    fn device_time(&self) -> Duration {
        let ms = self.begin.elapsed_ms(&self.end).unwrap_or(0.0);
        Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3)
    }
}

/// One rank's NCCL communicator and its stream.
pub struct NcclRank {
    comm: RawComm,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    shared: Arc<RankGroup>,
    rank: usize,
    world: usize,
    seq: u64,
    timeout: Duration,
    /// Ops `start`ed and not yet waited for, by ticket, oldest first (they finish in this
    /// order: one stream).
    started: std::collections::VecDeque<(u64, Queued)>,
    tickets: u64,
    /// Started ops found finished (with their device time) since `wait` last reported.
    finished: Vec<(Started, Duration)>,
}

impl Drop for NcclRank {
    /// A rank that ended well finalizes its communicator (its last ops complete, for peers on
    /// other nodes too) and destroys it; one that failed, or whose process is stopping,
    /// aborts it. A finalize that does not finish within the timeout is aborted.
    fn drop(&mut self) {
        let comm = self.comm.0;
        if comm.is_null() || self.shared.reason().is_some() {
            return; // RawComm's drop aborts what is left
        }
        // SAFETY: a live communicator, finalized once, then destroyed once.
        let r = unsafe { sys::ncclCommFinalize(comm) };
        if !matches!(
            r,
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
        ) {
            return;
        }
        let start = Instant::now();
        loop {
            let Ok(state) = async_state(comm) else {
                return; // RawComm's drop aborts it
            };
            if self.shared.reason().is_some() {
                return;
            }
            match state {
                sys::ncclResult_t::ncclSuccess => break,
                sys::ncclResult_t::ncclInProgress if start.elapsed() < self.timeout => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => return,
            }
        }
        // SAFETY: finalized above; destroyed once, and never aborted after.
        unsafe { sys::ncclCommDestroy(comm) };
        self.comm.0 = std::ptr::null_mut();
    }
}

// SAFETY: an NCCL communicator may be used from any thread as long as it is not used by two at
// once; a `NcclRank` is owned and used by exactly one rank thread at a time.
unsafe impl Send for NcclRank {}

impl NcclRank {
    /// Joins the group `id` as `rank` of `world` on GPU `ordinal`. `local` ranks of this process
    /// share `shared`: they wait for each other before creating communicators (NCCL's init
    /// blocks until every rank joins, so a rank that failed before must stop the others here).
    pub fn connect(
        id: Id,
        rank: usize,
        world: usize,
        ordinal: usize,
        local: usize,
        shared: Arc<RankGroup>,
        timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let prepared = CudaContext::new(ordinal)
            .map_err(|e| format!("GPU {ordinal}: {e:?}"))
            .and_then(|ctx| {
                let stream = ctx.new_stream().map_err(|e| format!("stream: {e:?}"))?;
                Ok((ctx, stream))
            });
        let (ctx, stream) = match prepared {
            Ok(p) => p,
            Err(e) => {
                shared.set(&format!("rank {rank} could not start on GPU {ordinal}"));
                return Err(device_error(rank, SETUP, e));
            }
        };
        // every rank of this process ready, or one failed, or the timeout
        shared.ready.fetch_add(1, Ordering::SeqCst);
        shared.ready_cv.notify_all();
        let start = Instant::now();
        let mut guard = shared
            .ready_lock
            .lock()
            .map_err(|_| device_error(rank, SETUP, "a rank panicked while connecting".into()))?;
        while shared.ready.load(Ordering::SeqCst) < local {
            if let Some(reason) = shared.reason() {
                return Err(CollectiveError::Aborted {
                    rank,
                    op: SETUP,
                    reason,
                });
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                shared.set(&format!("rank {rank} gave up waiting for the local ranks"));
                return Err(device_error(
                    rank,
                    SETUP,
                    format!(
                        "not every local rank reached NCCL setup within {}s",
                        timeout.as_secs()
                    ),
                ));
            }
            guard = match shared
                .ready_cv
                .wait_timeout(guard, left.min(Duration::from_millis(100)))
            {
                Ok((g, _)) => g,
                Err(_) => {
                    return Err(device_error(
                        rank,
                        SETUP,
                        "a rank panicked while connecting".into(),
                    ))
                }
            };
        }
        drop(guard);
        ctx.bind_to_thread()
            .map_err(|e| device_error(rank, SETUP, format!("GPU {ordinal}: {e:?}")))?;
        let api = RealInit {
            id: sys::ncclUniqueId {
                internal: *id.internal(),
            },
            rank,
            world,
        };
        let comm = init_within(&api, rank, &shared, timeout)?;
        Ok(NcclRank {
            comm: RawComm(comm),
            ctx,
            stream,
            shared,
            rank,
            world,
            seq: 0,
            timeout,
            started: Default::default(),
            tickets: 0,
            finished: Vec::new(),
        })
    }

    /// Waits for the started ops up to `ticket` (all: `u64::MAX`), in order: an op is done
    /// only when those before it are (one stream). They stay in `finished` for `wait`.
    fn finish_started(&mut self, ticket: u64) -> Result<(), CollectiveError> {
        while self.started.front().is_some_and(|(t, _)| *t <= ticket) {
            let Some((ticket, q)) = self.started.pop_front() else {
                break;
            };
            let d = self.finish(&q)?;
            self.finished.push((
                Started {
                    ticket,
                    kind: q.op.kind,
                },
                d,
            ));
        }
        Ok(())
    }

    /// `whole` must hold world x `part` elements of the same type.
    fn check_split(
        &self,
        kind: OpKind,
        whole: RawBuf,
        part: RawBuf,
    ) -> Result<(), CollectiveError> {
        if whole.len == part.len * self.world && whole.dtype == part.dtype {
            return Ok(());
        }
        let op = OpId {
            seq: self.seq,
            kind,
        };
        Err(device_error(
            self.rank,
            op,
            format!(
                "buffers of {} and {} elements ({:?}, {:?}) for world {}: the larger must be world x the smaller",
                whole.len, part.len, whole.dtype, part.dtype, self.world
            ),
        ))
    }

    fn next(&mut self, kind: OpKind) -> OpId {
        let op = OpId {
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        op
    }

    /// Stops this rank's communicator and tells the other local ranks.
    fn fail(&mut self, reason: &str) {
        self.shared.set(reason);
        self.comm.abort();
    }

    /// Enqueues `f` on this rank's stream between two timing events: the op it is, and the
    /// events. An error aborts the communicator.
    fn enqueue(
        &mut self,
        kind: OpKind,
        f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<(), String>,
    ) -> Result<Queued, CollectiveError> {
        let op = self.next(kind);
        let rank = self.rank;
        if let Some(reason) = self.shared.reason() {
            return Err(CollectiveError::Aborted { rank, op, reason });
        }
        if self.comm.0.is_null() {
            return Err(device_error(
                rank,
                op,
                "the communicator was aborted".into(),
            ));
        }
        self.ctx
            .bind_to_thread()
            .map_err(|e| device_error(rank, op, format!("{e:?}")))?;
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let begin = self
            .stream
            .record_event(timing)
            .map_err(|e| device_error(rank, op, format!("cuEventRecord: {e:?}")))?;
        if let Err(e) = f(self.comm.0, self.stream.cu_stream() as _) {
            self.fail(&format!("rank {rank} failed in {op}"));
            return Err(device_error(rank, op, e));
        }
        // a non-blocking communicator may return before the op is on the stream
        // (`ncclInProgress`): wait until it is, then record the event after it
        let start = Instant::now();
        loop {
            // a failed call counts as the error it returns
            match async_state(self.comm.0).unwrap_or_else(|r| r) {
                sys::ncclResult_t::ncclSuccess => break,
                sys::ncclResult_t::ncclInProgress => {}
                e => {
                    self.fail(&format!("rank {rank}: NCCL reported {e:?} in {op}"));
                    return Err(device_error(rank, op, format!("asynchronous error {e:?}")));
                }
            }
            if let Some(reason) = self.shared.reason() {
                self.comm.abort();
                return Err(CollectiveError::Aborted { rank, op, reason });
            }
            if start.elapsed() >= self.timeout {
                self.fail(&format!("rank {rank}: {op} timed out"));
                return Err(device_error(
                    rank,
                    op,
                    format!("not enqueued within {}s", self.timeout.as_secs()),
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        let end = self
            .stream
            .record_event(timing)
            .map_err(|e| device_error(rank, op, format!("cuEventRecord: {e:?}")))?;
        Ok(Queued {
            op,
            begin,
            end,
            since: Instant::now(),
        })
    }

    /// Waits for a queued op: done, aborted, failed or timed out (counted from when it was
    /// queued); its time on the GPU.
    fn finish(&mut self, q: &Queued) -> Result<Duration, CollectiveError> {
        let (rank, op) = (self.rank, q.op);
        let mut polls = 0u32;
        loop {
            match q.end.try_is_complete() {
                Ok(true) => return Ok(q.device_time()),
                Ok(false) => {}
                Err(e) => {
                    self.fail(&format!("rank {rank} failed in {op}"));
                    return Err(device_error(rank, op, format!("{e:?}")));
                }
            }
            if let Some(reason) = self.shared.reason() {
                self.comm.abort();
                return Err(CollectiveError::Aborted { rank, op, reason });
            }
            // (a failed call is read as no error, as before)
            let async_err = async_state(self.comm.0).unwrap_or(sys::ncclResult_t::ncclSuccess);
            if !matches!(
                async_err,
                sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress
            ) {
                self.fail(&format!("rank {rank}: NCCL reported {async_err:?} in {op}"));
                return Err(device_error(
                    rank,
                    op,
                    format!("asynchronous error {async_err:?}"),
                ));
            }
            if q.since.elapsed() > self.timeout {
                let secs = self.timeout.as_secs();
                self.fail(&format!("rank {rank} timed out in {op}"));
                return Err(CollectiveError::Timeout {
                    rank,
                    op,
                    secs,
                    missing: vec![format!(
                        "{op} did not complete on the GPU (another rank is stuck, crashed, or is in a different op)"
                    )],
                });
            }
            polls += 1;
            if polls < 1000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Enqueues `f` on this rank's stream, then waits for it (and so for every op started
    /// before it): done, aborted, failed or timed out.
    fn run_op(
        &mut self,
        kind: OpKind,
        f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<(), String>,
    ) -> Result<(), CollectiveError> {
        let q = self.enqueue(kind, f)?;
        self.finish(&q)?;
        // the ops started before it are done too (one stream): timed for the next `wait`
        for (ticket, q) in std::mem::take(&mut self.started) {
            let kind = q.op.kind;
            self.finished
                .push((Started { ticket, kind }, q.device_time()));
        }
        Ok(())
    }

    /// Copies `send` to the GPU, runs `f(send ptr, recv ptr)`, copies `recv` back.
    fn staged<T: HostElem>(
        &mut self,
        kind: OpKind,
        send: &[T],
        recv: &mut [T],
        f: impl FnOnce(
            *const std::ffi::c_void,
            *mut std::ffi::c_void,
            sys::ncclComm_t,
            sys::cudaStream_t,
        ) -> Result<(), String>,
    ) -> Result<(), CollectiveError> {
        let rank = self.rank;
        let at = OpId {
            seq: self.seq,
            kind,
        };
        let err = |m: String| device_error(rank, at, m);
        let stream = self.stream.clone();
        let d_send = stream
            .clone_htod(send)
            .map_err(|e| err(format!("copy to GPU: {e:?}")))?;
        let d_recv = stream
            .alloc_zeros::<T>(recv.len().max(1))
            .map_err(|e| err(format!("alloc: {e:?}")))?;
        {
            let (s, _s_sync) = d_send.device_ptr(&stream);
            let (r, _r_sync) = d_recv.device_ptr(&stream);
            self.run_op(kind, |comm, st| f(s as *const _, r as *mut _, comm, st))?;
        }
        let mut host = vec![T::default(); recv.len().max(1)];
        stream
            .memcpy_dtoh(&d_recv, host.as_mut_slice())
            .map_err(|e| err(format!("copy from GPU: {e:?}")))?;
        stream
            .synchronize()
            .map_err(|e| err(format!("synchronize: {e:?}")))?;
        recv.copy_from_slice(&host[..recv.len()]);
        Ok(())
    }

    fn all_reduce_host<T: HostElem>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        let n = send.len();
        self.staged(OpKind::AllReduce, &send, buf, |s, r, comm, st| unsafe {
            nccl::all_reduce(s, r, n, T::NCCL, nccl_op(op), comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclAllReduce: {e:?}"))
        })
    }

    fn all_gather_host<T: HostElem>(
        &mut self,
        send: &[T],
        out: &mut [T],
    ) -> Result<(), CollectiveError> {
        let n = send.len();
        self.staged(OpKind::AllGather, send, out, |s, r, comm, st| unsafe {
            nccl::all_gather(s, r, n, T::NCCL, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclAllGather: {e:?}"))
        })
    }
}

// SAFETY (every `unsafe` block below and in the staged ops): the pointers are live device
// buffers of at least the counts given (checked by the callers' lengths), the communicator is
// live, and the stream belongs to this rank's context.

impl Collective for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        self.all_reduce_host(buf, op)
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        self.all_reduce_host(buf, op)
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        let mut out = buf.to_vec();
        let n = send.len();
        self.staged(OpKind::Reduce, &send, &mut out, |s, r, comm, st| unsafe {
            nccl::reduce(s, r, n, f32::NCCL, nccl_op(op), root as i32, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclReduce: {e:?}"))
        })?;
        if self.rank == root {
            buf.copy_from_slice(&out);
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        let n = send.len();
        self.staged(OpKind::Broadcast, &send, buf, |s, r, comm, st| unsafe {
            nccl::broadcast(s, r, n, f32::NCCL, root as i32, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclBroadcast: {e:?}"))
        })
    }

    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.all_gather_host(send, out)
    }

    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        self.all_gather_host(send, out)
    }

    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let n = out.len();
        self.staged(OpKind::ReduceScatter, send, out, |s, r, comm, st| unsafe {
            nccl::reduce_scatter(s, r, n, f32::NCCL, nccl_op(op), comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclReduceScatter: {e:?}"))
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        let mut one = [0f32];
        self.all_reduce(&mut one, ReduceOp::Sum)
    }

    fn abort(&self, reason: &str) {
        // the other local ranks see this at their next poll and abort their communicators
        self.shared.set(reason);
    }

    /// `ncclCommSplit`, after this rank's started ops are done (the split is an op of the
    /// parent's stream order). The new communicator shares this one's GPU, stream, timeout
    /// and abort flag (a failure in either stops both).
    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        let op = OpId {
            seq: self.seq,
            kind: OpKind::Split,
        };
        self.seq += 1;
        let too_big = |what: &str, v: usize| {
            device_error(
                self.rank,
                op,
                format!("split {what} {v} is above NCCL's limit (i32)"),
            )
        };
        let color = i32::try_from(color).map_err(|_| too_big("color", color))?;
        let key = i32::try_from(key).map_err(|_| too_big("key", key))?;
        if let Some(reason) = self.shared.reason() {
            return Err(CollectiveError::Aborted {
                rank: self.rank,
                op,
                reason,
            });
        }
        if self.comm.0.is_null() {
            return Err(device_error(
                self.rank,
                op,
                "the communicator was aborted".into(),
            ));
        }
        self.finish_started(u64::MAX)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| device_error(self.rank, op, format!("{e:?}")))?;
        let api = SplitInit {
            parent: self.comm.0,
            color,
            key,
            slot: Box::new(std::sync::atomic::AtomicPtr::new(std::ptr::null_mut())),
        };
        if let Err(e) = init_within(&api, self.rank, &self.shared, self.timeout) {
            // aborting the parent stops a setup still under way; NCCL may still write the
            // slot as it ends, so the slot is never freed
            self.comm.abort();
            std::mem::forget(api);
            return Err(match e {
                CollectiveError::Device { reason, .. } => {
                    device_error(self.rank, op, format!("split: {reason}"))
                }
                CollectiveError::Aborted { reason, .. } => CollectiveError::Aborted {
                    rank: self.rank,
                    op,
                    reason,
                },
                other => other,
            });
        }
        let comm = RawComm(api.handle());
        let (mut rank, mut world) = (0i32, 0i32);
        // SAFETY: a ready communicator; valid out-pointers
        let r = unsafe {
            (
                sys::ncclCommUserRank(comm.0, &mut rank),
                sys::ncclCommCount(comm.0, &mut world),
            )
        };
        if r != (
            sys::ncclResult_t::ncclSuccess,
            sys::ncclResult_t::ncclSuccess,
        ) {
            self.shared
                .set(&format!("rank {}: NCCL split failed", self.rank));
            return Err(device_error(
                self.rank,
                op,
                format!("after ncclCommSplit: {r:?}"),
            ));
        }
        Ok(Box::new(NcclRank {
            comm,
            ctx: Arc::clone(&self.ctx),
            stream: Arc::clone(&self.stream),
            shared: Arc::clone(&self.shared),
            rank: rank as usize,
            world: world as usize,
            seq: 0,
            timeout: self.timeout,
            started: Default::default(),
            tickets: 0,
            finished: Vec::new(),
        }))
    }

    fn device_ops(&mut self) -> Option<&mut dyn DeviceOps> {
        Some(self)
    }
}

impl DeviceOps for NcclRank {
    fn start(&mut self, op: RawOp) -> Result<Started, CollectiveError> {
        let kind = op.kind();
        let q = match op {
            RawOp::AllReduce { buf, op } => self.enqueue(kind, |comm, st| unsafe {
                let p = buf.ptr as *mut std::ffi::c_void;
                nccl::all_reduce(p, p, buf.len, nccl_dtype(buf.dtype), nccl_op(op), comm, st)
                    .map(|_| ())
                    .map_err(|e| format!("ncclAllReduce: {e:?}"))
            })?,
            RawOp::ReduceScatter { send, recv, op } => {
                self.check_split(kind, send, recv)?;
                self.enqueue(kind, |comm, st| unsafe {
                    let (s, r) = (
                        send.ptr as *const std::ffi::c_void,
                        recv.ptr as *mut std::ffi::c_void,
                    );
                    let (dt, o) = (nccl_dtype(send.dtype), nccl_op(op));
                    nccl::reduce_scatter(s, r, recv.len, dt, o, comm, st)
                        .map(|_| ())
                        .map_err(|e| format!("ncclReduceScatter: {e:?}"))
                })?
            }
            RawOp::AllGather { send, recv } => {
                self.check_split(kind, recv, send)?;
                self.enqueue(kind, |comm, st| unsafe {
                    let (s, r) = (
                        send.ptr as *const std::ffi::c_void,
                        recv.ptr as *mut std::ffi::c_void,
                    );
                    nccl::all_gather(s, r, send.len, nccl_dtype(send.dtype), comm, st)
                        .map(|_| ())
                        .map_err(|e| format!("ncclAllGather: {e:?}"))
                })?
            }
        };
        self.tickets += 1;
        let ticket = self.tickets;
        self.started.push_back((ticket, q));
        Ok(Started { ticket, kind })
    }

    fn wait(&mut self, op: Started) -> Result<Vec<(Started, Duration)>, CollectiveError> {
        self.finish_started(op.ticket)?;
        Ok(std::mem::take(&mut self.finished))
    }

    fn is_done(&mut self, op: Started) -> bool {
        match self.started.iter().find(|(t, _)| *t == op.ticket) {
            // (a failure shows in `wait`)
            Some((_, q)) => q.end.try_is_complete().unwrap_or(true),
            None => true,
        }
    }

    fn all_reduce_raw(&mut self, buf: RawBuf, op: ReduceOp) -> Result<(), CollectiveError> {
        self.run_op(OpKind::AllReduce, |comm, st| unsafe {
            let p = buf.ptr as *mut std::ffi::c_void;
            nccl::all_reduce(p, p, buf.len, nccl_dtype(buf.dtype), nccl_op(op), comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclAllReduce: {e:?}"))
        })
    }

    fn reduce_raw(
        &mut self,
        buf: RawBuf,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.run_op(OpKind::Reduce, |comm, st| unsafe {
            let p = buf.ptr as *mut std::ffi::c_void;
            let (dt, o) = (nccl_dtype(buf.dtype), nccl_op(op));
            nccl::reduce(p, p, buf.len, dt, o, root as i32, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclReduce: {e:?}"))
        })
    }

    fn reduce_scatter_raw(
        &mut self,
        send: RawBuf,
        recv: RawBuf,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.check_split(OpKind::ReduceScatter, send, recv)?;
        self.run_op(OpKind::ReduceScatter, |comm, st| unsafe {
            let (s, r) = (
                send.ptr as *const std::ffi::c_void,
                recv.ptr as *mut std::ffi::c_void,
            );
            let (dt, o) = (nccl_dtype(send.dtype), nccl_op(op));
            nccl::reduce_scatter(s, r, recv.len, dt, o, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclReduceScatter: {e:?}"))
        })
    }

    fn all_gather_raw(&mut self, send: RawBuf, recv: RawBuf) -> Result<(), CollectiveError> {
        self.check_split(OpKind::AllGather, recv, send)?;
        self.run_op(OpKind::AllGather, |comm, st| unsafe {
            let (s, r) = (
                send.ptr as *const std::ffi::c_void,
                recv.ptr as *mut std::ffi::c_void,
            );
            nccl::all_gather(s, r, send.len, nccl_dtype(send.dtype), comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclAllGather: {e:?}"))
        })
    }

    fn broadcast_raw(&mut self, buf: RawBuf, root: usize) -> Result<(), CollectiveError> {
        self.run_op(OpKind::Broadcast, |comm, st| unsafe {
            let p = buf.ptr as *mut std::ffi::c_void;
            nccl::broadcast(p, p, buf.len, nccl_dtype(buf.dtype), root as i32, comm, st)
                .map(|_| ())
                .map_err(|e| format!("ncclBroadcast: {e:?}"))
        })
    }
}
