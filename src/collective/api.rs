//! The `Collective` trait, op identities and errors.

use std::fmt;

/// How contributions are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
}

/// The name of an op, for errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    Reduce,
    Barrier,
    /// Forming sub-groups (`Collective::split`).
    Split,
    /// Not a collective: the optimizer step or a copy of device state to the host.
    Update,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::AllReduce => "all_reduce",
            OpKind::Broadcast => "broadcast",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::Reduce => "reduce",
            OpKind::Barrier => "barrier",
            OpKind::Split => "split",
            OpKind::Update => "update",
        })
    }
}

/// One rank's position: its op number and what the op was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpId {
    pub seq: u64,
    pub kind: OpKind,
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} #{}", self.kind, self.seq)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// Some ranks did not reach the op within the timeout.
    #[error("collective timed out after {secs}s in {op} on rank {rank}: {}\n  = help: a rank is stuck or crashed (see logs/rank-<r>.log); raise `strategy.timeout_secs` if it is only slow", .missing.join("; "))]
    Timeout {
        rank: usize,
        op: OpId,
        secs: u64,
        /// e.g. "rank 1 never reached all_reduce #57 (last seen: broadcast #56)"
        missing: Vec<String>,
    },
    /// Ranks called different ops at the same point.
    #[error("collective mismatch: rank {rank} is in {op} but rank {other} is in {other_op}; every rank must run the same ops in the same order")]
    Mismatch {
        rank: usize,
        op: OpId,
        other: usize,
        other_op: OpId,
    },
    /// Buffers of different sizes in one op.
    #[error("collective size mismatch in {op}: rank {rank} sent {len} elements, rank {other} sent {other_len}")]
    Size {
        rank: usize,
        op: OpId,
        len: usize,
        other: usize,
        other_len: usize,
    },
    /// The device (GPU, NCCL) failed under an op.
    #[error("rank {rank}: {op} failed on the device: {reason}")]
    Device {
        rank: usize,
        op: OpId,
        reason: String,
    },
    /// The collective cannot do what was asked of it (e.g. a split color above NCCL's limit).
    #[error("rank {rank}: {what}")]
    Unsupported { rank: usize, what: String },
    /// Another rank failed; this one stops too.
    #[error("rank {rank} stopped in {op}: {reason}")]
    Aborted {
        rank: usize,
        op: OpId,
        reason: String,
    },
}

/// Collective ops over flat buffers. Reductions run in rank order (0, 1, 2, ...), so results
/// never depend on thread timing.
pub trait Collective: Send {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// Every rank ends with the reduction of all ranks' `buf`.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError>;
    /// Like `all_reduce`, for small f64 buffers (losses, counts, norms).
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError>;
    /// `root` ends with the reduction; the other ranks' `buf` is unchanged.
    fn reduce(&mut self, buf: &mut [f32], op: ReduceOp, root: usize)
        -> Result<(), CollectiveError>;
    /// Every rank ends with `root`'s `buf`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError>;
    /// `out` (world x send.len()) holds every rank's `send`, in rank order.
    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError>;
    /// Like `all_gather`, for f64.
    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError>;
    /// `send` (world x out.len()) is reduced across ranks; rank r keeps chunk r in `out`.
    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError>;
    fn barrier(&mut self) -> Result<(), CollectiveError>;
    /// Sub-groups (`torch.distributed.new_subgroups`, `ncclCommSplit`): every rank of this
    /// group calls it at the same point; the ranks that pass the same `color` form one new
    /// group, ranked by `key` (ties by their rank here). Returns this rank's handle in its
    /// group, a collective of its own (its ops are numbered from 0 and run only among its
    /// members, beside this group's). Stopping either stops both. Colors and keys up to
    /// 2^31 - 1 (NCCL's limit). On CUDA a sub-group shares its parent's stream: every rank
    /// must issue the ops of the parent and of its sub-groups in the same order (in one process
    /// any order works, so keep to one order everywhere).
    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        let _ = (color, key);
        Err(CollectiveError::Unsupported {
            rank: self.rank(),
            what: "this collective cannot form sub-groups (split): run the ranks in one process (in-process collective)".into(),
        })
    }
    /// Tells every other rank to stop: their pending and future ops fail with `Aborted`.
    fn abort(&self, reason: &str);
    /// Ops on device buffers, when this collective can run them there (NCCL).
    fn device_ops(&mut self) -> Option<&mut dyn super::DeviceOps> {
        None
    }
}
