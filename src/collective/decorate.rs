//! Decorators: a collective that wraps another and does something around each op (times it,
//! runs it behind queued ops, counts it). A decorator implements [`Decorator`]'s one method for
//! all ops, [`Decorator::around`], and gets `Collective` from the blanket impl here, instead of
//! forwarding each of the trait's ops by hand.

use super::{Collective, CollectiveError, DeviceOps, OpKind, ReduceOp};

/// A collective around another: `Collective` comes from the blanket impl below.
pub trait Decorator: Send {
    /// This rank and the world size (those of the collective underneath).
    fn place(&self) -> (usize, usize);
    /// Runs one op, `op` moving `bytes` of this rank's data: `run` runs it on the collective
    /// underneath, and the decorator does what it adds before and after.
    fn around<T>(
        &mut self,
        op: OpKind,
        bytes: usize,
        run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
    ) -> Result<T, CollectiveError>;
    /// `Collective::abort`: stops the group underneath (and whatever the decorator holds).
    fn stop(&self, reason: &str);
    /// `Collective::device_ops`: none unless the decorator says otherwise.
    fn device(&mut self) -> Option<&mut dyn DeviceOps> {
        None
    }
}

impl<D: Decorator> Collective for D {
    fn rank(&self) -> usize {
        self.place().0
    }
    fn world(&self) -> usize {
        self.place().1
    }
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(buf);
        self.around(OpKind::AllReduce, n, |c| c.all_reduce(buf, op))
    }
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(buf);
        self.around(OpKind::AllReduce, n, |c| c.all_reduce_f64(buf, op))
    }
    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(buf);
        self.around(OpKind::Reduce, n, |c| c.reduce(buf, op, root))
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(buf);
        self.around(OpKind::Broadcast, n, |c| c.broadcast(buf, root))
    }
    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(out);
        self.around(OpKind::AllGather, n, |c| c.all_gather(send, out))
    }
    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(out);
        self.around(OpKind::AllGather, n, |c| c.all_gather_f64(send, out))
    }
    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let n = std::mem::size_of_val(send);
        self.around(OpKind::ReduceScatter, n, |c| {
            c.reduce_scatter(send, out, op)
        })
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.around(OpKind::Barrier, 0, |c| c.barrier())
    }
    /// The sub-group of the collective underneath, as it is (not decorated).
    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        self.around(OpKind::Split, 0, |c| c.split(color, key))
    }
    fn abort(&self, reason: &str) {
        self.stop(reason)
    }
    fn device_ops(&mut self) -> Option<&mut dyn DeviceOps> {
        self.device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::LocalGroup;
    use std::time::Duration;

    /// Records each op's name and bytes, then runs it.
    struct Log {
        inner: Box<dyn Collective>,
        seen: Vec<(OpKind, usize)>,
    }

    impl Decorator for Log {
        fn place(&self) -> (usize, usize) {
            (self.inner.rank(), self.inner.world())
        }
        fn around<T>(
            &mut self,
            op: OpKind,
            bytes: usize,
            run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
        ) -> Result<T, CollectiveError> {
            self.seen.push((op, bytes));
            run(self.inner.as_mut())
        }
        fn stop(&self, reason: &str) {
            self.inner.abort(reason)
        }
    }

    #[test]
    fn every_op_goes_through_around_with_its_name_and_bytes_and_gives_the_inner_result() {
        let ranks = LocalGroup::ranks(2, Duration::from_secs(20));
        let out: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .into_iter()
                .map(|l| {
                    s.spawn(move || {
                        let mut c = Log {
                            inner: Box::new(l),
                            seen: vec![],
                        };
                        let r = c.rank() as f32;
                        let mut a = [r + 1.0, 1.0];
                        c.all_reduce(&mut a, ReduceOp::Sum).unwrap();
                        let mut f = [r as f64];
                        c.all_reduce_f64(&mut f, ReduceOp::Mean).unwrap();
                        let mut red = [r + 1.0];
                        c.reduce(&mut red, ReduceOp::Sum, 0).unwrap();
                        let mut b = [r + 5.0];
                        c.broadcast(&mut b, 1).unwrap();
                        let mut g = [0.0; 2];
                        c.all_gather(&[r], &mut g).unwrap();
                        let mut gf = [0.0; 2];
                        c.all_gather_f64(&[r as f64], &mut gf).unwrap();
                        let mut rs = [0.0];
                        c.reduce_scatter(&[1.0, r], &mut rs, ReduceOp::Sum).unwrap();
                        c.barrier().unwrap();
                        assert_eq!(c.world(), 2);
                        assert!(c.device_ops().is_none());
                        (c.rank(), a, f, red, b, g, gf, rs, c.seen)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        use OpKind::*;
        for (rank, a, f, red, b, g, gf, rs, seen) in out {
            assert_eq!(a, [3.0, 2.0]);
            assert_eq!(f, [0.5]);
            assert_eq!(red[0], if rank == 0 { 3.0 } else { 2.0 });
            assert_eq!(b, [6.0]);
            assert_eq!(g, [0.0, 1.0]);
            assert_eq!(gf, [0.0, 1.0]);
            assert_eq!(rs, [if rank == 0 { 2.0 } else { 1.0 }]);
            let want = [
                (AllReduce, 8),
                (AllReduce, 8),
                (Reduce, 4),
                (Broadcast, 4),
                (AllGather, 8),
                (AllGather, 16),
                (ReduceScatter, 8),
                (Barrier, 0),
            ];
            assert_eq!(seen, want, "rank {rank}");
        }
    }
}
