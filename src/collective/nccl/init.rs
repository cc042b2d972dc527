//! Making NCCL communicators: the unique id, the ranks of one process waiting for each
//! other, a communicator created (or split from another) without blocking and polled until
//! it is ready, a failure or the timeout, and the owned handle that aborts what it holds.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use cudarc::nccl::result as nccl;
use cudarc::nccl::sys;

use super::Id;
use crate::collective::{CollectiveError, OpId, OpKind};

pub(super) fn device_error(rank: usize, op: OpId, message: String) -> CollectiveError {
    CollectiveError::Device {
        rank,
        op,
        reason: format!("NCCL: {message}"),
    }
}

pub(super) const SETUP: OpId = OpId {
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
    pub(super) ready: AtomicUsize,
    pub(super) ready_cv: Condvar,
    pub(super) ready_lock: Mutex<()>,
}

impl RankGroup {
    pub fn new() -> Arc<Self> {
        Arc::new(RankGroup::default())
    }
    pub(super) fn reason(&self) -> Option<String> {
        self.aborted.lock().ok().and_then(|g| g.clone())
    }
    /// Stops every rank of this process: each aborts its communicator at its next poll.
    pub fn stop(&self, reason: &str) {
        self.set(reason);
    }
    pub(super) fn set(&self, reason: &str) {
        if let Ok(mut g) = self.aborted.lock() {
            g.get_or_insert_with(|| reason.to_string());
        }
        self.ready_cv.notify_all();
    }
}

/// How a communicator is made: started without blocking, then polled (behind a trait, so that
/// an emulated communicator can stand in for tests).
pub(super) trait CommInit {
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
pub(super) fn init_within<A: CommInit>(
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
pub(super) fn async_state(comm: sys::ncclComm_t) -> Result<sys::ncclResult_t, sys::ncclResult_t> {
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
pub(super) struct RealInit {
    pub(super) id: sys::ncclUniqueId,
    pub(super) rank: usize,
    pub(super) world: usize,
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

/// `ncclCommSplit` of a ready communicator with `blocking = 0`. NCCL writes the new handle
/// into `slot` from its own thread when the split's setup ends (the call itself leaves it
/// null), so the slot lives on the heap, is read atomically, and outlives every write NCCL may
/// still make (`NcclRank::split` leaks it when the split fails). Ready when the parent's async
/// state has left `ncclInProgress`, the handle is there and its own state is `ncclSuccess`.
pub(super) struct SplitInit {
    pub(super) parent: sys::ncclComm_t,
    pub(super) color: i32,
    pub(super) key: i32,
    pub(super) slot: Box<AtomicPtr<sys::ncclComm>>,
}

impl SplitInit {
    /// The new communicator's handle (null until NCCL has written it).
    pub(super) fn handle(&self) -> sys::ncclComm_t {
        self.slot.load(Ordering::Acquire)
    }
}

impl CommInit for SplitInit {
    type Comm = ();

    fn start(&self) -> Result<(), String> {
        let mut config = nonblocking_config();
        // SAFETY: a ready communicator; the out-pointer is the heap slot, valid as long as NCCL
        // may write it (see the type); every rank of the parent calls this at the same point
        // (the `Collective::split` contract).
        let r = unsafe {
            sys::ncclCommSplit(
                self.parent,
                self.color,
                self.key,
                self.slot.as_ptr(),
                &mut config,
            )
        };
        match r {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
            e => Err(format!("ncclCommSplit: {e:?}")),
        }
    }

    fn poll(&self, _: ()) -> Result<bool, String> {
        use sys::ncclResult_t::{ncclInProgress, ncclSuccess};
        match async_state(self.parent).map_err(|r| format!("parent: {r:?}"))? {
            ncclInProgress => return Ok(false),
            ncclSuccess => {}
            e => return Err(format!("parent: {e:?}")),
        }
        let comm = self.handle();
        if comm.is_null() {
            // the parent is done with its part; NCCL's thread has yet to hand over the handle
            return Ok(false);
        }
        match async_state(comm).map_err(|r| format!("ncclCommGetAsyncError: {r:?}"))? {
            ncclSuccess => Ok(true),
            ncclInProgress => Ok(false),
            e => Err(format!("{e:?}")),
        }
    }

    /// Aborts the new communicator if NCCL has handed it over; the caller aborts the parent,
    /// which stops a setup still under way.
    fn abort(&self, _: ()) {
        let comm = self.slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !comm.is_null() {
            // SAFETY: a communicator from ncclCommSplit, aborted once (taken out of the slot).
            let _ = unsafe { nccl::comm_abort(comm) };
        }
    }
}

/// An owned communicator; aborted (never waited on) when dropped. A rank that ends well
/// finalizes and destroys it instead (`NcclRank`'s drop).
pub(super) struct RawComm(pub(super) sys::ncclComm_t);

impl RawComm {
    pub(super) fn abort(&mut self) {
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
