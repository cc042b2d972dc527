//! A rank's collective with a communication thread beside the compute (`strategy.overlap`).
//!
//! `submit` queues an op on the rank's communication thread and returns at once with a
//! `Pending` result; `wait` blocks until it is done (that wait is the communication the compute
//! could not hide). Queued ops run one after another in submission order, and every other use
//! of the collective (the `Collective` methods of `Overlapped`) first waits for the queue to
//! empty, so a rank's ops keep one order whichever thread runs them: the order every rank
//! issues.
//!
//! Without overlap (`strategy.overlap = false`), or over a collective that works on device
//! buffers (NCCL: its overlap is a second stream, not a thread), `submit` runs the op at once on
//! the caller's thread: the same ops in the same order, nothing beside the compute.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::{Collective, CollectiveError, Decorator, DeviceOps, OpId, OpKind};

thread_local! {
    static COMM_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is a rank's communication thread (its ops go on the trace's
/// communication track).
pub fn on_comm_thread() -> bool {
    COMM_THREAD.with(|c| c.get())
}

/// How the compute's waits for queued ops are timed: called with the op's kind and the wait.
pub type WaitHook = Arc<dyn Fn(OpKind, &mut dyn FnMut()) + Send + Sync>;

type Job = Box<dyn FnOnce(&mut dyn Collective) + Send>;

/// The result of a submitted op.
pub struct Pending<T> {
    kind: OpKind,
    state: PendingState<T>,
}

enum PendingState<T> {
    Ready(T),
    Queued(mpsc::Receiver<T>),
}

impl<T> Pending<T> {
    /// The result if the op has finished, else the pending op back.
    pub fn try_take(self) -> Result<T, Pending<T>> {
        match self.state {
            PendingState::Ready(t) => Ok(t),
            PendingState::Queued(rx) => match rx.try_recv() {
                Ok(t) => Ok(t),
                // still running, or the thread is gone (`wait` says so)
                Err(_) => Err(Pending {
                    kind: self.kind,
                    state: PendingState::Queued(rx),
                }),
            },
        }
    }
}

/// `rank`'s op of `kind` did not run, for `reason`.
fn aborted(rank: usize, kind: OpKind, reason: String) -> CollectiveError {
    CollectiveError::Aborted {
        rank,
        op: OpId { seq: 0, kind },
        reason,
    }
}

struct Worker {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    /// Jobs submitted, and jobs the thread has finished (each bumps it).
    submitted: u64,
    completed: Arc<AtomicU64>,
}

pub struct Overlapped {
    rank: usize,
    world: usize,
    /// `strategy.overlap` as asked.
    overlap: bool,
    inner: Arc<Mutex<Box<dyn Collective>>>,
    worker: Option<Worker>,
    wait_hook: Option<WaitHook>,
    /// Set when the thread could not start or died under a job: every later op fails with it.
    broken: Option<String>,
    /// The first failure of a queued op (or an abort): the ops queued after it fail at once
    /// with it instead of each waiting out the timeout.
    failed: Arc<Mutex<Option<String>>>,
}

fn lock(m: &Mutex<Box<dyn Collective>>) -> MutexGuard<'_, Box<dyn Collective>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Overlapped {
    /// `overlap`: run submitted ops on a communication thread (refused for collectives with
    /// device ops, and pointless for a world of one). `wait_hook` times the compute's waits.
    pub fn new(mut inner: Box<dyn Collective>, overlap: bool, wait_hook: Option<WaitHook>) -> Self {
        let (rank, world) = (inner.rank(), inner.world());
        let threaded = overlap && world > 1 && inner.device_ops().is_none();
        let inner = Arc::new(Mutex::new(inner));
        let mut broken = None;
        let worker = if threaded {
            let (tx, rx) = mpsc::channel::<Job>();
            let shared = Arc::clone(&inner);
            let memory_key = crate::memory::attributed();
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-rank-{rank}-comm"))
                .spawn(move || {
                    COMM_THREAD.with(|c| c.set(true));
                    if let Some(k) = memory_key {
                        crate::memory::attribute(k);
                    }
                    for job in rx {
                        let mut c = lock(&shared);
                        job(c.as_mut());
                    }
                });
            match spawned {
                Ok(handle) => Some(Worker {
                    tx: Some(tx),
                    handle: Some(handle),
                    submitted: 0,
                    completed: Arc::default(),
                }),
                Err(e) => {
                    // never a silent fallback: this rank's ops would run in another order
                    // than the others'
                    broken = Some(format!(
                        "rank {rank} could not start its communication thread ({e}); set `strategy.overlap = false` to run without one"
                    ));
                    None
                }
            }
        } else {
            None
        };
        Overlapped {
            rank,
            world,
            overlap,
            inner,
            worker,
            wait_hook,
            broken,
            failed: Arc::default(),
        }
    }

    /// Whether submitted ops run beside the compute (also when the thread could not start:
    /// the ops then fail, in the same places on every rank).
    pub fn overlaps(&self) -> bool {
        self.worker.is_some() || self.broken.is_some()
    }

    /// Whether ops on device buffers run beside the compute: `strategy.overlap` over a
    /// collective with device ops (NCCL's own stream, `DeviceOps::start`) and more than one
    /// rank.
    pub fn overlaps_on_device(&mut self) -> bool {
        self.overlap && self.world > 1 && self.device_ops().is_some()
    }

    fn broken_error(&self, kind: OpKind) -> CollectiveError {
        let reason = self.broken.clone();
        aborted(
            self.rank,
            kind,
            reason.unwrap_or_else(|| "the communication thread stopped".into()),
        )
    }

    /// Queues `f` (an op of kind `kind`) behind the ops already submitted; without a thread it
    /// runs now.
    pub fn submit<T: Send + 'static>(
        &mut self,
        kind: OpKind,
        f: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError> + Send + 'static,
    ) -> Pending<Result<T, CollectiveError>> {
        if self.broken.is_some() {
            return Pending {
                kind,
                state: PendingState::Ready(Err(self.broken_error(kind))),
            };
        }
        let Some(w) = self.worker.as_mut() else {
            let mut c = lock(&self.inner);
            return Pending {
                kind,
                state: PendingState::Ready(f(c.as_mut())),
            };
        };
        let (tx, rx) = mpsc::channel();
        let (rank, failed, completed) = (
            self.rank,
            Arc::clone(&self.failed),
            Arc::clone(&w.completed),
        );
        let job: Job = Box::new(move |c| {
            let earlier = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let r = match earlier {
                Some(reason) => Err(aborted(rank, kind, reason)),
                None => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c)))
                    .unwrap_or_else(|p| {
                        let msg = crate::panic::message(p.as_ref());
                        let why = format!("the communication thread panicked in {kind}: {msg}");
                        Err(aborted(rank, kind, why))
                    }),
            };
            if let Err(e) = &r {
                failed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| format!("an earlier op failed: {e}"));
            }
            completed.fetch_add(1, Ordering::Release);
            let _ = tx.send(r);
        });
        let sent = w.tx.as_ref().is_some_and(|t| t.send(job).is_ok());
        if !sent {
            self.broken
                .get_or_insert_with(|| "the communication thread stopped".into());
            return Pending {
                kind,
                state: PendingState::Ready(Err(self.broken_error(kind))),
            };
        }
        w.submitted += 1;
        Pending {
            kind,
            state: PendingState::Queued(rx),
        }
    }

    /// The result of a submitted op, waiting for it when it is still running (timed by the
    /// wait hook).
    pub fn wait<T>(
        &mut self,
        p: Pending<Result<T, CollectiveError>>,
    ) -> Result<T, CollectiveError> {
        let kind = p.kind;
        let rx = match p.state {
            PendingState::Ready(t) => return t,
            PendingState::Queued(rx) => rx,
        };
        let got = match rx.try_recv() {
            Ok(t) => Some(t),
            Err(_) => {
                let mut got = None;
                let mut wait = || got = rx.recv().ok();
                match &self.wait_hook {
                    Some(h) => h(kind, &mut wait),
                    None => wait(),
                }
                got
            }
        };
        match got {
            Some(t) => t,
            None => {
                self.broken
                    .get_or_insert_with(|| "the communication thread panicked".into());
                Err(self.broken_error(kind))
            }
        }
    }

    /// Waits until every submitted op has run (their results stay with their `Pending`s).
    pub fn drain(&mut self) -> Result<(), CollectiveError> {
        let idle = self
            .worker
            .as_ref()
            .is_none_or(|w| w.completed.load(Ordering::Acquire) >= w.submitted);
        if idle {
            return Ok(());
        }
        // ops run in order: when this marker is done, so is every op before it
        // (behind a failed op the marker fails too, saying so: nothing runs after a failure)
        let p = self.submit(OpKind::Barrier, |_| Ok(()));
        self.wait(p)
    }

    /// The collective, once every queued op has run.
    fn now(
        &mut self,
        kind: OpKind,
    ) -> Result<MutexGuard<'_, Box<dyn Collective>>, CollectiveError> {
        if self.broken.is_some() {
            return Err(self.broken_error(kind));
        }
        self.drain()?;
        let failed = self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(reason) = failed {
            return Err(aborted(self.rank, kind, reason));
        }
        Ok(lock(&self.inner))
    }
}

impl Drop for Overlapped {
    fn drop(&mut self) {
        if let Some(mut w) = self.worker.take() {
            // the queued ops finish (or fail) before their buffers go
            drop(w.tx.take());
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}

impl Decorator for Overlapped {
    fn place(&self) -> (usize, usize) {
        (self.rank, self.world)
    }
    /// Runs the op once every queued op has run.
    fn around<T>(
        &mut self,
        op: OpKind,
        _bytes: usize,
        run: impl FnOnce(&mut dyn Collective) -> Result<T, CollectiveError>,
    ) -> Result<T, CollectiveError> {
        run(self.now(op)?.as_mut())
    }
    /// Waits for the op the thread is in, if any (it ends: every rank issues it, or it fails
    /// when another rank stopped), then stops the group.
    fn stop(&self, reason: &str) {
        // the queued ops fail at once instead of running
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| reason.to_string());
        lock(&self.inner).abort(reason);
    }
    fn device(&mut self) -> Option<&mut dyn DeviceOps> {
        if self.worker.is_some() {
            return None;
        }
        // no thread: the collective is only ever used from here; the guard is not needed
        // for a `&mut` borrow of the box inside the Arc we hold the only use of
        Arc::get_mut(&mut self.inner)
            .map(|m| m.get_mut().unwrap_or_else(|p| p.into_inner()))
            .and_then(|c| c.device_ops())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::{LocalGroup, ReduceOp};
    use std::time::Duration;

    #[test]
    fn submitted_ops_keep_the_order_of_every_rank() {
        for overlap in [false, true] {
            let ranks = LocalGroup::ranks(2, Duration::from_secs(20));
            let out: Vec<Vec<f32>> = std::thread::scope(|s| {
                let hs: Vec<_> = ranks
                    .into_iter()
                    .map(|l| {
                        s.spawn(move || {
                            let r = l.rank() as f32;
                            let mut c = Overlapped::new(Box::new(l), overlap, None);
                            assert_eq!(c.overlaps(), overlap);
                            let a = c.submit(OpKind::AllReduce, move |c| {
                                let mut v = vec![r + 1.0; 3];
                                c.all_reduce(&mut v, ReduceOp::Sum)?;
                                Ok(v)
                            });
                            let b = c.submit(OpKind::AllGather, move |c| {
                                let mut out = vec![0.0; 2];
                                c.all_gather(&[r * 10.0], &mut out)?;
                                Ok(out)
                            });
                            // a synchronous op after queued ones waits for them
                            let mut x = [r];
                            c.all_reduce(&mut x, ReduceOp::Sum).unwrap();
                            let mut all = c.wait(b).unwrap();
                            all.extend(c.wait(a).unwrap());
                            all.push(x[0]);
                            all
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(out[0], vec![0.0, 10.0, 3.0, 3.0, 3.0, 1.0]);
            assert_eq!(out[0], out[1]);
        }
    }

    #[test]
    fn a_failed_op_is_the_error_of_its_wait() {
        let ranks = LocalGroup::ranks(2, Duration::from_secs(20));
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .into_iter()
                .map(|l| {
                    s.spawn(move || {
                        let r = l.rank();
                        let mut c = Overlapped::new(Box::new(l), true, None);
                        // sizes differ: both ranks' waits say so
                        let p = c.submit(OpKind::AllReduce, move |c| {
                            let mut v = vec![0.0; 2 + r];
                            c.all_reduce(&mut v, ReduceOp::Sum)
                        });
                        c.wait(p).unwrap_err().to_string()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for e in errs {
            assert!(e.contains("size mismatch"), "{e}");
        }
    }

    #[test]
    fn ops_queued_behind_a_failed_one_fail_at_once_without_touching_the_link() {
        // rank 1 never takes part: rank 0's first op times out, and the two queued behind it
        // fail at once (not after a timeout each), saying why
        let mut ranks = LocalGroup::ranks(2, Duration::from_secs(1)).into_iter();
        let (r0, _r1) = (ranks.next().unwrap(), ranks.next().unwrap());
        let mut c = Overlapped::new(Box::new(r0), true, None);
        let p: Vec<_> = (0..3)
            .map(|_| {
                c.submit(OpKind::AllReduce, |c| {
                    let mut v = vec![1.0f32; 4];
                    c.all_reduce(&mut v, ReduceOp::Sum)
                })
            })
            .collect();
        let start = std::time::Instant::now();
        let errs: Vec<String> = p
            .into_iter()
            .map(|p| c.wait(p).unwrap_err().to_string())
            .collect();
        assert!(errs[0].contains("timed out"), "{errs:?}");
        for e in &errs[1..] {
            assert!(e.contains("an earlier op failed"), "{e}");
        }
        // one timeout (1 s), not three
        assert!(
            start.elapsed() < Duration::from_millis(2500),
            "{:?}",
            start.elapsed()
        );
        // and a synchronous op after them says so too
        let mut x = [0.0f32];
        let e = c.all_reduce(&mut x, ReduceOp::Sum).unwrap_err().to_string();
        assert!(e.contains("an earlier op failed"), "{e}");
    }
}
