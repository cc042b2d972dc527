//! A rank's collective, timed: each op is a communication phase of the rank's clock, numbered
//! in call order (every rank calls the same ops in the same order, so the numbers match across
//! ranks), with its bytes.

use super::timing::{Clock, Phase};
use std::time::{Duration, Instant};

use crate::collective::{
    Collective, CollectiveError, Decorator, DeviceOps, OpKind, RawOp, ReduceOp, Started,
};
use crate::params::RawBuf;

pub struct Timed {
    inner: Box<dyn Collective>,
    clock: Clock,
    /// Device ops started beside the compute and not yet waited for: ticket, phase, bytes,
    /// op number and when it was queued.
    beside: Vec<(u64, Phase, usize, u64, Instant)>,
}

impl Timed {
    pub fn new(inner: Box<dyn Collective>, clock: Clock) -> Self {
        Timed {
            inner,
            clock,
            beside: Vec::new(),
        }
    }
}

fn raw_bytes(b: &RawBuf) -> usize {
    b.len * b.dtype.size()
}

impl Decorator for Timed {
    fn place(&self) -> (usize, usize) {
        (self.inner.rank(), self.inner.world())
    }
    fn around<T>(
        &mut self,
        op: OpKind,
        bytes: usize,
        run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
    ) -> Result<T, CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::of_op(op), bytes, || run(self.inner.as_mut()))
    }
    fn stop(&self, reason: &str) {
        self.inner.abort(reason)
    }
    fn device(&mut self) -> Option<&mut dyn DeviceOps> {
        if self.inner.device_ops().is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl Timed {
    fn dev(&mut self) -> Result<&mut dyn DeviceOps, CollectiveError> {
        let rank = self.inner.rank();
        self.inner.device_ops().ok_or(CollectiveError::Device {
            rank,
            op: crate::collective::OpId {
                seq: 0,
                kind: OpKind::AllReduce,
            },
            reason: "the collective has no device ops".into(),
        })
    }
}

impl DeviceOps for Timed {
    /// Queues the op (that is quick; it gets the next op number, in start order like every
    /// rank's), remembering it for `wait`.
    fn start(&mut self, op: RawOp) -> Result<Started, CollectiveError> {
        let started = self.dev()?.start(op)?;
        let n = self.clock.next_op();
        self.beside.push((
            started.ticket,
            Phase::of_op(op.kind()),
            op.bytes(),
            n,
            Instant::now(),
        ));
        Ok(started)
    }
    /// The compute's wait for the op is `Phase::Wait` (exposed communication); the op's own
    /// time on the device goes on the communication track, as the ops a communication thread
    /// runs beside the compute do.
    fn wait(&mut self, op: Started) -> Result<Vec<(Started, Duration)>, CollectiveError> {
        let c = self.clock.clone();
        let done = c.time(Phase::Wait, || self.dev()?.wait(op))?;
        for (finished, time) in &done {
            if let Some(i) = self.beside.iter().position(|b| b.0 == finished.ticket) {
                let (_, phase, bytes, n, queued) = self.beside.remove(i);
                c.comm().record_beside(phase, queued, *time, (n, bytes));
            }
        }
        // (a collective that measures nothing: the ops are done, untimed)
        self.beside.retain(|b| b.0 > op.ticket);
        Ok(done)
    }
    fn is_done(&mut self, op: Started) -> bool {
        self.dev().map(|d| d.is_done(op)).unwrap_or(true)
    }
    fn all_reduce_raw(&mut self, buf: RawBuf, op: ReduceOp) -> Result<(), CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::AllReduce, raw_bytes(&buf), || {
            self.dev()?.all_reduce_raw(buf, op)
        })
    }
    fn reduce_raw(
        &mut self,
        buf: RawBuf,
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::Reduce, raw_bytes(&buf), || {
            self.dev()?.reduce_raw(buf, op, root)
        })
    }
    fn reduce_scatter_raw(
        &mut self,
        send: RawBuf,
        recv: RawBuf,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::ReduceScatter, raw_bytes(&send), || {
            self.dev()?.reduce_scatter_raw(send, recv, op)
        })
    }
    fn all_gather_raw(&mut self, send: RawBuf, recv: RawBuf) -> Result<(), CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::AllGather, raw_bytes(&recv), || {
            self.dev()?.all_gather_raw(send, recv)
        })
    }
    fn broadcast_raw(&mut self, buf: RawBuf, root: usize) -> Result<(), CollectiveError> {
        let c = self.clock.clone();
        c.op(Phase::Broadcast, raw_bytes(&buf), || {
            self.dev()?.broadcast_raw(buf, root)
        })
    }
}
