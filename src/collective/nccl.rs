//! The `Collective` trait over NCCL (cudarc, feature `cuda`): one communicator per rank thread,
//! all created from one unique id. kiln keeps parameters and gradients in flat host buffers (see
//! the design notes in CHANGELOG.md), so each op copies its buffer to the rank's GPU, runs the
//! NCCL collective there, and copies the result back on the same stream.
//!
//! Limits: NCCL ops have no timeout of their own, and `abort` cannot reach a rank blocked inside
//! NCCL; a hung NCCL rank is reported by the other ranks' host-side collectives only.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::safe::NcclType;
use cudarc::nccl::safe::{Comm, ReduceOp as NcclOp};

pub use cudarc::nccl::safe::Id;

use super::{Collective, CollectiveError, OpId, OpKind, ReduceOp};

fn backend_error(rank: usize, op: OpId, message: String) -> CollectiveError {
    CollectiveError::Aborted {
        rank,
        op,
        reason: format!("NCCL failed: {message}"),
    }
}

/// A unique id for one group of communicators (created once, shared by every rank).
pub fn new_id() -> Result<Id, CollectiveError> {
    let op = OpId {
        seq: 0,
        kind: OpKind::Barrier,
    };
    if !crate::cuda::nccl_loadable() {
        return Err(backend_error(0, op, crate::cuda::nccl_hint()));
    }
    Id::new().map_err(|e| backend_error(0, op, format!("ncclGetUniqueId: {e:?}")))
}

/// One rank's NCCL communicator and its stream.
pub struct NcclRank {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
    seq: u64,
}

// SAFETY: an NCCL communicator may be used from any thread as long as it is not used by two at
// once; a `NcclRank` is owned and used by exactly one rank thread at a time.
unsafe impl Send for NcclRank {}

impl NcclRank {
    /// Joins the group `id` as `rank` of `world` on GPU `ordinal` (blocks until every rank joins).
    pub fn connect(
        id: Id,
        rank: usize,
        world: usize,
        ordinal: usize,
        _timeout: Duration,
    ) -> Result<Self, CollectiveError> {
        let op = OpId {
            seq: 0,
            kind: OpKind::Barrier,
        };
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| backend_error(rank, op, format!("GPU {ordinal}: {e:?}")))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| backend_error(rank, op, format!("stream: {e:?}")))?;
        let comm = Comm::from_rank(stream.clone(), rank, world, id)
            .map_err(|e| backend_error(rank, op, format!("ncclCommInitRank: {e:?}")))?;
        Ok(NcclRank {
            comm,
            stream,
            rank,
            world,
            seq: 0,
        })
    }

    fn next(&mut self, kind: OpKind) -> OpId {
        let op = OpId {
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        op
    }

    /// Copies `send` to the GPU, runs `f(comm, device send, device recv)`, copies `recv` back.
    fn staged<T: DeviceRepr + ValidAsZeroBits + NcclType + Copy + Zero>(
        &mut self,
        kind: OpKind,
        send: &[T],
        recv: &mut [T],
        f: impl FnOnce(
            &Comm,
            &cudarc::driver::CudaSlice<T>,
            &mut cudarc::driver::CudaSlice<T>,
        ) -> Result<(), String>,
    ) -> Result<(), CollectiveError> {
        let op = self.next(kind);
        let rank = self.rank;
        let err = |m: String| backend_error(rank, op, m);
        let d_send = self
            .stream
            .clone_htod(send)
            .map_err(|e| err(format!("copy to GPU: {e:?}")))?;
        let mut d_recv = self
            .stream
            .alloc_zeros::<T>(recv.len().max(1))
            .map_err(|e| err(format!("alloc: {e:?}")))?;
        f(&self.comm, &d_send, &mut d_recv).map_err(&err)?;
        let mut host = vec![T::default_zero(); recv.len().max(1)];
        self.stream
            .memcpy_dtoh(&d_recv, host.as_mut_slice())
            .map_err(|e| err(format!("copy from GPU: {e:?}")))?;
        self.stream
            .synchronize()
            .map_err(|e| err(format!("synchronize: {e:?}")))?;
        recv.copy_from_slice(&host[..recv.len()]);
        Ok(())
    }
}

/// Zero of a staged element type.
trait Zero {
    fn default_zero() -> Self;
}
impl Zero for f32 {
    fn default_zero() -> Self {
        0.0
    }
}
impl Zero for f64 {
    fn default_zero() -> Self {
        0.0
    }
}

fn nccl_op(op: ReduceOp) -> NcclOp {
    match op {
        ReduceOp::Sum => NcclOp::Sum,
        ReduceOp::Mean => NcclOp::Avg,
    }
}

impl Collective for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        self.staged(OpKind::AllReduce, &send, buf, |c, s, r| {
            c.all_reduce(s, r, &nccl_op(op))
                .map(|_| ())
                .map_err(|e| format!("ncclAllReduce: {e:?}"))
        })
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        self.staged(OpKind::AllReduce, &send, buf, |c, s, r| {
            c.all_reduce(s, r, &nccl_op(op))
                .map(|_| ())
                .map_err(|e| format!("ncclAllReduce: {e:?}"))
        })
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let send = buf.to_vec();
        let mut out = buf.to_vec();
        self.staged(OpKind::Reduce, &send, &mut out, |c, s, r| {
            c.reduce(s, Some(r), &nccl_op(op), root as i32)
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
        self.staged(OpKind::Broadcast, &send, buf, |c, s, r| {
            c.broadcast(Some(s), r, root as i32)
                .map(|_| ())
                .map_err(|e| format!("ncclBroadcast: {e:?}"))
        })
    }

    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.staged(OpKind::AllGather, send, out, |c, s, r| {
            c.all_gather(s, r)
                .map(|_| ())
                .map_err(|e| format!("ncclAllGather: {e:?}"))
        })
    }

    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        self.staged(OpKind::AllGather, send, out, |c, s, r| {
            c.all_gather(s, r)
                .map(|_| ())
                .map_err(|e| format!("ncclAllGather: {e:?}"))
        })
    }

    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.staged(OpKind::ReduceScatter, send, out, |c, s, r| {
            c.reduce_scatter(s, r, &nccl_op(op))
                .map(|_| ())
                .map_err(|e| format!("ncclReduceScatter: {e:?}"))
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        let mut one = [0f32];
        self.all_reduce(&mut one, ReduceOp::Sum)
    }

    fn abort(&self, _reason: &str) {
        // See the module docs: NCCL offers no safe way to wake a peer blocked in a collective.
    }
}
