//! Overlap over a slow link: ddp(2) and fsdp(2) step time with `strategy.overlap` on and off,
//! over an in-process collective that waits a fixed delay before every op (a link with that
//! latency), injected through `launch::run_with_collectives`. Runs alternate on/off, three of
//! each; prints the medians, their ratio, and from a traced step how much of the communication
//! track's time lies inside backward spans.
//!
//!   cargo bench --bench overlap                   # 20 ms per op
//!   cargo bench --bench overlap -- --delay-ms 4,40
//!
//! The traced step of the last run with overlap is written to
//! `target/bench-overlap/<ddp|fsdp>-<delay>ms.json` (open it in Perfetto or chrome://tracing:
//! each rank's communication thread is its own track).
//!
//! The experiment is `experiments/bench-overlap.toml` (a gpt of 8 blocks of width 192, batch 4,
//! one rank per core).

use std::time::Duration;

use burn::backend::{Autodiff, Flex};
use kiln::collective::{Collective, CollectiveError, LocalGroup, LocalRank, ReduceOp};
use kiln::launch::RunResult;
use kiln::plan::Plan;
use kiln::train::{Span, TrainInput};

/// A collective whose every op first waits `delay`.
struct SlowLink {
    inner: LocalRank,
    delay: Duration,
}

impl SlowLink {
    fn wait(&self) {
        std::thread::sleep(self.delay);
    }
}

impl Collective for SlowLink {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.all_reduce(buf, op)
    }
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.all_reduce_f64(buf, op)
    }
    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.reduce(buf, op, root)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.broadcast(buf, root)
    }
    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.all_gather(send, out)
    }
    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.all_gather_f64(send, out)
    }
    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.reduce_scatter(send, out, op)
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.wait();
        self.inner.barrier()
    }
    fn abort(&self, reason: &str) {
        self.inner.abort(reason)
    }
}

/// Milliseconds of `comm` spans (track 1) that lie inside `backward` spans (track 0).
fn overlapped_ms(spans: &[Span]) -> (f64, f64) {
    let backward: Vec<(f64, f64)> = spans
        .iter()
        .filter(|s| s.track == 0 && s.name == "backward")
        .map(|s| (s.ts, s.ts + s.dur))
        .collect();
    let mut inside = 0.0;
    let mut total = 0.0;
    for c in spans.iter().filter(|s| s.track == 1 && s.op.is_some()) {
        total += c.dur;
        for (b0, b1) in &backward {
            let lo = c.ts.max(*b0);
            let hi = (c.ts + c.dur).min(*b1);
            if hi > lo {
                inside += hi - lo;
            }
        }
    }
    (inside / 1e3, total / 1e3)
}

fn run(sets: &[String], delay: Duration) -> RunResult {
    let exp = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/experiments/bench-overlap.toml"
    );
    let r = kiln::config::load(std::path::Path::new(exp), &[], sets).expect("config");
    let data = kiln::data::load(&r).expect("data");
    let model = kiln::model::build(&r, &data.input_shape()).expect("model");
    let plan = Plan::new(&r.config, data.train.len(), model.num_params());
    let input = TrainInput {
        config: &r.config,
        plan: &plan,
        data: &data,
        model: model.as_ref(),
        store: None,
        resume: None,
        init: None,
        shared_init: Default::default(),
        keep_params: false,
    };
    let placement = kiln::backend::resolve(&r.config).expect("backend");
    let world = r.config.strategy.devices.count();
    let comms: Vec<Box<dyn Collective>> = LocalGroup::ranks(world, Duration::from_secs(300))
        .into_iter()
        .map(|inner| Box::new(SlowLink { inner, delay }) as Box<dyn Collective>)
        .collect();
    kiln::launch::run_with_collectives::<Autodiff<Flex>>(
        &input,
        &placement,
        1,
        None,
        comms,
        &mut |_| {},
    )
    .expect("training")
}

/// The traced step of both ranks as a Chrome trace, `target/bench-overlap/<name>.json`.
fn write_trace(res: &RunResult, name: &str) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench-overlap");
    std::fs::create_dir_all(dir).expect("target/bench-overlap");
    let ranks: Vec<(usize, String, Vec<Span>)> = res
        .time
        .iter()
        .map(|t| (t.rank, format!("rank {}", t.rank), t.spans.clone()))
        .collect();
    let trace = kiln::train::timing::trace_json(&ranks);
    std::fs::write(format!("{dir}/{name}.json"), trace.to_string()).expect("trace");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let delays: Vec<u64> = args
        .iter()
        .position(|a| a == "--delay-ms")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.split(',')
                .map(|d| {
                    d.trim()
                        .parse()
                        .expect("--delay-ms takes whole milliseconds, e.g. 10,25")
                })
                .collect()
        })
        .unwrap_or_else(|| vec![20]);
    for delay_ms in delays {
        bench(delay_ms);
    }
}

fn bench(delay_ms: u64) {
    let delay = Duration::from_millis(delay_ms);
    println!("slow link: {delay_ms} ms before every collective op; 3 runs each, alternating");
    for (name, kind) in [("ddp(2)", "ddp"), ("fsdp(2)", "fsdp")] {
        let mut ms = [Vec::new(), Vec::new()];
        let mut traced = [(0.0, 0.0); 2];
        for _ in 0..3 {
            for (i, overlap) in [true, false].into_iter().enumerate() {
                let sets = vec![
                    format!("strategy.kind=\"{kind}\""),
                    format!("strategy.overlap={overlap}"),
                ];
                let res = run(&sets, delay);
                let steps = res.outcome.steps.max(1);
                ms[i].push(res.outcome.wall_seconds * 1e3 / steps as f64);
                traced[i] = overlapped_ms(&res.time[0].spans);
                if overlap {
                    write_trace(&res, &format!("{kind}-{delay_ms}ms"));
                }
            }
        }
        let (on, off) = (median(ms[0].clone()), median(ms[1].clone()));
        println!(
            "{name:8} step {on:7.1} ms with overlap, {off:7.1} ms without: {:.2}x; traced step: {:.1} of {:.1} ms of communication inside backward spans (without overlap: {:.1} of {:.1})",
            on / off,
            traced[0].0,
            traced[0].1,
            traced[1].0,
            traced[1].1,
        );
    }
}
