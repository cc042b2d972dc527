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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

pub use cudarc::nccl::safe::Id;

use super::{Collective, CollectiveError, DeviceOps, OpId, OpKind, RawOp, ReduceOp, Started};
use crate::params::{DevDType, RawBuf};

fn device_error(rank: usize, op: OpId, message: String) -> CollectiveError {
    CollectiveError::Device {
        rank,
        op,
        reason: format!("NCCL: {message}"),
    }
}

const SETUP: OpId = OpId {
    seq: 0,
    kind: OpKind::Barrier,
};

/// A unique id for one group of communicators (created once, shared by every rank).
pub fn new_id() -> Result<Id, CollectiveError> {
    if !crate::cuda::nccl_loadable() {
        return Err(device_error(0, SETUP, crate::cuda::nccl_hint()));
    }
    Id::new().map_err(|e| device_error(0, SETUP, format!("ncclGetUniqueId: {e:?}")))
}

/// What the ranks of one process share: the first failure (every other rank stops at its next
/// poll) and a count of ranks ready to create their communicator.
#[derive(Default)]
pub struct RankGroup {
    aborted: Mutex<Option<String>>,
    ready: AtomicUsize,
    ready_cv: Condvar,
    ready_lock: Mutex<()>,
}

impl RankGroup {
    pub fn new() -> Arc<Self> {
        Arc::new(RankGroup::default())
    }
    fn reason(&self) -> Option<String> {
        self.aborted.lock().ok().and_then(|g| g.clone())
    }
    /// Stops every rank of this process: each aborts its communicator at its next poll.
    pub fn stop(&self, reason: &str) {
        self.set(reason);
    }
    fn set(&self, reason: &str) {
        if let Ok(mut g) = self.aborted.lock() {
            g.get_or_insert_with(|| reason.to_string());
        }
        self.ready_cv.notify_all();
    }
}

/// How a communicator is made: started without blocking, then polled (behind a trait, so that
/// an emulated communicator can stand in for tests).
trait CommInit {
    type Comm: Copy;
    /// Starts creating the communicator.
    fn start(&self) -> Result<Self::Comm, String>;
    /// `Ok(true)` when it is ready, `Ok(false)` while it is being made.
    fn poll(&self, comm: Self::Comm) -> Result<bool, String>;
    fn abort(&self, comm: Self::Comm);
}

/// Makes a communicator through `api` within `timeout`: a rank or node that never joins (it
/// failed after the rendezvous) or a local rank that failed aborts it instead of leaving this
/// rank blocked in NCCL forever.
fn init_within<A: CommInit>(
    api: &A,
    rank: usize,
    shared: &RankGroup,
    timeout: Duration,
) -> Result<A::Comm, CollectiveError> {
    let comm = api.start().map_err(|e| {
        shared.set(&format!("rank {rank}: NCCL communicator init failed"));
        device_error(rank, SETUP, format!("communicator init failed: {e}"))
    })?;
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
    loop {
        match api.poll(comm) {
            Ok(true) => return Ok(comm),
            Ok(false) => {}
            Err(e) => {
                api.abort(comm);
                shared.set(&format!("rank {rank}: NCCL communicator init failed"));
                return Err(device_error(
                    rank,
                    SETUP,
                    format!("communicator init failed: {e}"),
                ));
            }
        }
        if let Some(reason) = shared.reason() {
            api.abort(comm);
            return Err(CollectiveError::Aborted {
                rank,
                op: SETUP,
                reason,
            });
        }
        if start.elapsed() >= timeout {
            api.abort(comm);
            shared.set(&format!("rank {rank}: NCCL communicator init timed out"));
            return Err(device_error(
                rank,
                SETUP,
                format!(
                    "communicator init did not finish within {}s (strategy.timeout_secs): a rank or node of the job never joined; its log says why",
                    timeout.as_secs()
                ),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// `ncclCommGetAsyncError` of `comm`: its state (`ncclInProgress` while a non-blocking call
/// is under way), or `Err` with the call's own failure.
fn async_state(comm: sys::ncclComm_t) -> Result<sys::ncclResult_t, sys::ncclResult_t> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    // SAFETY: a communicator from ncclCommInitRankConfig, not yet destroyed; valid out-pointer.
    let r = unsafe { sys::ncclCommGetAsyncError(comm, &mut state) };
    if r == sys::ncclResult_t::ncclSuccess {
        Ok(state)
    } else {
        Err(r)
    }
}

/// `ncclCommInitRankConfig` with `blocking = 0`, polled with `ncclCommGetAsyncError`.
struct RealInit {
    id: sys::ncclUniqueId,
    rank: usize,
    world: usize,
}

/// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`: every other field undefined (NCCL's
/// defaults, or the environment's).
fn nonblocking_config() -> sys::ncclConfig_t {
    const UNDEF: i32 = i32::MIN;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // the layout of cudarc's `ncclConfig_t` (NCCL 2.30's header)
        version: 23000,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    }
}

impl CommInit for RealInit {
    type Comm = sys::ncclComm_t;

    fn start(&self) -> Result<sys::ncclComm_t, String> {
        let mut config = nonblocking_config();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer and config; rank < world; the id is shared by all ranks.
        let r = unsafe {
            sys::ncclCommInitRankConfig(
                &mut comm,
                self.world as i32,
                self.id,
                self.rank as i32,
                &mut config,
            )
        };
        match r {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(comm),
            e => {
                if !comm.is_null() {
                    self.abort(comm);
                }
                Err(format!("ncclCommInitRankConfig: {e:?}"))
            }
        }
    }

    fn poll(&self, comm: sys::ncclComm_t) -> Result<bool, String> {
        let state = async_state(comm).map_err(|r| format!("ncclCommGetAsyncError: {r:?}"))?;
        match state {
            sys::ncclResult_t::ncclSuccess => Ok(true),
            sys::ncclResult_t::ncclInProgress => Ok(false),
            e => Err(format!("{e:?}")),
        }
    }

    fn abort(&self, comm: sys::ncclComm_t) {
        // SAFETY: a communicator from ncclCommInitRankConfig, aborted once (the caller drops it).
        let _ = unsafe { nccl::comm_abort(comm) };
    }
}

/// `ncclCommSplit` of a ready communicator with `blocking = 0`: the new one is polled like a
/// new communicator (and the parent with it, which the split also uses).
struct SplitInit {
    parent: sys::ncclComm_t,
    color: i32,
    key: i32,
}

impl CommInit for SplitInit {
    type Comm = sys::ncclComm_t;

    fn start(&self) -> Result<sys::ncclComm_t, String> {
        let mut config = nonblocking_config();
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a ready communicator; valid out-pointer and config; every rank of the parent
        // calls this at the same point (the `Collective::split` contract).
        let r = unsafe {
            sys::ncclCommSplit(self.parent, self.color, self.key, &mut comm, &mut config)
        };
        match r {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(comm),
            e => {
                if !comm.is_null() {
                    self.abort(comm);
                }
                Err(format!("ncclCommSplit: {e:?}"))
            }
        }
    }

    fn poll(&self, comm: sys::ncclComm_t) -> Result<bool, String> {
        use sys::ncclResult_t::{ncclInProgress, ncclSuccess};
        let parent = async_state(self.parent).map_err(|r| format!("parent: {r:?}"))?;
        if comm.is_null() {
            // (NCCL gives no handle until the split is under way)
            return match parent {
                ncclSuccess => Err("ncclCommSplit returned no communicator".into()),
                ncclInProgress => Ok(false),
                e => Err(format!("parent: {e:?}")),
            };
        }
        let child = async_state(comm).map_err(|r| format!("ncclCommGetAsyncError: {r:?}"))?;
        match (parent, child) {
            (ncclSuccess, ncclSuccess) => Ok(true),
            (ncclSuccess | ncclInProgress, ncclSuccess | ncclInProgress) => Ok(false),
            (e, ncclSuccess | ncclInProgress) | (_, e) => Err(format!("{e:?}")),
        }
    }

    fn abort(&self, comm: sys::ncclComm_t) {
        if !comm.is_null() {
            // SAFETY: a communicator from ncclCommSplit, aborted once (the caller drops it).
            let _ = unsafe { nccl::comm_abort(comm) };
        }
    }
}

/// An owned communicator; aborted (never waited on) when dropped. A rank that ends well
/// finalizes and destroys it instead (`NcclRank`'s drop).
struct RawComm(sys::ncclComm_t);

impl RawComm {
    fn abort(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a communicator created by ncclCommInitRank, aborted at most once.
            let _ = unsafe { nccl::comm_abort(self.0) };
            self.0 = std::ptr::null_mut();
        }
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        self.abort();
    }
}

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
        self.finish_started(u64::MAX)?;
        let api = SplitInit {
            parent: self.comm.0,
            color,
            key,
        };
        let comm = RawComm(init_within(&api, self.rank, &self.shared, self.timeout)?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A communicator whose init never finishes, or fails after `fail_after` polls.
    struct Emulated {
        fail_after: Option<usize>,
        polls: Cell<usize>,
        aborted: Cell<usize>,
    }

    impl CommInit for Emulated {
        type Comm = ();
        fn start(&self) -> Result<(), String> {
            Ok(())
        }
        fn poll(&self, _: ()) -> Result<bool, String> {
            self.polls.set(self.polls.get() + 1);
            match self.fail_after {
                Some(n) if self.polls.get() > n => Err("ncclSystemError".into()),
                _ => Ok(false),
            }
        }
        fn abort(&self, _: ()) {
            self.aborted.set(self.aborted.get() + 1);
        }
    }

    fn emulated(fail_after: Option<usize>) -> Emulated {
        Emulated {
            fail_after,
            polls: Cell::new(0),
            aborted: Cell::new(0),
        }
    }

    #[test]
    fn an_init_that_never_finishes_is_aborted_at_the_timeout_naming_the_rank() {
        let api = emulated(None);
        let shared = RankGroup::new();
        let t = Instant::now();
        let e = init_within(&api, 3, &shared, Duration::from_millis(200))
            .err()
            .unwrap()
            .to_string();
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            e.contains("rank 3") && e.contains("communicator init"),
            "{e}"
        );
        assert!(e.contains("within 0s"), "{e}");
        assert_eq!(api.aborted.get(), 1);
        // the other ranks of the process are told
        assert!(shared.reason().unwrap().contains("rank 3"));
    }

    #[test]
    fn a_failed_local_rank_or_a_failed_init_stops_the_wait() {
        let api = emulated(None);
        let shared = RankGroup::new();
        shared.stop("rank 0 could not start on GPU 0");
        let e = init_within(&api, 1, &shared, Duration::from_secs(60))
            .err()
            .unwrap();
        assert!(matches!(e, CollectiveError::Aborted { rank: 1, .. }), "{e}");
        assert_eq!(api.aborted.get(), 1);
        let api = emulated(Some(3));
        let e = init_within(&api, 2, &RankGroup::new(), Duration::from_secs(60))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("rank 2") && e.contains("communicator init failed: ncclSystemError"),
            "{e}"
        );
        assert_eq!(api.aborted.get(), 1);
    }
}
