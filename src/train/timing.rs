//! Where a rank's time goes. Each moment of the step loop is charged to the innermost phase
//! open at that moment (exclusive time): a collective op inside the forward (an fsdp gather)
//! counts as communication, not forward. Always on: a phase boundary costs two clock reads.
//! While profiling, every closed phase is also kept as a span for a Chrome trace.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};

/// What a rank is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// Batch assembly: indices to a batch.
    Data,
    Forward,
    Backward,
    /// Optimizer step, gradient clipping and the bookkeeping of `update` (its collectives count
    /// as communication).
    Optimizer,
    Eval,
    Checkpoint,
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Barrier,
    /// The compute waiting for communication that runs beside it (`strategy.overlap`): the
    /// part of that communication the compute could not hide.
    Wait,
    /// Anything else: logging, metrics, the loop itself.
    Other,
}

pub const PHASES: [Phase; 14] = [
    Phase::Data,
    Phase::Forward,
    Phase::Backward,
    Phase::Optimizer,
    Phase::Eval,
    Phase::Checkpoint,
    Phase::AllReduce,
    Phase::AllGather,
    Phase::ReduceScatter,
    Phase::Broadcast,
    Phase::Reduce,
    Phase::Barrier,
    Phase::Wait,
    Phase::Other,
];

impl Phase {
    /// The phase of a collective op of `kind`.
    pub fn of_op(kind: crate::collective::OpKind) -> Phase {
        use crate::collective::OpKind;
        match kind {
            OpKind::AllReduce => Phase::AllReduce,
            OpKind::AllGather => Phase::AllGather,
            OpKind::ReduceScatter => Phase::ReduceScatter,
            OpKind::Broadcast => Phase::Broadcast,
            OpKind::Reduce => Phase::Reduce,
            OpKind::Barrier => Phase::Barrier,
            _ => Phase::Other,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Eval => "eval",
            Phase::Checkpoint => "checkpoint",
            Phase::AllReduce => "all_reduce",
            Phase::AllGather => "all_gather",
            Phase::ReduceScatter => "reduce_scatter",
            Phase::Broadcast => "broadcast",
            Phase::Reduce => "reduce",
            Phase::Barrier => "barrier",
            Phase::Wait => "comm_wait",
            Phase::Other => "other",
        }
    }
    pub fn is_comm(self) -> bool {
        matches!(
            self,
            Phase::AllReduce
                | Phase::AllGather
                | Phase::ReduceScatter
                | Phase::Broadcast
                | Phase::Reduce
                | Phase::Barrier
                | Phase::Wait
        )
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// Seconds per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals(pub [f64; 14]);

impl Totals {
    pub fn total(&self) -> f64 {
        self.0.iter().sum()
    }
    pub fn get(&self, p: Phase) -> f64 {
        self.0[p.index()]
    }
    /// The phases that took any time, with their share of the total, in `PHASES` order.
    pub fn fractions(&self) -> Vec<(Phase, f64)> {
        let total = self.total().max(1e-12);
        PHASES
            .iter()
            .filter(|p| self.get(**p) > 0.0)
            .map(|p| (*p, self.get(*p) / total))
            .collect()
    }
    /// `{"data": 0.02, "forward": 0.3, ...}` (4 decimals).
    pub fn fractions_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for (p, f) in self.fractions() {
            m.insert(p.name().into(), json!((f * 1e4).round() / 1e4));
        }
        Value::Object(m)
    }
    /// `{"data": 1.23, ...}` seconds (4 decimals).
    pub fn seconds_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for p in PHASES {
            if self.get(p) > 0.0 {
                m.insert(p.name().into(), json!((self.get(p) * 1e4).round() / 1e4));
            }
        }
        Value::Object(m)
    }
    /// Milliseconds per step of `steps` steps in these totals, evaluation and checkpoints left
    /// out: the training step alone (issue 45: the end-of-run line divided the wall time,
    /// evaluation included).
    pub fn step_ms(&self, steps: usize) -> f64 {
        let train = self.total() - self.get(Phase::Eval) - self.get(Phase::Checkpoint);
        train.max(0.0) * 1e3 / steps.max(1) as f64
    }
    /// The mean of several ranks' totals.
    pub fn mean(all: &[Totals]) -> Totals {
        let mut out = Totals::default();
        for t in all {
            for (o, v) in out.0.iter_mut().zip(t.0) {
                *o += v / all.len().max(1) as f64;
            }
        }
        out
    }
    /// `data 2%, forward 30%, backward 45%, all_reduce 18%, optimizer 5%` (phases under 0.5%
    /// left out).
    pub fn describe(&self) -> String {
        self.fractions()
            .iter()
            .filter(|(_, f)| *f >= 0.005)
            .map(|(p, f)| format!("{} {:.0}%", p.name(), f * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A closed phase, for a trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Span {
    pub name: &'static str,
    /// Whole microseconds since the Unix epoch (a base every rank and node shares).
    pub ts: f64,
    pub dur: f64,
    /// A collective's op number (the same on every rank) and bytes.
    pub op: Option<(u64, usize)>,
    /// The step the span belongs to.
    pub step: usize,
    /// 0: the rank's compute thread; 1: its communication thread (`strategy.overlap`).
    pub track: u8,
}

/// One rank's clock.
pub struct Recorder {
    origin: Instant,
    origin_us: f64,
    last: Instant,
    stack: Vec<(Phase, Instant)>,
    totals: Totals,
    window: Totals,
    tracing: bool,
    spans: Vec<Span>,
    step: usize,
    /// When the current step began, while it is traced.
    step_start: Option<Instant>,
    /// Collective ops closed so far, shared by a rank's two recorders: one numbering per rank.
    ops: Arc<std::sync::atomic::AtomicU64>,
    /// Waits for the device's queued work, so device phases are charged where they run.
    sync: Option<Box<dyn Fn() + Send>>,
    /// The trace track its spans go on.
    track: u8,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        let now = Instant::now();
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1e6)
            .unwrap_or(0.0);
        Recorder {
            origin: now,
            origin_us: unix,
            last: now,
            stack: Vec::new(),
            totals: Totals::default(),
            window: Totals::default(),
            tracing: false,
            spans: Vec::new(),
            step: 0,
            step_start: None,
            ops: Arc::default(),
            sync: None,
            track: 0,
        }
    }

    /// A recorder for the communication thread of the rank `main` records (trace track 1,
    /// the same op numbering).
    pub fn comm_track(main: &Recorder) -> Self {
        Recorder {
            track: 1,
            ops: Arc::clone(&main.ops),
            ..Recorder::new()
        }
    }

    /// Whole microseconds since the Unix epoch at `t`. Whole numbers are exact in an f64 (at
    /// 1.8e15 a fraction is not), so a span's end and the next one's start never cross and spans
    /// nest exactly as they ran.
    fn micros(&self, t: Instant) -> f64 {
        (self.origin_us + t.duration_since(self.origin).as_secs_f64() * 1e6).floor()
    }

    /// Forgets what was measured so far (set-up before the first step).
    pub fn reset(&mut self) {
        self.account();
        self.totals = Totals::default();
        self.window = Totals::default();
        self.spans.clear();
    }

    /// Synchronises the device at every phase boundary (CUDA: its kernels run asynchronously).
    pub fn set_sync(&mut self, sync: Box<dyn Fn() + Send>) {
        self.sync = Some(sync);
    }

    fn account(&mut self) {
        if let Some(s) = &self.sync {
            s();
        }
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        let top = self.stack.last().map(|s| s.0).unwrap_or(Phase::Other);
        self.totals.0[top.index()] += dt;
        self.window.0[top.index()] += dt;
        self.last = now;
    }

    pub fn enter(&mut self, p: Phase) {
        self.account();
        self.stack.push((p, self.last));
    }

    /// Closes the innermost phase; `op` is a collective's bytes (it gets the next op number).
    pub fn exit(&mut self, bytes: Option<usize>) {
        self.account();
        let Some((p, start)) = self.stack.pop() else {
            return;
        };
        let op = bytes.map(|b| {
            let n = self.ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            (n, b)
        });
        if self.tracing {
            let ts = self.micros(start);
            let dur = self.micros(self.last) - ts;
            self.spans.push(Span {
                name: p.name(),
                ts,
                dur,
                op,
                step: self.step,
                track: self.track,
            });
        }
    }

    /// The step now running, and whether its spans are kept (a traced step is a span too).
    pub fn begin_step(&mut self, step: usize, tracing: bool) {
        self.end_step();
        self.step = step;
        self.tracing = tracing;
        self.step_start = tracing.then(Instant::now);
    }

    /// Closes the span of the current step, if it is traced.
    pub fn end_step(&mut self) {
        if let Some(start) = self.step_start.take() {
            let ts = self.micros(start);
            let dur = self.micros(Instant::now()) - ts;
            self.spans.push(Span {
                name: "step",
                ts,
                dur,
                op: None,
                step: self.step,
                track: self.track,
            });
        }
        self.tracing = false;
    }

    pub fn totals(&mut self) -> Totals {
        self.account();
        self.totals
    }

    /// A collective op that ran beside the compute on the device (NCCL's own stream): its
    /// device time `dur` counts for phase `p`, and with tracing it is a span from `queued` (when
    /// the compute queued it; the device ran it then or later) carrying its op number and bytes.
    pub fn record_beside(
        &mut self,
        p: Phase,
        queued: Instant,
        dur: std::time::Duration,
        op: (u64, usize),
    ) {
        let secs = dur.as_secs_f64();
        self.totals.0[p.index()] += secs;
        self.window.0[p.index()] += secs;
        if self.tracing {
            let ts = self.micros(queued);
            self.spans.push(Span {
                name: p.name(),
                ts,
                dur: (secs * 1e6).round(),
                op: Some(op),
                step: self.step,
                track: self.track,
            });
        }
    }

    /// The totals since the last call.
    pub fn take_window(&mut self) -> Totals {
        self.account();
        std::mem::take(&mut self.window)
    }

    pub fn take_spans(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.spans)
    }
}

/// A rank's clock: the recorder of its compute thread (the step loop, and the collective ops
/// it runs itself) and the recorder of its communication thread (ops submitted to run beside
/// the compute). A collective op is charged to whichever thread runs it.
#[derive(Clone)]
pub struct Clock {
    main: Arc<Mutex<Recorder>>,
    comm: Arc<Mutex<Recorder>>,
}

impl Default for Clock {
    fn default() -> Self {
        let main = Recorder::new();
        let comm = Recorder::comm_track(&main);
        Clock {
            main: Arc::new(Mutex::new(main)),
            comm: Arc::new(Mutex::new(comm)),
        }
    }
}

fn lock_recorder(m: &Mutex<Recorder>) -> MutexGuard<'_, Recorder> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Clock {
    pub fn new() -> Self {
        Clock::default()
    }
    /// The compute thread's recorder.
    pub fn lock(&self) -> MutexGuard<'_, Recorder> {
        lock_recorder(&self.main)
    }
    /// The communication thread's recorder: its totals are the communication that ran beside
    /// the compute.
    pub fn comm(&self) -> MutexGuard<'_, Recorder> {
        lock_recorder(&self.comm)
    }
    /// Runs `f` as phase `p`.
    pub fn time<T>(&self, p: Phase, f: impl FnOnce() -> T) -> T {
        self.lock().enter(p);
        let out = f();
        self.lock().exit(None);
        out
    }
    /// Runs `f` as collective op `p` on `bytes`, on the track of the thread that runs it.
    pub fn op<T>(&self, p: Phase, bytes: usize, f: impl FnOnce() -> T) -> T {
        let rec = if crate::collective::on_comm_thread() {
            &self.comm
        } else {
            &self.main
        };
        lock_recorder(rec).enter(p);
        let out = f();
        lock_recorder(rec).exit(Some(bytes));
        out
    }
    /// The next collective op number (ops numbered in call order, the same on every rank).
    pub fn next_op(&self) -> u64 {
        self.lock()
            .ops
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }
    /// Forgets what was measured so far, on both tracks.
    pub fn reset(&self) {
        self.lock().reset();
        self.comm().reset();
    }
    /// The step now running on both tracks, and whether its spans are kept.
    pub fn begin_step(&self, step: usize, tracing: bool) {
        self.lock().begin_step(step, tracing);
        // the communication track has no step span of its own
        let mut c = self.comm();
        c.end_step();
        c.step = step;
        c.tracing = tracing;
    }
    pub fn end_step(&self) {
        self.lock().end_step();
        self.comm().tracing = false;
    }
    /// Both tracks' spans.
    pub fn take_spans(&self) -> Vec<Span> {
        let mut spans = self.lock().take_spans();
        spans.extend(self.comm().take_spans());
        spans
    }
}

/// Times the compute's waits for communication running beside it as `Phase::Wait`.
pub fn wait_hook(clock: &Clock) -> crate::collective::WaitHook {
    let clock = clock.clone();
    Arc::new(move |_kind, wait: &mut dyn FnMut()| clock.time(Phase::Wait, wait))
}

/// The communication figures of a rank: `total` seconds of communication, wherever it ran, and
/// `exposed` seconds of them the compute spent in it or waiting for it. Without overlap the
/// two are equal.
pub fn comm_seconds(main: &Totals, comm: &Totals) -> (f64, f64) {
    let on_main: f64 = PHASES
        .iter()
        .filter(|p| p.is_comm())
        .map(|p| main.get(*p))
        .sum();
    let inline = on_main - main.get(Phase::Wait);
    let beside: f64 = PHASES
        .iter()
        .filter(|p| p.is_comm())
        .map(|p| comm.get(*p))
        .sum();
    (inline + beside, on_main)
}

/// Chrome trace-event JSON (`{"traceEvents": [...]}`) of ranks' spans: one track per rank
/// (pid = rank), complete events sorted by start time, a collective's op number and bytes in
/// its args.
pub fn trace_json(ranks: &[(usize, String, Vec<Span>)]) -> Value {
    let mut events = Vec::new();
    for (rank, label, spans) in ranks {
        events.push(
            json!({"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
                           "args": {"name": label}}),
        );
        events.push(
            json!({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0,
                           "args": {"sort_index": rank}}),
        );
        for (tid, name) in [(0, "compute"), (1, "communication")] {
            if tid == 0 || spans.iter().any(|s| s.track == tid) {
                events.push(
                    json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                                   "args": {"name": name}}),
                );
            }
        }
        let mut spans: Vec<&Span> = spans.iter().collect();
        // by start; an enclosing span before the spans it contains
        spans.sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.dur.total_cmp(&a.dur)));
        for s in spans {
            let cat = match (s.op, s.name) {
                (Some(_), _) => "comm",
                (None, "step") => "step",
                _ => "phase",
            };
            let mut args = json!({"step": s.step});
            if let Some((op, bytes)) = s.op {
                args["op"] = json!(op);
                args["bytes"] = json!(bytes);
            }
            events.push(json!({"name": s.name, "cat": cat, "ph": "X", "ts": s.ts,
                               "dur": s.dur, "pid": rank, "tid": s.track, "args": args}));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_is_charged_to_the_innermost_phase() {
        let mut r = Recorder::new();
        r.begin_step(1, true);
        r.enter(Phase::Forward);
        std::thread::sleep(std::time::Duration::from_millis(4));
        r.enter(Phase::AllGather);
        std::thread::sleep(std::time::Duration::from_millis(4));
        r.exit(Some(64));
        r.exit(None);
        let t = r.totals();
        assert!(t.get(Phase::Forward) >= 0.004, "{t:?}");
        assert!(t.get(Phase::AllGather) >= 0.004, "{t:?}");
        let spans = r.take_spans();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].op, Some((1, 64)));
        assert!(spans[1].dur >= spans[0].dur);
        let f: f64 = t.fractions().iter().map(|x| x.1).sum();
        assert!((f - 1.0).abs() < 1e-9);
    }
}
