//! The data loader of one rank: the micro-batches the step loop will consume, in its order,
//! assembled (gathered, augmented, turned into the model's input with one-hot targets) either on
//! the rank's own thread when asked (`data.workers = 0`) or ahead of time by `data.workers`
//! threads, at most `data.prefetch` micro-batches ahead (torch `DataLoader(num_workers,
//! prefetch_factor)`).
//!
//! The order is never the threads' business: one [`Source`] walks the sampler's positions
//! exactly as the step loop does and numbers each micro-batch; threads take numbers in turn,
//! and the loop receives number n as the n-th, whichever thread finished first. Assembly is a
//! pure function of the micro-batch (augmentation draws by sample index), so every batch, and
//! every loss, is the same bits for any number of threads. A failure in a thread (a panic while
//! assembling) reaches the loop as an error naming the samples and the data file; it never
//! leaves the loop waiting.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::Scope;

use std::sync::Arc;

use crate::checkpoint::DocumentsPosition;
use crate::data::documents::PackedRows;
use crate::data::stream::Stream;
use crate::data::{Augment, Dataset};
use crate::model::{Batch, Input, Task};
use crate::plan::Plan;

/// Where a rank stands in the data: pass `epoch`, in the segment of it that started at global
/// position `start`, after `j` micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pos {
    pub epoch: u64,
    pub start: usize,
    pub j: usize,
}

impl Pos {
    /// Moves to the next epoch when the segment is used up.
    pub fn normalize(mut self, plan: &Plan) -> Pos {
        while self.j >= plan.segment_micro(self.start) && plan.micro_per_epoch > 0 {
            self = Pos {
                epoch: self.epoch + 1,
                start: 0,
                j: 0,
            };
        }
        self
    }

    pub fn epochs(&self, plan: &Plan) -> f64 {
        self.epoch as f64
            + plan.cursor(self.start, self.j) as f64 / plan.train_samples.max(1) as f64
    }
}

/// One micro-batch to assemble: its position, this rank's sample indices and the size of the
/// whole micro-batch across ranks (split-batch strategies weigh by it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MicroTask {
    pub pos: Pos,
    pub idx: Vec<usize>,
    pub global: usize,
    /// A stream of documents: this rank's rows (read by the source, in order), and where the
    /// stream stands after the micro-batch.
    pub rows: Option<Result<PackedRows, String>>,
    pub after: Option<Arc<DocumentsPosition>>,
    /// What the run log should say about the stream (a source that ran out).
    pub notes: Vec<String>,
}

/// The micro-batches of one rank from `pos` on, in the order the step loop consumes them: at
/// most `left`, and none once `epochs` (when set) are done.
pub(super) struct Source<'a> {
    pub plan: &'a Plan,
    pub rank: usize,
    pub pos: Pos,
    pub left: usize,
    pub epochs: Option<u64>,
    segment: Option<((u64, usize), crate::data::sampler::Segment)>,
    /// Training documents: the stream every rank reads whole (its global rows in order),
    /// keeping its own.
    docs: Option<Stream>,
}

impl<'a> Source<'a> {
    pub fn new(plan: &'a Plan, rank: usize, pos: Pos, left: usize, epochs: Option<u64>) -> Self {
        Source {
            plan,
            rank,
            pos,
            left,
            epochs,
            segment: None,
            docs: None,
        }
    }

    /// The same, reading the rows of a stream of documents (which must stand at `pos`).
    pub fn documents(mut self, stream: Stream) -> Self {
        self.docs = Some(stream);
        self
    }

    /// This rank's rows `idx` of the micro-batch at `pos` (global row numbers, ascending), read
    /// from the stream with the other ranks' rows of the micro-batch.
    fn read_rows(
        stream: &mut Stream,
        plan: &Plan,
        pos: Pos,
        idx: &[usize],
    ) -> Result<PackedRows, String> {
        let (from, to) = (
            plan.cursor(pos.start, pos.j),
            plan.cursor(pos.start, pos.j + 1),
        );
        if stream.rows() != from as u64 {
            return Err(format!(
                "the documents stream stands at row {}, but this micro-batch starts at row {from}",
                stream.rows()
            ));
        }
        let mut rows = PackedRows::new(stream.width());
        let mut mine = idx.iter().peekable();
        for g in from..to {
            let row = stream.next_row().map_err(|e| e.to_string())?;
            if mine.peek() == Some(&&g) {
                mine.next();
                rows.push(row.iter().map(|(_, t)| t.as_slice()));
            }
        }
        Ok(rows)
    }
}

impl Iterator for Source<'_> {
    type Item = MicroTask;

    fn next(&mut self) -> Option<MicroTask> {
        let pos = self.pos.normalize(self.plan);
        if self.left == 0 || self.epochs.is_some_and(|e| pos.epoch >= e) {
            return None;
        }
        let key = (pos.epoch, pos.start);
        if self.segment.as_ref().map(|(k, _)| *k) != Some(key) {
            let seg = self.plan.sampler.segment_of(pos.epoch, pos.start);
            self.segment = Some((key, seg));
        }
        let (idx, global) = match self.segment.as_ref() {
            Some((_, seg)) => self.plan.micro_indices(seg, pos.j, self.rank),
            None => (Vec::new(), 0),
        };
        let (rows, after, notes) = match self.docs.as_mut() {
            Some(stream) => {
                let rows = Self::read_rows(stream, self.plan, pos, &idx);
                let after = Arc::new(stream.position());
                (Some(rows), Some(after), stream.take_notes())
            }
            None => (None, None, Vec::new()),
        };
        let job = MicroTask {
            pos,
            idx,
            global,
            rows,
            after,
            notes,
        };
        self.pos = Pos {
            j: pos.j + 1,
            ..pos
        };
        self.left -= 1;
        Some(job)
    }
}

/// Why the loader has no micro-batch: `bad_input` when the data itself is bad (a record that is
/// not what it should be, an id past the vocabulary: exit 2, as bad input found up front), not
/// for a failure of the loader (a panic, a thread that would not start) or of the file system.
#[derive(Debug)]
pub(super) struct LoadError {
    pub message: String,
    pub bad_input: bool,
}

impl From<String> for LoadError {
    fn from(message: String) -> Self {
        LoadError {
            message,
            bad_input: false,
        }
    }
}

impl From<LoadError> for super::events::TrainError {
    fn from(e: LoadError) -> Self {
        if e.bad_input {
            super::events::TrainError::BadData(e.message)
        } else {
            super::events::TrainError::Data(e.message)
        }
    }
}

/// A micro-batch ready for the step: `input` is `None` when this rank has no samples in it.
pub(super) struct Micro {
    pub pos: Pos,
    /// The data index of each of this rank's samples, in batch order (dropout's masks are
    /// keyed by them).
    pub ids: Vec<u64>,
    pub samples: usize,
    pub global: usize,
    pub input: Option<Input>,
    /// Rows of documents: this rank's targets (tokens with a loss), by which its loss weighs,
    /// and where the stream stands after the micro-batch.
    pub targets: usize,
    pub documents: Option<Arc<DocumentsPosition>>,
    /// What the run log should say about the stream.
    pub notes: Vec<String>,
}

/// How a job becomes the model's input.
pub(super) struct Assembler<'a> {
    pub data: &'a Dataset,
    pub task: Task,
    pub augment: Option<Augment>,
    /// The data file, as the config names it, for errors.
    pub file: String,
    pub rank: usize,
}

impl Assembler<'_> {
    fn assemble(&self, job: MicroTask) -> Result<Micro, crate::data::DataError> {
        if let Some(rows) = job.rows {
            let rows = rows.map_err(crate::data::DataError::Invalid)?;
            let n = rows.len();
            let targets = (0..n).map(|i| rows.targets(i)).sum();
            let input = (n > 0).then(|| {
                self.task.input(Batch {
                    x: crate::data::Values::Tokens(rows.tokens),
                    shape: vec![n, rows.width],
                    y: vec![0; n],
                    starts: Some(rows.starts.into()),
                })
            });
            return Ok(Micro {
                pos: job.pos,
                ids: job.idx.iter().map(|&i| i as u64).collect(),
                samples: n,
                global: job.global,
                input,
                targets,
                documents: job.after,
                notes: job.notes,
            });
        }
        let input = if job.idx.is_empty() {
            None
        } else {
            let (x, y) =
                self.data
                    .gather_augmented(&job.idx, job.pos.epoch, self.augment.as_ref())?;
            let mut shape = Vec::with_capacity(1 + self.data.shape.len());
            shape.push(y.len());
            shape.extend(&self.data.shape);
            Some(self.task.input(Batch {
                x,
                shape,
                y,
                starts: None,
            }))
        };
        Ok(Micro {
            pos: job.pos,
            ids: job.idx.iter().map(|&i| i as u64).collect(),
            samples: job.idx.len(),
            global: job.global,
            input,
            targets: 0,
            documents: None,
            notes: Vec::new(),
        })
    }

    /// `assemble`, with an error or a panic turned into an error that names the samples and
    /// the file.
    fn try_assemble(&self, job: MicroTask) -> Result<Micro, LoadError> {
        let what = self.describe(&job);
        match catch_unwind(AssertUnwindSafe(|| self.assemble(job))) {
            Ok(Ok(m)) => Ok(m),
            Ok(Err(e)) => Err(LoadError {
                bad_input: !matches!(e, crate::data::DataError::Io { .. }),
                message: format!("{what} failed: {e}"),
            }),
            Err(p) => Err(format!("{what} failed: {}", crate::panic::message(p.as_ref())).into()),
        }
    }

    fn describe(&self, job: &MicroTask) -> String {
        let shown: Vec<String> = job.idx.iter().take(8).map(|i| i.to_string()).collect();
        let more = if job.idx.len() > 8 { ", ..." } else { "" };
        if job.rows.is_some() {
            // a stream of documents: its rows are numbered over the whole stream
            return format!(
                "rank {}: reading rows {}{more} of {}",
                self.rank,
                shown.join(", "),
                self.file
            );
        }
        format!(
            "rank {}: assembling micro-batch {} of epoch {} (samples {}{more} of {})",
            self.rank,
            job.pos.j,
            job.pos.epoch,
            shown.join(", "),
            self.file
        )
    }
}

struct PipelineState<'a> {
    source: Source<'a>,
    /// Numbers handed out so far, and taken by the step loop so far.
    issued: usize,
    taken: usize,
    /// The source has nothing more (or failed).
    finished: bool,
    closed: bool,
    done: BTreeMap<usize, Result<Micro, LoadError>>,
}

struct Pipeline<'a> {
    state: Mutex<PipelineState<'a>>,
    /// The step loop waits here for the next number.
    ready: Condvar,
    /// Threads wait here for room ahead of the step loop.
    room: Condvar,
}

impl<'a> Pipeline<'a> {
    fn lock(&self) -> MutexGuard<'_, PipelineState<'a>> {
        // a panic while the lock is held (none is expected) must not stop the others
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a loader keeps what its threads share; made before, and outliving, the thread scope.
pub(super) struct LoaderState<'a>(Pipeline<'a>);

impl<'a> LoaderState<'a> {
    pub fn new(source: Source<'a>) -> Self {
        LoaderState(Pipeline {
            state: Mutex::new(PipelineState {
                source,
                issued: 0,
                taken: 0,
                finished: false,
                closed: false,
                done: BTreeMap::new(),
            }),
            ready: Condvar::new(),
            room: Condvar::new(),
        })
    }
}

/// The loader of one rank. Dropping it stops its threads (after the batch each is assembling).
pub(super) struct Loader<'s, 'a> {
    shared: &'s Pipeline<'a>,
    assembler: &'s Assembler<'a>,
    threaded: bool,
}

impl<'s, 'a> Loader<'s, 'a> {
    /// Assembles each micro-batch on the calling thread when it is asked for (`workers = 0`).
    pub fn inline(state: &'s LoaderState<'a>, assembler: &'s Assembler<'a>) -> Self {
        Loader {
            shared: &state.0,
            assembler,
            threaded: false,
        }
    }

    /// Starts `workers` threads in `scope` that keep up to `ahead` micro-batches assembled or in
    /// assembly beyond the one the step loop last took.
    pub fn threaded<'scope, 'env>(
        scope: &'scope Scope<'scope, 'env>,
        state: &'s LoaderState<'a>,
        assembler: &'s Assembler<'a>,
        workers: usize,
        ahead: usize,
    ) -> Self
    where
        's: 'scope,
    {
        let shared = &state.0;
        let memory_key = crate::memory::attributed();
        for w in 0..workers.max(1) {
            let spawned = std::thread::Builder::new()
                .name(format!("kiln-loader-{}-{w}", assembler.rank))
                .spawn_scoped(scope, move || {
                    // a loader's bytes count for its rank
                    if let Some(key) = memory_key {
                        crate::memory::attribute(key);
                    }
                    work(shared, assembler, ahead.max(1))
                });
            if let Err(e) = spawned {
                let mut st = shared.lock();
                if w == 0 {
                    let seq = st.issued;
                    st.done.insert(
                        seq,
                        Err(format!(
                            "rank {}: cannot start a data loader thread: {e}",
                            assembler.rank
                        )
                        .into()),
                    );
                    st.issued += 1;
                    st.finished = true;
                }
                break;
            }
        }
        Loader {
            shared,
            assembler,
            threaded: true,
        }
    }

    /// The next micro-batch, which must be at `pos` (the step loop's own position).
    pub fn next(&mut self, pos: Pos) -> Result<Micro, LoadError> {
        let shared = self.shared;
        let micro = if self.threaded {
            let mut st = shared.lock();
            loop {
                let seq = st.taken;
                if let Some(r) = st.done.remove(&seq) {
                    st.taken += 1;
                    shared.room.notify_all();
                    break r?;
                }
                if st.finished && st.issued <= seq {
                    return Err(format!(
                        "rank {}: the data loader ({}) has no micro-batch at {pos:?}",
                        self.assembler.rank, self.assembler.file
                    )
                    .into());
                }
                st = shared.ready.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        } else {
            let job = {
                let mut st = shared.lock();
                catch_unwind(AssertUnwindSafe(|| st.source.next())).map_err(|p| {
                    format!(
                        "rank {}: the sampler failed: {}",
                        self.assembler.rank,
                        crate::panic::message(p.as_ref())
                    )
                })?
            };
            match job {
                Some(job) => self.assembler.try_assemble(job)?,
                None => {
                    return Err(format!(
                        "rank {}: the data loader ({}) has no micro-batch at {pos:?}",
                        self.assembler.rank, self.assembler.file
                    )
                    .into())
                }
            }
        };
        if micro.pos != pos {
            return Err(format!(
                "rank {}: the data loader ({}) is out of step: it assembled {:?} for {pos:?}",
                self.assembler.rank, self.assembler.file, micro.pos
            )
            .into());
        }
        Ok(micro)
    }
}

impl Loader<'_, '_> {
    /// The next `n` micro-batches from `pos` on (which moves past them).
    pub fn take(
        &mut self,
        pos: &mut Pos,
        n: usize,
    ) -> Result<std::collections::VecDeque<Micro>, LoadError> {
        let mut out = std::collections::VecDeque::with_capacity(n);
        for _ in 0..n {
            out.push_back(self.next(*pos)?);
            pos.j += 1;
        }
        Ok(out)
    }
}

impl Drop for Loader<'_, '_> {
    fn drop(&mut self) {
        if self.threaded {
            self.shared.lock().closed = true;
            self.shared.room.notify_all();
        }
    }
}

/// Hands in an error for the number a loader thread holds if the thread ends without handing
/// in its result (a panic outside the assembly): the step loop is told rather than left
/// waiting for it.
struct Holding<'s, 'a> {
    shared: &'s Pipeline<'a>,
    seq: Option<usize>,
    rank: usize,
}

impl Drop for Holding<'_, '_> {
    fn drop(&mut self) {
        if let Some(seq) = self.seq.take() {
            let mut st = self.shared.lock();
            st.done.insert(
                seq,
                Err(format!(
                    "rank {}: a data loader thread stopped while assembling micro-batch number {seq}",
                    self.rank
                )
                .into()),
            );
            st.finished = true;
            self.shared.ready.notify_all();
            self.shared.room.notify_all();
        }
    }
}

/// One loader thread: take the next number while there is room ahead, assemble, hand it in.
fn work(shared: &Pipeline<'_>, assembler: &Assembler<'_>, ahead: usize) {
    let mut holding = Holding {
        shared,
        seq: None,
        rank: assembler.rank,
    };
    loop {
        let (seq, job) = {
            let mut st = shared.lock();
            loop {
                if st.closed || st.finished {
                    return;
                }
                if st.issued < st.taken + ahead {
                    break;
                }
                st = shared.room.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            let seq = st.issued;
            match catch_unwind(AssertUnwindSafe(|| st.source.next())) {
                Ok(Some(job)) => {
                    st.issued += 1;
                    (seq, job)
                }
                Ok(None) => {
                    st.finished = true;
                    shared.ready.notify_all();
                    shared.room.notify_all();
                    return;
                }
                Err(p) => {
                    st.done.insert(
                        seq,
                        Err(format!(
                            "rank {}: the sampler failed: {}",
                            assembler.rank,
                            crate::panic::message(p.as_ref())
                        )
                        .into()),
                    );
                    st.issued += 1;
                    st.finished = true;
                    shared.ready.notify_all();
                    shared.room.notify_all();
                    return;
                }
            }
        };
        holding.seq = Some(seq);
        let result = assembler.try_assemble(job);
        let mut st = shared.lock();
        st.done.insert(seq, result);
        holding.seq = None;
        shared.ready.notify_all();
    }
}

/// A step's micro-batches of documents, and their targets over every rank.
pub(super) type Taken = (std::collections::VecDeque<Micro>, f64);

/// The training data as the config names it, for the loader's errors.
pub(super) fn data_file(c: &crate::config::Config) -> String {
    match &c.data.path {
        Some(p) => format!("data.path = {p:?}"),
        None => format!("the {} data", crate::config::choice_name(&c.data.kind)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn plan(samples: usize, batch: usize) -> Plan {
        let mut c = Config::default();
        c.train.batch_size = batch;
        c.data.samples = samples;
        c.sampler.shuffle = false;
        Plan::new(&c, samples, 10)
    }

    fn dataset(n: usize) -> Dataset {
        Dataset::rows(
            vec![2],
            (0..2 * n).map(|v| v as f32).collect(),
            (0..n).map(|i| (i % 3) as u32).collect(),
        )
    }

    fn assembler<'a>(data: &'a Dataset, rank: usize, file: &str) -> Assembler<'a> {
        Assembler {
            data,
            task: Task::Classification { classes: 3 },
            augment: None,
            file: file.into(),
            rank,
        }
    }

    fn start() -> Pos {
        Pos {
            epoch: 0,
            start: 0,
            j: 0,
        }
    }

    /// The step loop's walk: every micro-batch's position and first input value, in order.
    fn drain(loader: &mut Loader<'_, '_>, plan: &Plan, n: usize) -> Vec<(Pos, Vec<f32>)> {
        let mut pos = start();
        let mut out = Vec::new();
        for _ in 0..n {
            pos = pos.normalize(plan);
            let m = loader.next(pos).unwrap();
            let x = m.input.unwrap().x.to_vec::<f32>().unwrap();
            out.push((m.pos, x));
            pos.j += 1;
        }
        out
    }

    #[test]
    fn threads_deliver_the_inline_order_exactly() {
        let plan = plan(23, 4);
        let data = dataset(23);
        let asm = assembler(&data, 0, "test data");
        let steps = 17; // past an epoch boundary (6 micro-batches an epoch)
        let inline = LoaderState::new(Source::new(&plan, 0, start(), steps, None));
        let want = drain(&mut Loader::inline(&inline, &asm), &plan, steps);
        assert_eq!(want.len(), steps);
        for (workers, ahead) in [(1, 1), (3, 2), (8, 5)] {
            let state = LoaderState::new(Source::new(&plan, 0, start(), steps, None));
            let got = std::thread::scope(|s| {
                let mut l = Loader::threaded(s, &state, &asm, workers, ahead);
                drain(&mut l, &plan, steps)
            });
            assert_eq!(got, want, "workers {workers}, prefetch {ahead}");
        }
    }

    #[test]
    fn stopping_early_ends_the_threads_and_asking_past_the_end_is_an_error() {
        let plan = plan(40, 4);
        let data = dataset(40);
        let asm = assembler(&data, 0, "test data");
        let state = LoaderState::new(Source::new(&plan, 0, start(), 3, None));
        std::thread::scope(|s| {
            let mut l = Loader::threaded(s, &state, &asm, 2, 2);
            drain(&mut l, &plan, 3);
            let e = l
                .next(Pos {
                    epoch: 0,
                    start: 0,
                    j: 3,
                })
                .err()
                .unwrap()
                .message;
            assert!(e.contains("no micro-batch"), "{e}");
        });
        // a loop that stops after one batch of many: the scope ends (threads stop)
        let state = LoaderState::new(Source::new(&plan, 0, start(), 1000, None));
        std::thread::scope(|s| {
            let mut l = Loader::threaded(s, &state, &asm, 3, 4);
            drain(&mut l, &plan, 1);
        });
    }

    #[test]
    fn a_failing_assembly_names_the_samples_and_file_and_never_hangs() {
        let plan = plan(16, 4);
        // labels claim 2 features per sample, but the data holds fewer values: gathering the
        // later samples panics
        let mut data = dataset(16);
        if let crate::data::Samples::Rows { x, .. } = &mut data.samples {
            x.truncate(2 * 9);
        }
        let asm = assembler(&data, 1, "data.path = \"broken.csv\"");
        let run = |mut l: Loader<'_, '_>| {
            let mut pos = start();
            loop {
                match l.next(pos) {
                    Ok(_) => pos.j += 1,
                    Err(e) => return (pos.j, e.message),
                }
            }
        };
        let state = LoaderState::new(Source::new(&plan, 0, start(), 4, None));
        let (j, inline) = run(Loader::inline(&state, &asm));
        assert_eq!(j, 2);
        assert!(
            inline.starts_with(
                "rank 1: assembling micro-batch 2 of epoch 0 (samples 8, 9, 10, 11 of data.path = \"broken.csv\") failed: "
            ),
            "{inline}"
        );
        for workers in [1, 3] {
            let state = LoaderState::new(Source::new(&plan, 0, start(), 4, None));
            let got = std::thread::scope(|s| run(Loader::threaded(s, &state, &asm, workers, 2)));
            assert_eq!(got, (j, inline.clone()));
        }
    }
}
