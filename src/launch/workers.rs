//! Running this node's rank threads.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::backend::{CommKind, Placement, RankBackend};
use crate::collective::node::NodeRank;
use crate::collective::tcp::TcpRing;
use crate::collective::{Collective, CollectiveError, LocalGroup, LocalRank};
use crate::rendezvous::JobStop;
use crate::strategy::{self, Memory};
use crate::train::{self, Outcome, RankSink, TrainError, TrainEvent, TrainInput};

/// What all ranks produced.
#[derive(Debug)]
pub struct RunResult {
    /// The outcome of this node's first rank (rank 0's on node 0).
    pub outcome: Outcome,
    /// Every rank's memory, in rank order.
    pub memory: Vec<Memory>,
    /// Each local rank's time, in rank order.
    pub time: Vec<RankTime>,
}

/// Where one rank's time went.
#[derive(Debug)]
pub struct RankTime {
    pub rank: usize,
    /// Seconds per phase of the compute thread.
    pub main: train::Totals,
    /// Seconds per op of the communication thread (`strategy.overlap`).
    pub comm: train::Totals,
    /// The profiled spans of both.
    pub spans: Vec<train::Span>,
}

struct Sink {
    rank: usize,
    events: mpsc::Sender<TrainEvent>,
    log: Option<BufWriter<File>>,
}

impl RankSink for Sink {
    fn event(&mut self, event: TrainEvent) {
        if self.rank == 0 {
            // The receiver only goes away when the caller stopped listening; keep training.
            let _ = self.events.send(event);
        }
    }
    fn log(&mut self, line: &str) {
        if let Some(f) = &mut self.log {
            // Rank logs are diagnostics: a full disk must not kill the run here.
            let now = crate::ui::rfc3339(std::time::SystemTime::now());
            let _ = writeln!(f, "{now} {line}").and_then(|_| f.flush());
        }
    }
}

/// This node's link to the other nodes of a job.
pub struct NodeLink {
    pub node: usize,
    pub nnodes: usize,
    /// The TCP ring, used by local rank 0.
    pub ring: Option<TcpRing>,
    /// Stops this node's ranks when the job is stopped (see `rendezvous::JobStop`).
    pub stop: Arc<JobStop>,
    /// Links the rings of sub-groups that span nodes.
    pub links: Arc<dyn crate::collective::tcp::RingLinker>,
    /// The job's NCCL unique id (CUDA), shared through the rendezvous store.
    #[cfg(feature = "cuda")]
    pub nccl_id: Option<crate::collective::nccl::Id>,
}

/// Runs every rank of this node on backend `B` and waits for all of them. `threads` is the size
/// of each rank's pool; `logs` is where `rank-<r>.log` files go (none when `None`).
pub fn train_ranks<B: RankBackend>(
    input: &TrainInput<'_>,
    placement: &Placement,
    threads: usize,
    logs: Option<&Path>,
    link: Option<NodeLink>,
    on_event: &mut dyn FnMut(TrainEvent),
) -> Result<RunResult, TrainError> {
    let c = input.config;
    let nproc = c.strategy.devices.count();
    let node = link.as_ref().map(|l| l.node).unwrap_or(0);
    let timeout = Duration::from_secs(c.strategy.timeout_secs);
    let comms: Vec<RankComm> = match (placement.collective, link) {
        // NCCL across processes: every rank joins one communicator with its global rank
        #[cfg(feature = "cuda")]
        (CommKind::Nccl, Some(link)) => {
            let id = match link.nccl_id {
                Some(id) => id,
                None => crate::collective::nccl::new_id().map_err(TrainError::Collective)?,
            };
            let shared = crate::collective::nccl::RankGroup::new();
            let stopper = shared.clone();
            link.stop.on_stop(move |why| stopper.stop(why));
            (0..nproc)
                .map(|_| RankComm::Nccl(id, shared.clone(), nproc))
                .collect()
        }
        (_, Some(mut link)) => {
            let mut ring = link.ring.take();
            let group = LocalGroup::ranks(nproc, timeout);
            // a stopped job stops every rank here at once, even one blocked on the ring
            let stopper = group.first().map(|l| l.stopper());
            let closer = ring.as_ref().map(|r| r.closer());
            link.stop.on_stop(move |why| {
                if let Some(c) = &closer {
                    c.close();
                }
                if let Some(s) = &stopper {
                    s.stop(why);
                }
            });
            group
                .into_iter()
                .map(|l| {
                    let r = if l.rank() == 0 { ring.take() } else { None };
                    RankComm::Node(NodeRank::new(
                        l,
                        r,
                        link.node,
                        link.nnodes,
                        Some(Arc::clone(&link.links)),
                    ))
                })
                .collect()
        }
        (CommKind::Host, None) => LocalGroup::ranks(nproc, timeout)
            .into_iter()
            .map(RankComm::Local)
            .collect(),
        #[cfg(feature = "cuda")]
        (CommKind::Nccl, None) => {
            let id = crate::collective::nccl::new_id().map_err(TrainError::Collective)?;
            let shared = crate::collective::nccl::RankGroup::new();
            (0..nproc)
                .map(|_| RankComm::Nccl(id, shared.clone(), nproc))
                .collect()
        }
        #[cfg(not(feature = "cuda"))]
        (CommKind::Nccl, None) => LocalGroup::ranks(nproc, timeout)
            .into_iter()
            .map(RankComm::Local)
            .collect(),
    };
    run_ranks::<B>(input, placement, threads, logs, node, comms, on_event)
}

/// Runs one thread per rank of `comms` and waits for all of them.
fn run_ranks<B: RankBackend>(
    input: &TrainInput<'_>,
    placement: &Placement,
    threads: usize,
    logs: Option<&Path>,
    node: usize,
    comms: Vec<RankComm>,
    on_event: &mut dyn FnMut(TrainEvent),
) -> Result<RunResult, TrainError> {
    let nproc = comms.len();
    let (tx, rx) = mpsc::channel();
    let results: Vec<Result<Outcome, TrainError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(local, comm)| {
                let rank = node * nproc + local;
                let tx = tx.clone();
                // appended to: a resumed or restarted run keeps every session's lines
                let log = logs.and_then(|d| {
                    let path = d.join(format!("rank-{rank}.log"));
                    match crate::rundir::open_no_follow(
                        std::fs::OpenOptions::new().create(true).append(true),
                        &path,
                    ) {
                        Ok(f) => Some(BufWriter::new(f)),
                        // said, on every node (issue 45: a node other than node 0 said
                        // nothing, and its rank's lines went nowhere)
                        Err(e) => {
                            crate::ui::note(&format!(
                                "warning: rank {rank}'s log `{}` cannot be opened ({e}); the rank trains without it",
                                path.display()
                            ));
                            None
                        }
                    }
                });
                std::thread::Builder::new()
                    .name(format!("kiln-rank-{rank}"))
                    .spawn_scoped(scope, move || {
                        // this rank's bytes, measured (this process's ranks by local index)
                        crate::memory::attribute(local);
                        let mut sink = Sink {
                            rank,
                            events: tx,
                            log,
                        };
                        sink.log(&session_header(input, rank));
                        if let Some(note) = &placement.note {
                            sink.log(note);
                        }
                        rank_main::<B>(input, rank, placement.ordinals[local], comm, threads, sink)
                    })
            })
            .collect();
        drop(tx);
        for ev in rx {
            on_event(ev);
        }
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| match h {
                Ok(h) => h.join().unwrap_or_else(|p| {
                    Err(TrainError::Panic {
                        rank,
                        message: crate::panic::message(p.as_ref()),
                    })
                }),
                Err(e) => Err(TrainError::Panic {
                    rank,
                    message: format!("could not start the rank's thread: {e}"),
                }),
            })
            .collect()
    });
    let mut outcomes = Vec::with_capacity(nproc);
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(o) => outcomes.push(o),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        // The root cause, not the ranks that stopped because of it.
        let pos = errors
            .iter()
            .position(|e| !matches!(e, TrainError::Collective(CollectiveError::Aborted { .. })))
            .unwrap_or(0);
        return Err(errors.swap_remove(pos));
    }
    let memory = outcomes.iter().map(|o| o.memory).collect();
    let time = outcomes
        .iter_mut()
        .map(|o| RankTime {
            rank: o.memory.rank,
            main: o.time,
            comm: o.comm_time,
            spans: std::mem::take(&mut o.spans),
        })
        .collect();
    let outcome = outcomes.swap_remove(0);
    Ok(RunResult {
        outcome,
        memory,
        time,
    })
}

/// Like `train_ranks`, over the given collectives (one per local rank, in rank order) instead of the
/// ones the placement calls for: how tests inject faults through a collective of their own.
pub fn run_with_collectives<B: RankBackend>(
    input: &TrainInput<'_>,
    placement: &Placement,
    threads: usize,
    logs: Option<&Path>,
    comms: Vec<Box<dyn Collective>>,
    on_event: &mut dyn FnMut(TrainEvent),
) -> Result<RunResult, TrainError> {
    let comms = comms.into_iter().map(RankComm::Given).collect();
    run_ranks::<B>(input, placement, threads, logs, 0, comms, on_event)
}

/// A rank's end of the collective, before it is connected.
enum RankComm {
    /// Already connected (given by the caller).
    Given(Box<dyn Collective>),
    Local(LocalRank),
    Node(NodeRank),
    #[cfg(feature = "cuda")]
    /// The group's id, what the ranks of this process share, and how many they are.
    Nccl(
        crate::collective::nccl::Id,
        std::sync::Arc<crate::collective::nccl::RankGroup>,
        usize,
    ),
}

fn connect(
    comm: RankComm,
    rank: usize,
    world: usize,
    ordinal: usize,
    timeout: Duration,
) -> Result<Box<dyn Collective>, CollectiveError> {
    let _ = (rank, world, ordinal, timeout);
    match comm {
        RankComm::Given(c) => Ok(c),
        RankComm::Local(l) => Ok(Box::new(l)),
        RankComm::Node(n) => Ok(Box::new(n)),
        #[cfg(feature = "cuda")]
        RankComm::Nccl(id, shared, local) => {
            Ok(Box::new(crate::collective::nccl::NcclRank::connect(
                id, rank, world, ordinal, local, shared, timeout,
            )?))
        }
    }
}

fn rank_main<B: RankBackend>(
    input: &TrainInput<'_>,
    rank: usize,
    ordinal: usize,
    comm: RankComm,
    threads: usize,
    mut sink: Sink,
) -> Result<Outcome, TrainError> {
    let timeout = Duration::from_secs(input.config.strategy.timeout_secs);
    let comm = match connect(comm, rank, input.plan.world_size, ordinal, timeout) {
        Ok(c) => c,
        Err(e) => {
            sink.log(&format!("error: {e}"));
            return Err(e.into());
        }
    };
    // the rank's math threads count for it too
    let memory_key = crate::memory::attributed();
    let pool = match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-rank-{rank}-math-{i}"))
        .start_handler(move |_| {
            if let Some(key) = memory_key {
                crate::memory::attribute(key);
            }
        })
        .build()
    {
        Ok(p) => p,
        Err(e) => {
            let err = TrainError::Panic {
                rank,
                message: format!("cannot start {threads} threads (backend.threads): {e}"),
            };
            comm.abort(&err.to_string());
            return Err(err);
        }
    };
    let device = B::rank_device(&input.config.backend, ordinal);
    if let Err(why) = B::prepare(&device, input.config.backend.precision) {
        let err = TrainError::Backend { rank, reason: why };
        sink.log(&format!("error: {err}"));
        comm.abort(&err.to_string());
        return Err(err);
    }
    // the strategy lives on the pool thread that trains (it may hold device buffers, which stay
    // on the thread whose stream made them)
    pool.install(move || {
        let clock = train::Clock::new();
        if B::asynchronous() {
            let dev = device.clone();
            clock.lock().set_sync(Box::new(move || {
                let _ = <B as burn::tensor::backend::Backend>::sync(&dev);
            }));
            sink.log("step-time breakdown: the device is synchronised at each phase boundary (no device events in Burn 0.21), which costs some overlap");
        } else {
            sink.log("step-time breakdown: host clock at each phase boundary");
        }
        let mut comm = comm;
        // HSDP's shard and replica groups, each timed like the world
        let hybrid = match strategy::hybrid_groups(input.config, comm.as_mut()) {
            Ok(h) => h.map(|h| strategy::Hybrid {
                shard: Box::new(train::Timed::new(h.shard, clock.clone())),
                replica: Box::new(train::Timed::new(h.replica, clock.clone())),
            }),
            Err(e) => {
                let err = TrainError::from(e);
                sink.log(&format!("error: {err}"));
                comm.abort(&err.to_string());
                return Err(err);
            }
        };
        let comm: Box<dyn Collective> = Box::new(train::Timed::new(comm, clock.clone()));
        let mut strategy = strategy::build(
            input.config,
            input.model.layout(),
            input.model.decay_rule(&input.config.optim),
            comm,
            hybrid,
            Some(train::wait_hook(&clock)),
        );
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            train::train::<B>(
                input,
                strategy.as_mut(),
                &device,
                B::raw_fn(),
                &mut sink,
                &clock,
            )
        }))
        .unwrap_or_else(|p| {
            Err(TrainError::Panic {
                rank,
                message: crate::panic::message(p.as_ref()),
            })
        });
        if let Err(e) = &result {
            sink.log(&format!("error: {e}"));
            strategy.abort(&format!(
                "rank {rank} failed: {}",
                first_line(&e.to_string())
            ));
        }
        result
    })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// The first line of a session in a rank's log: which kiln, which config, where, which process.
fn session_header(input: &TrainInput<'_>, rank: usize) -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we read up to the first NUL only.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len() - 1) } == 0;
    let host = if ok {
        let end = host.iter().position(|b| *b == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        "?".to_string()
    };
    format!(
        "=== session: kiln {}, config {}, host {host}, pid {}, rank {rank} of world size {}, from step {} ===",
        env!("CARGO_PKG_VERSION"),
        crate::config::config_hash(input.config),
        std::process::id(),
        input.plan.world_size,
        input.resume.map_or(0, |l| l.state.step)
    )
}
