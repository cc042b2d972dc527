//! Checkpoints of a run: when one is due (`[checkpoint]`'s cadence, the best so far, the step
//! early stopping or a stop request ends at) and how every rank writes its part of it.

use super::events::{TrainError, TrainInput};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::checkpoint::{
    encode_files, CheckpointDir, CheckpointError, DataPosition, Layout, LossScaleState,
    OptimizerInfo, RngState, SchedulerInfo, State, WatchState, FORMAT,
};
use crate::config::Config;
use crate::strategy::{Snapshot, Strategy};

/// Whether checkpoint `done` is written: `[checkpoint]`'s step cadence, its epoch cadence
/// (`entered`: the epoch this step ended in, when it is a new one), the end, a new best, and the
/// step early stopping or a stop request ends the run at (without it a resume would go back to
/// an older checkpoint and train what the run decided not to).
pub(super) fn due(
    c: &Config,
    done: usize,
    entered: Option<u64>,
    is_last: bool,
    ends_here: bool,
    new_best: bool,
) -> bool {
    let ck = &c.checkpoint;
    let epoch_boundary =
        entered.is_some_and(|e| ck.every_epochs > 0 && e % ck.every_epochs as u64 == 0);
    (ck.every_steps > 0 && done.is_multiple_of(ck.every_steps))
        || epoch_boundary
        || (is_last && ck.at_end)
        || ends_here
        || new_best
}

/// This rank's background checkpoint writer (`checkpoint.async`): at most one save in flight.
#[derive(Default)]
pub(super) struct Background {
    writing: Option<Writing>,
    /// Seconds the writer threads took, beside the training.
    pub seconds: f64,
}

struct Writing {
    step: usize,
    /// Whether this rank commits the checkpoint (rank 0).
    commits: bool,
    handle: std::thread::JoinHandle<Result<f64, CheckpointError>>,
    /// Set when the run ends before the save did: rank 0 stops waiting for the others' files.
    cancel: Arc<AtomicBool>,
}

impl Background {
    /// Waits for the save in flight: the step it committed (rank 0), if any. A failed write
    /// fails the run, naming the file.
    pub(super) fn wait(&mut self) -> Result<Option<usize>, TrainError> {
        let Some(w) = self.writing.take() else {
            return Ok(None);
        };
        let seconds = w.handle.join().unwrap_or_else(|p| {
            Err(CheckpointError::Unsaved {
                path: PathBuf::from(format!("step-{:08}", w.step)),
                why: format!(
                    "its writer thread panicked: {}",
                    crate::panic::message(p.as_ref())
                ),
            })
        })?;
        self.seconds += seconds;
        Ok(w.commits.then_some(w.step))
    }

    /// Like `wait` when the save in flight is done, else nothing: a failed write fails the run
    /// at the next step, not at the next save.
    pub(super) fn poll(&mut self) -> Result<Option<usize>, TrainError> {
        match &self.writing {
            Some(w) if w.handle.is_finished() => self.wait(),
            _ => Ok(None),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // a run that failed: its unfinished save stays a `.tmp` (never resumed from)
        if let Some(w) = self.writing.take() {
            w.cancel.store(true, Ordering::Relaxed);
            let _ = w.handle.join();
        }
    }
}

/// What a checkpoint records of the training besides the strategy's state: where it is.
pub(super) struct Progress {
    /// The optimizer steps done.
    pub step: usize,
    /// The data position the next step starts at.
    pub position: DataPosition,
    /// The step's loss and learning rate.
    pub loss: f64,
    pub lr: f64,
    /// Early stopping's and the best checkpoint's watch.
    pub watched: [Option<WatchState>; 2],
    /// f16's loss scale.
    pub loss_scale: Option<LossScaleState>,
    /// Where a stream of documents stands.
    pub documents: Option<std::sync::Arc<crate::checkpoint::DocumentsPosition>>,
}

/// A rank's checkpoint writer, chosen once from `checkpoint.async`: each save written in place
/// (training waits for it), or the same writes wrapped by a background writer (training waits
/// only for the copy to host memory, and for the save before it), as burn-train wraps a
/// checkpointer in its async one.
pub(super) struct Checkpointer<'a> {
    store: &'a CheckpointDir,
    background: Option<Background>,
}

impl<'a> Checkpointer<'a> {
    pub(super) fn new(store: &'a CheckpointDir, in_background: bool) -> Self {
        Checkpointer {
            store,
            background: in_background.then(Background::default),
        }
    }

    /// Whether saves are written in the background (`checkpoint.async`).
    pub(super) fn in_background(&self) -> bool {
        self.background.is_some()
    }

    /// Saves checkpoint `progress.step` of `strategy`'s state (every rank).
    pub(super) fn save(
        &mut self,
        input: &TrainInput<'_>,
        strategy: &mut dyn Strategy,
        progress: Progress,
    ) -> Result<(), TrainError> {
        save_checkpoint(
            input,
            strategy,
            self.store,
            progress,
            self.background.as_mut(),
        )
    }

    /// Waits for the save in flight: the step it committed (rank 0), if any.
    pub(super) fn wait(&mut self) -> Result<Option<usize>, TrainError> {
        self.background.as_mut().map_or(Ok(None), Background::wait)
    }

    /// Like `wait` when the save in flight is done, else nothing.
    pub(super) fn poll(&mut self) -> Result<Option<usize>, TrainError> {
        self.background.as_mut().map_or(Ok(None), Background::poll)
    }

    /// Seconds the background writer threads took, beside the training.
    pub(super) fn background_seconds(&self) -> f64 {
        self.background.as_ref().map_or(0.0, |b| b.seconds)
    }
}

/// Writes checkpoint `progress.step`: rank 0 opens it, every rank copies its state to host
/// memory and writes its files, rank 0 commits. With `background` (`checkpoint.async`), a
/// writer thread writes and commits while training goes on (the caller waited for the
/// previous save).
fn save_checkpoint(
    input: &TrainInput<'_>,
    strategy: &mut dyn Strategy,
    store: &CheckpointDir,
    progress: Progress,
    background: Option<&mut Background>,
) -> Result<(), TrainError> {
    let c = input.config;
    let (step, loss) = (progress.step, progress.loss);
    let rank = strategy.rank();
    if rank == 0 {
        store.begin(step as u64)?;
    }
    strategy.barrier()?;
    let snap = strategy.snapshot()?;
    // never a checkpoint of NaN or infinite parameters (an optimizer step that overflowed):
    // every rank checks its part, and all agree before anything is written
    let mut bad = [snap.data.as_ref().map_or(0.0, |(p, _)| {
        f64::from(u8::from(!crate::params::all_finite(p)))
    })];
    strategy.sum(&mut bad)?;
    if bad[0] > 0.0 {
        return Err(TrainError::Diverged {
            step,
            cause: format!("the parameters have NaN or infinite values (the loss is {loss})"),
        });
    }
    let state = (rank == 0).then(|| state_of(input, progress, &snap.layout));
    let specs = input.model.layout().specs();
    let frozen = input.model.layout().frozen;
    let (keep_last, keep_every) = (c.checkpoint.keep_last, c.checkpoint.keep_every as u64);
    let Some(background) = background else {
        write_files(store, step, rank, (&specs, frozen), &snap)?;
        strategy.barrier()?;
        if let Some(state) = &state {
            store.commit(step as u64, state, keep_last, keep_every)?;
        }
        strategy.barrier()?;
        return Ok(());
    };
    let timeout = Duration::from_secs(c.strategy.timeout_secs);
    let job = Job {
        step,
        rank,
        specs,
        frozen,
        snap,
        state,
        keep: (keep_last, keep_every),
        timeout,
    };
    background.start(store, job)?;
    Ok(())
}

/// What a background writer writes: this rank's part of checkpoint `step` and, on rank 0,
/// its `state.json`, retention and how long to wait for the other ranks' files.
struct Job {
    step: usize,
    rank: usize,
    specs: Vec<(String, Vec<usize>)>,
    /// Leading parameters that do not train (their optimizer state is not there).
    frozen: usize,
    snap: Snapshot,
    state: Option<State>,
    keep: (usize, u64),
    timeout: Duration,
}

impl Background {
    /// Starts writing `job` on a thread of its own (the caller waited for the previous save).
    fn start(&mut self, store: &CheckpointDir, job: Job) -> Result<(), CheckpointError> {
        debug_assert!(self.writing.is_none(), "two saves in flight");
        let Job { step, rank, .. } = job;
        // the ranks that write files: rank 0 (whole parameters) or the shards' ranks 0..world
        let writers = match &job.snap.layout {
            Layout::Full => 1,
            Layout::Sharded { world, .. } => *world,
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let (store, stop) = (store.clone(), Arc::clone(&cancel));
        let memory_key = crate::memory::attributed();
        let commits = job.state.is_some();
        let path = store.step_dir(step as u64);
        let write = move || -> Result<f64, CheckpointError> {
            // the writer's buffers count in its rank's measured peak
            if let Some(k) = memory_key {
                crate::memory::attribute(k);
            }
            let start = Instant::now();
            let written = write_files(&store, step, rank, (&job.specs, job.frozen), &job.snap)
                .and_then(|()| match rank > 0 && job.snap.data.is_some() {
                    true => store.mark_written(step as u64, rank),
                    false => Ok(()),
                });
            if let Err(e) = written {
                // rank 0 stops waiting for this rank's files
                if rank > 0 {
                    store.mark_failed(step as u64, rank, &e.to_string());
                }
                return Err(e);
            }
            drop(job.snap);
            if let Some(state) = job.state {
                store.wait_written(step as u64, writers, job.timeout, &stop)?;
                store.commit(step as u64, &state, job.keep.0, job.keep.1)?;
            }
            Ok(start.elapsed().as_secs_f64())
        };
        let handle = std::thread::Builder::new()
            .name(format!("kiln-rank-{rank}-checkpoint"))
            .spawn(write)
            .map_err(|e| CheckpointError::Unsaved {
                path,
                why: format!(
                    "cannot start its writer thread ({e}); set `checkpoint.async = false`"
                ),
            })?;
        self.writing = Some(Writing {
            step,
            commits,
            handle,
            cancel,
        });
        Ok(())
    }
}

/// This rank's files of checkpoint `step` (none for ranks whose snapshot holds nothing),
/// written and fsynced.
fn write_files(
    store: &CheckpointDir,
    step: usize,
    rank: usize,
    (specs, frozen): (&[(String, Vec<usize>)], usize),
    snap: &Snapshot,
) -> Result<(), CheckpointError> {
    let Some((params, opt)) = &snap.data else {
        return Ok(());
    };
    let files = encode_files(&snap.layout, rank, specs, frozen, params, opt).map_err(|why| {
        CheckpointError::Invalid {
            path: store.dir.clone(),
            why,
        }
    })?;
    for (name, bytes) in &files {
        store.write_file(step as u64, name, bytes)?;
    }
    Ok(())
}

/// The `state.json` of the checkpoint `progress` describes (rank 0's).
fn state_of(input: &TrainInput<'_>, progress: Progress, layout: &Layout) -> State {
    let c = input.config;
    let Progress {
        step,
        position,
        loss,
        lr,
        watched: [early_stopping, best],
        loss_scale,
        documents,
    } = progress;
    State {
        format: FORMAT.to_string(),
        step,
        position,
        accum_position: 0,
        rng: RngState {
            init_seed: c.experiment.seed,
            dropout_seed: c.experiment.seed,
            sampler_seed: c.sampler.seed,
            data_seed: c.data.seed,
        },
        world_size: input.plan.world_size,
        strategy: crate::config::choice_name(&c.strategy.kind),
        micro_batch: input.plan.micro_batch,
        grad_accum_steps: input.plan.accum,
        num_params: input.model.num_params(),
        frozen_params: input.model.layout().frozen,
        input_shape: input.data.input_shape(),
        params: layout.clone(),
        optimizer: OptimizerInfo {
            kind: crate::config::choice_name(&c.optim.kind),
            steps: step as u64,
        },
        scheduler: SchedulerInfo {
            kind: crate::config::choice_name(&c.schedule.kind),
            last_step: step,
            last_lr: lr,
        },
        last_loss: loss,
        config_hash: crate::config::config_hash(c),
        kiln_version: env!("CARGO_PKG_VERSION").to_string(),
        early_stopping,
        best,
        loss_scale,
        documents: documents.map(|d| (*d).clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::OptState;

    fn job(step: usize) -> Job {
        Job {
            step,
            rank: 0,
            specs: vec![("w".into(), vec![4])],
            frozen: 0,
            snap: Snapshot {
                layout: Layout::Full,
                data: Some((
                    vec![1.0; 4],
                    OptState {
                        steps: 1,
                        m: vec![0.5; 4],
                        v: vec![0.25; 4],
                    },
                )),
            },
            state: None,
            keep: (2, 0),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_failed_background_write_fails_the_wait_naming_the_file() {
        let d = crate::testdir::tempdir().unwrap();
        let store = CheckpointDir::new(d.path().join("checkpoints"));
        // never begun: the step's `.tmp` directory is not there to write into
        let mut b = Background::default();
        b.start(&store, job(2)).unwrap();
        let e = b.wait().unwrap_err().to_string();
        assert!(e.contains("step-00000002.tmp/model.safetensors"), "{e}");
        // nothing in flight after it
        assert_eq!(b.wait().unwrap(), None);
    }

    #[test]
    fn a_background_write_writes_the_files_a_synchronous_one_does() {
        let d = crate::testdir::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        let (sa, sb) = (CheckpointDir::new(a.clone()), CheckpointDir::new(b.clone()));
        sa.begin(3).unwrap();
        sb.begin(3).unwrap();
        let j = job(3);
        write_files(&sa, 3, 0, (&j.specs, 0), &j.snap).unwrap();
        let mut bg = Background::default();
        bg.start(&sb, job(3)).unwrap();
        // rank 0 without a state commits nothing
        assert_eq!(bg.wait().unwrap(), None);
        assert!(bg.seconds > 0.0);
        for name in ["model.safetensors", "optim.safetensors"] {
            let read = |d: &std::path::Path| std::fs::read(d.join("step-00000003.tmp").join(name));
            assert_eq!(read(&a).unwrap(), read(&b).unwrap(), "{name}");
        }
    }
}
