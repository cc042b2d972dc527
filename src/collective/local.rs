//! The in-process collective: one worker thread per rank, contributions exchanged through shared
//! memory under one mutex. Each op is a round: every rank deposits its buffer, the last to arrive
//! publishes the round, each rank computes its result from all contributions in rank order, and
//! the round closes when every rank has read it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use super::{Collective, CollectiveError, OpId, OpKind, ReduceOp};

#[derive(Debug, Clone)]
enum Payload {
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// A rank's own buffer, shared in place for the duration of one all-reduce (address, len).
    Shared(usize, usize),
}

impl Payload {
    fn len(&self) -> usize {
        match self {
            Payload::F32(v) => v.len(),
            Payload::F64(v) => v.len(),
            Payload::Shared(_, len) => *len,
        }
    }
    fn f32(&self) -> &[f32] {
        match self {
            Payload::F32(v) => v,
            _ => &[],
        }
    }
    fn f64(&self) -> &[f64] {
        match self {
            Payload::F64(v) => v,
            _ => &[],
        }
    }
}

#[derive(Default)]
struct ExchangeState {
    generation: u64,
    slots: Vec<Option<(OpId, Payload)>>,
    arrived: usize,
    result: Option<Arc<Vec<Payload>>>,
    readers_left: usize,
    last_seen: Vec<Option<OpId>>,
    aborted: Option<String>,
    /// Ranks done with the in-place phase of the current shared all-reduce, and its generation.
    finished: usize,
    finish_generation: u64,
}

struct Exchange {
    world: usize,
    timeout: Duration,
    state: Mutex<ExchangeState>,
    cv: Condvar,
    /// Every group split from the same first group, this one included: stopping one stops all.
    family: Arc<Mutex<Family>>,
    /// Sub-groups being formed by a split: (the split's op number, the group's first member)
    /// to the group's exchange and how many of its members have yet to take it.
    forming: Mutex<HashMap<(u64, usize), Forming>>,
}

/// A sub-group being formed: its exchange and how many members have yet to take it.
type Forming = (Arc<Exchange>, usize);

/// The groups split from one first group, and why they stopped (once one did): a group made
/// after the stop starts stopped, decided under the same lock as the stop's list of groups.
#[derive(Default)]
struct Family {
    groups: Vec<Weak<Exchange>>,
    stopped: Option<String>,
}

impl Exchange {
    /// The exchange of a new group of `world` ranks in `family` (a new family: `None`).
    fn new(world: usize, timeout: Duration, family: Option<Arc<Mutex<Family>>>) -> Arc<Exchange> {
        let family = family.unwrap_or_default();
        let ex = Arc::new(Exchange {
            world,
            timeout,
            state: Mutex::new(ExchangeState {
                slots: vec![None; world],
                last_seen: vec![None; world],
                ..ExchangeState::default()
            }),
            cv: Condvar::new(),
            family: Arc::clone(&family),
            forming: Mutex::new(HashMap::new()),
        });
        let mut f = family.lock().unwrap_or_else(|p| p.into_inner());
        f.groups.retain(|w| w.strong_count() > 0);
        f.groups.push(Arc::downgrade(&ex));
        if let Some(reason) = &f.stopped {
            ex.stop(reason);
        }
        drop(f);
        ex
    }

    /// Stops this group (its pending and future ops fail with `reason`).
    fn stop(&self, reason: &str) {
        let mut st = self.lock();
        st.aborted.get_or_insert_with(|| reason.to_string());
        self.cv.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, ExchangeState> {
        // A rank that panicked while holding the lock leaves consistent data: slots are only
        // replaced whole. Keep going so the other ranks can report it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a change of the state, at most `timeout`.
    fn wait<'a>(
        &self,
        st: MutexGuard<'a, ExchangeState>,
        timeout: Duration,
    ) -> MutexGuard<'a, ExchangeState> {
        self.cv
            .wait_timeout(st, timeout)
            .map(|r| r.0)
            .unwrap_or_else(|p| p.into_inner().0)
    }
}

/// Creates the ranks of one in-process group.
pub struct LocalGroup;

impl LocalGroup {
    /// `world` connected ranks; every op times out after `timeout`.
    pub fn ranks(world: usize, timeout: Duration) -> Vec<LocalRank> {
        let shared = Exchange::new(world, timeout, None);
        (0..world)
            .map(|rank| LocalRank {
                rank,
                seq: 0,
                shared: Arc::clone(&shared),
            })
            .collect()
    }
}

/// One rank's handle.
pub struct LocalRank {
    rank: usize,
    seq: u64,
    shared: Arc<Exchange>,
}

/// Stops a local group from any thread, like `Collective::abort` on one of its ranks.
#[derive(Clone)]
pub struct GroupStopper(Arc<Exchange>);

impl GroupStopper {
    /// Stops the group, and every group split from it or from which it was split.
    pub fn stop(&self, reason: &str) {
        let family: Vec<Arc<Exchange>> = {
            let mut f = self.0.family.lock().unwrap_or_else(|p| p.into_inner());
            f.stopped.get_or_insert_with(|| reason.to_string());
            // (this group is one of them: every exchange joins its family when made)
            f.groups.iter().filter_map(Weak::upgrade).collect()
        };
        for ex in family {
            ex.stop(reason);
        }
    }
}

impl LocalRank {
    /// A handle that stops this rank's whole group from another thread.
    pub fn stopper(&self) -> GroupStopper {
        GroupStopper(Arc::clone(&self.shared))
    }

    /// Blocks until some rank stops the group (`abort`) and returns the reason: what a rank that
    /// leaves the group's ops (a fault a test injects through its own collective) does while
    /// the others time out.
    pub fn wait_for_abort(&self) -> String {
        let sh = &self.shared;
        let mut st = sh.lock();
        loop {
            if let Some(reason) = &st.aborted {
                return reason.clone();
            }
            st = sh.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn aborted(&self, st: &ExchangeState, op: OpId) -> Option<CollectiveError> {
        st.aborted.as_ref().map(|reason| CollectiveError::Aborted {
            rank: self.rank,
            op,
            reason: reason.clone(),
        })
    }

    fn timeout_error(
        &self,
        st: &ExchangeState,
        op: OpId,
        waiting_for: impl Fn(usize) -> bool,
    ) -> CollectiveError {
        let missing = (0..self.shared.world)
            .filter(|&r| waiting_for(r))
            .map(|r| {
                let seen = st.last_seen[r]
                    .map(|o| o.to_string())
                    .unwrap_or_else(|| "no collective yet".into());
                format!("rank {r} never reached {op} (last seen: {seen})")
            })
            .collect();
        CollectiveError::Timeout {
            rank: self.rank,
            op,
            secs: self.shared.timeout.as_secs(),
            missing,
        }
    }

    /// Deposits `payload` for op `kind` and returns every rank's contribution, in rank order.
    fn exchange(
        &mut self,
        kind: OpKind,
        payload: Payload,
    ) -> Result<Arc<Vec<Payload>>, CollectiveError> {
        let op = OpId {
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        let sh = Arc::clone(&self.shared);
        let deadline = Instant::now() + sh.timeout;
        let mut st = sh.lock();
        // Wait until the previous round has been read by everyone.
        while st.result.is_some() {
            if let Some(e) = self.aborted(&st, op) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                let e = self.timeout_error(&st, op, |_| false);
                return Err(e);
            }
            st = sh.wait(st, deadline - now);
        }
        if let Some(e) = self.aborted(&st, op) {
            return Err(e);
        }
        for (other, slot) in st.slots.iter().enumerate() {
            if let Some((other_op, _)) = slot {
                if *other_op != op {
                    return Err(CollectiveError::Mismatch {
                        rank: self.rank,
                        op,
                        other,
                        other_op: *other_op,
                    });
                }
            }
        }
        st.slots[self.rank] = Some((op, payload));
        st.last_seen[self.rank] = Some(op);
        st.arrived += 1;
        let generation = st.generation;
        if st.arrived == sh.world {
            let all: Vec<Payload> = st
                .slots
                .iter_mut()
                .filter_map(|s| s.take().map(|(_, p)| p))
                .collect();
            st.result = Some(Arc::new(all));
            st.readers_left = sh.world;
            st.arrived = 0;
            sh.cv.notify_all();
        } else {
            while !(st.generation == generation && st.result.is_some()) {
                // On the way out, take this rank's contribution back: it may point at a buffer
                // that is about to be released.
                if let Some(e) = self.aborted(&st, op) {
                    st.slots[self.rank] = None;
                    st.arrived -= 1;
                    return Err(e);
                }
                let now = Instant::now();
                if now >= deadline {
                    let e = self.timeout_error(&st, op, |r| st.last_seen[r] != Some(op));
                    st.slots[self.rank] = None;
                    st.arrived -= 1;
                    return Err(e);
                }
                st = sh.wait(st, deadline - now);
            }
        }
        let res = st.result.clone().unwrap_or_default();
        st.readers_left -= 1;
        if st.readers_left == 0 {
            st.result = None;
            st.generation += 1;
            sh.cv.notify_all();
        }
        drop(st);
        self.check_sizes(op, &res)?;
        Ok(res)
    }

    fn check_sizes(&self, op: OpId, res: &[Payload]) -> Result<(), CollectiveError> {
        if matches!(op.kind, OpKind::Broadcast | OpKind::Barrier) {
            return Ok(());
        }
        let len = res[self.rank].len();
        match res.iter().enumerate().find(|(_, p)| p.len() != len) {
            Some((other, p)) => Err(CollectiveError::Size {
                rank: self.rank,
                op,
                len,
                other,
                other_len: p.len(),
            }),
            None => Ok(()),
        }
    }

    /// `range` of every rank's buffer reduced into `out`, in rank order.
    fn reduce_into(srcs: &[&[f32]], out: &mut [f32], range: std::ops::Range<usize>, op: ReduceOp) {
        out.copy_from_slice(&srcs[0][range.clone()]);
        for s in &srcs[1..] {
            for (o, v) in out.iter_mut().zip(&s[range.clone()]) {
                *o += v;
            }
        }
        if op == ReduceOp::Mean {
            let w = srcs.len() as f32;
            out.iter_mut().for_each(|o| *o /= w);
        }
    }
}

/// The other ranks' buffers of a shared-memory op, for reading.
fn shared_reads(res: &[Payload]) -> Vec<&[f32]> {
    res.iter()
        .map(|p| match p {
            // SAFETY: every address is a live `&[f32]` of length `len` (the lengths were checked
            // equal by `exchange`) whose owner stays in the op until every rank passed
            // `finish_shared` (a `Finish` guard); nobody writes to it during the op
            Payload::Shared(addr, len) => unsafe {
                std::slice::from_raw_parts(*addr as *const f32, *len)
            },
            _ => &[][..],
        })
        .collect()
}

/// Calls `finish_shared` when dropped: a rank that read or wrote other ranks' buffers leaves
/// the op only with all of them, whether it returns or unwinds.
struct Finish<'a>(&'a LocalRank);

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        self.0.finish_shared();
    }
}

impl LocalRank {
    /// The error for an output buffer of the wrong length (before anything is exchanged).
    /// The start of an all-gather (`out` is `world` times `send`) or a reduce-scatter (`send`
    /// is `world` times `out`) over shared memory: other sizes are the error; a world of one
    /// copies `send` to `out` and has nothing more to do (`None`); else every rank's `send` is
    /// shared in place.
    fn share_in_place(
        &mut self,
        kind: OpKind,
        send: &[f32],
        out: &mut [f32],
    ) -> Result<Option<Arc<Vec<Payload>>>, CollectiveError> {
        let world = self.shared.world;
        let size = match kind {
            OpKind::AllGather => (out.len(), world * send.len()),
            _ => (send.len(), world * out.len()),
        };
        if size.0 != size.1 {
            return Err(self.out_size(kind, size.0, size.1));
        }
        if self.shared.world == 1 {
            out.copy_from_slice(send);
            return Ok(None);
        }
        self.exchange(kind, Payload::Shared(send.as_ptr() as usize, send.len()))
            .map(Some)
    }

    fn out_size(&self, kind: OpKind, len: usize, want: usize) -> CollectiveError {
        CollectiveError::Size {
            rank: self.rank,
            op: OpId {
                seq: self.seq,
                kind,
            },
            len,
            other: self.rank,
            other_len: want,
        }
    }

    /// Waits until every rank has finished writing into the shared buffers of this all-reduce.
    /// Deliberately without timeout or abort: after the round was published every rank is
    /// inside plain memory loops that end, and no rank may return (and release its buffer)
    /// while another may still write into it.
    fn finish_shared(&self) {
        let sh = &self.shared;
        let mut st = sh.lock();
        let generation = st.finish_generation;
        st.finished += 1;
        if st.finished == sh.world {
            st.finished = 0;
            st.finish_generation += 1;
            sh.cv.notify_all();
        } else {
            while st.finish_generation == generation {
                st = sh.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
}

impl Collective for LocalRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    /// In place over shared memory: rank r reduces chunk r of every rank's buffer (in rank order)
    /// and writes the result into all of them, so the work is split and nothing is copied twice.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if world == 1 {
            return Ok(());
        }
        let res = self.exchange(
            OpKind::AllReduce,
            Payload::Shared(buf.as_mut_ptr() as usize, buf.len()),
        )?;
        let ptrs: Vec<*mut f32> = res
            .iter()
            .map(|p| match p {
                Payload::Shared(addr, _) => *addr as *mut f32,
                _ => std::ptr::null_mut(),
            })
            .collect();
        let n = buf.len();
        let chunk = n.div_ceil(world);
        let lo = (self.rank * chunk).min(n);
        let hi = ((self.rank + 1) * chunk).min(n);
        // SAFETY: every pointer is a live `&mut [f32]` of length n (sizes were checked equal by
        // `exchange`) whose owner stays inside this call until `finish_shared` returns, after
        // every rank finished. Each rank builds slices of its own range [lo, hi) only, and the
        // ranges of different ranks are disjoint, so no element is reached by two threads and
        // the slices below never alias.
        let mut chunks: Vec<&mut [f32]> = ptrs
            .iter()
            .map(|p| unsafe { std::slice::from_raw_parts_mut(p.add(lo), hi - lo) })
            .collect();
        if let Some((first, rest)) = chunks.split_first_mut() {
            // ((c0 + c1) + c2) + ...: rank order, the same on every rank
            for other in rest.iter() {
                for (a, b) in first.iter_mut().zip(other.iter()) {
                    *a += b;
                }
            }
            if op == ReduceOp::Mean {
                let w = world as f32;
                first.iter_mut().for_each(|a| *a /= w);
            }
            for other in rest.iter_mut() {
                other.copy_from_slice(first);
            }
        }
        self.finish_shared();
        Ok(())
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        let res = self.exchange(OpKind::AllReduce, Payload::F64(buf.to_vec()))?;
        buf.copy_from_slice(res[0].f64());
        for p in &res[1..] {
            for (o, v) in buf.iter_mut().zip(p.f64()) {
                *o += v;
            }
        }
        if op == ReduceOp::Mean {
            let w = res.len() as f64;
            buf.iter_mut().for_each(|o| *o /= w);
        }
        Ok(())
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let res = self.exchange(OpKind::Reduce, Payload::F32(buf.to_vec()))?;
        if self.rank == root {
            let srcs: Vec<&[f32]> = res.iter().map(Payload::f32).collect();
            Self::reduce_into(&srcs, buf, 0..buf.len(), op);
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let payload = if self.rank == root {
            buf.to_vec()
        } else {
            Vec::new()
        };
        let op = OpId {
            seq: self.seq,
            kind: OpKind::Broadcast,
        };
        let res = self.exchange(OpKind::Broadcast, Payload::F32(payload))?;
        let src = res[root].f32();
        if src.len() != buf.len() {
            return Err(CollectiveError::Size {
                rank: self.rank,
                op,
                len: buf.len(),
                other: root,
                other_len: src.len(),
            });
        }
        buf.copy_from_slice(src);
        Ok(())
    }

    /// Over shared memory: each rank copies every rank's `send` straight into its `out` (no
    /// copy in between).
    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        let Some(res) = self.share_in_place(OpKind::AllGather, send, out)? else {
            return Ok(());
        };
        // from here every rank reads the others' buffers: all leave together, even on unwind
        let _finish = Finish(self);
        for (chunk, src) in out.chunks_mut(send.len().max(1)).zip(shared_reads(&res)) {
            chunk.copy_from_slice(src);
        }
        Ok(())
    }

    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        let res = self.exchange(OpKind::AllGather, Payload::F64(send.to_vec()))?;
        for (chunk, p) in out.chunks_mut(send.len().max(1)).zip(res.iter()) {
            chunk.copy_from_slice(p.f64());
        }
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        // over shared memory: rank r reduces chunk r of every rank's `send` (rank order), no copy
        let Some(res) = self.share_in_place(OpKind::ReduceScatter, send, out)? else {
            return Ok(());
        };
        // from here every rank reads the others' buffers: all leave together, even on unwind
        let finish = Finish(self);
        let n = out.len();
        let range = self.rank * n..(self.rank + 1) * n;
        let srcs = shared_reads(&res);
        Self::reduce_into(&srcs, out, range, op);
        drop(srcs);
        drop(finish);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.exchange(OpKind::Barrier, Payload::F32(Vec::new()))
            .map(|_| ())
    }

    fn abort(&self, reason: &str) {
        self.stopper().stop(reason);
    }

    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        Ok(Box::new(self.split_local(color, key)?))
    }
}

impl LocalRank {
    /// `Collective::split` of an in-process group: a new in-process group per color, sharing
    /// this group's timeout; the members agree on the groups through one exchange of (color,
    /// key), then the first member to get there makes each group's exchange and the others
    /// take it.
    pub fn split_local(&mut self, color: usize, key: usize) -> Result<LocalRank, CollectiveError> {
        // the limit NCCL has, so a program that splits here splits there; exact in an f64
        for (what, v) in [("color", color), ("key", key)] {
            if i32::try_from(v).is_err() {
                return Err(CollectiveError::Unsupported {
                    rank: self.rank,
                    what: format!("split {what} {v} is above the limit (2^31 - 1)"),
                });
            }
        }
        let seq = self.seq;
        let res = self.exchange(OpKind::Split, Payload::F64(vec![color as f64, key as f64]))?;
        let mut members: Vec<(usize, usize)> = res
            .iter()
            .enumerate()
            .filter(|(_, p)| p.f64().first() == Some(&(color as f64)))
            .map(|(r, p)| (p.f64().get(1).copied().unwrap_or(0.0) as usize, r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.rank)
            .unwrap_or_default();
        let first = members.iter().map(|&(_, r)| r).min().unwrap_or(self.rank);
        let sh = &self.shared;
        let shared = {
            let mut forming = sh.forming.lock().unwrap_or_else(|p| p.into_inner());
            let (ex, left) = forming.entry((seq, first)).or_insert_with(|| {
                let ex = Exchange::new(members.len(), sh.timeout, Some(Arc::clone(&sh.family)));
                (ex, members.len())
            });
            let ex = Arc::clone(ex);
            *left -= 1;
            if *left == 0 {
                forming.remove(&(seq, first));
            }
            ex
        };
        Ok(LocalRank {
            rank,
            seq: 0,
            shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on every rank of a local group of `world`, each on a thread of its own.
    fn on_ranks<T: Send>(world: usize, f: impl Fn(LocalRank) -> T + Sync) -> Vec<T> {
        let ranks = LocalGroup::ranks(world, Duration::from_secs(20));
        std::thread::scope(|s| {
            let hs: Vec<_> = ranks.into_iter().map(|l| s.spawn(|| f(l))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn split_groups_by_color_ranked_by_key_and_their_ops_stay_inside() {
        // 4 ranks as HSDP lays them out: shard groups {0,1} {2,3}, replica groups {0,2} {1,3}
        let out = on_ranks(4, |mut c| {
            let r = c.rank();
            let mut shard = c.split(r / 2, r).unwrap();
            // keys reversed: the highest rank of each replica group is its rank 0
            let mut replica = c.split(r % 2, 10 - r).unwrap();
            let mut a = [r as f32 + 1.0];
            shard.all_reduce(&mut a, ReduceOp::Sum).unwrap();
            // different ops in different groups at the same time
            let mut g = [0.0; 2];
            if r % 2 == 0 {
                replica.all_gather(&[r as f32], &mut g).unwrap();
            } else {
                let mut b = [r as f32];
                replica.broadcast(&mut b, 0).unwrap();
                g = [b[0], -1.0];
            }
            // the parent group still works after the splits
            let mut w = [1.0];
            c.all_reduce(&mut w, ReduceOp::Sum).unwrap();
            // a split of a split
            let mut alone = shard.split(shard.rank(), 0).unwrap();
            let mut x = [5.0];
            alone.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            (
                (shard.rank(), shard.world(), a[0]),
                (replica.rank(), replica.world(), g),
                w[0],
                (alone.world(), x[0]),
            )
        });
        let want_shard = [(0, 2, 3.0), (1, 2, 3.0), (0, 2, 7.0), (1, 2, 7.0)];
        // replica groups {0,2} and {1,3} with keys 10-r: rank 2 (key 8) before rank 0 (key 10)
        let want_replica = [
            (1, 2, [2.0, 0.0]),
            (1, 2, [3.0, -1.0]),
            (0, 2, [2.0, 0.0]),
            (0, 2, [3.0, -1.0]),
        ];
        for (r, (shard, replica, w, alone)) in out.into_iter().enumerate() {
            assert_eq!(shard, want_shard[r], "rank {r}");
            assert_eq!(replica, want_replica[r], "rank {r}");
            assert_eq!(w, 4.0);
            assert_eq!(alone, (1, 5.0));
        }
    }

    #[test]
    fn stopping_a_sub_group_stops_its_parent_and_siblings_and_back() {
        let out = on_ranks(4, |mut c| {
            let r = c.rank();
            let mut shard = c.split(r / 2, r).unwrap();
            if r == 3 {
                // rank 3 fails: it stops its shard group only
                shard.abort("rank 3 failed");
                return vec![];
            }
            // ranks 0 and 1 may finish their shard group's op before the stop reaches them
            // (or not); rank 2 waits in it for rank 3; then the parent refuses everyone
            let mut a = [1.0];
            let mut errs: Vec<_> = shard
                .all_reduce(&mut a, ReduceOp::Sum)
                .err()
                .into_iter()
                .collect();
            if r == 2 {
                assert_eq!(errs.len(), 1);
            }
            errs.push(c.all_reduce(&mut a, ReduceOp::Sum).unwrap_err());
            errs
        });
        for (r, errs) in out.iter().enumerate() {
            for e in errs {
                assert!(
                    matches!(e, CollectiveError::Aborted { reason, .. } if reason == "rank 3 failed"),
                    "rank {r}: {e}"
                );
            }
        }
        // and a group split after its family was stopped is stopped from the start
        let late = on_ranks(2, |mut c| {
            c.abort("stopped");
            c.split(0, 0)
                .map(|mut s| s.barrier().unwrap_err().to_string())
        });
        for l in late {
            // the split itself fails (its exchange sees the stop) or the new group is stopped
            match l {
                Ok(e) | Err(CollectiveError::Aborted { reason: e, .. }) => {
                    assert!(e.contains("stopped"), "{e}")
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn a_decorator_passes_split_through() {
        struct Plain(LocalRank);
        impl crate::collective::Decorator for Plain {
            fn place(&self) -> (usize, usize) {
                (self.0.rank(), self.0.world())
            }
            fn around<T>(
                &mut self,
                _: OpKind,
                _: usize,
                run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
            ) -> Result<T, CollectiveError> {
                run(&mut self.0)
            }
            fn stop(&self, reason: &str) {
                self.0.abort(reason)
            }
        }
        // a decorator passes the split through to the collective underneath
        let out = on_ranks(2, |l| {
            let mut p = Plain(l);
            let mut s = p.split(0, 0).unwrap();
            let mut a = [1.0];
            s.all_reduce(&mut a, ReduceOp::Sum).unwrap();
            a[0]
        });
        assert_eq!(out, [2.0, 2.0]);
    }
}
