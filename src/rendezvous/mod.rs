//! Layer: rendezvous (above collective and config; below rundir's readers, launch and slurm).
//!
//! Joining a multi-node job: node 0 starts the store; every node authenticates with the job
//! token, registers the address of its ring listener, waits for every node (the timeout names the
//! nodes that never arrived), and connects the TCP ring its leader rank uses.

use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

pub mod nccl_env;
pub mod store;
pub mod token;

pub use token::{launcher_token, token, token_with, MAX_TOKEN};

use crate::collective::tcp::{RingCloser, RingLinker, TcpRing};
use crate::config::Config;
use store::{write_frame, StoreClient, StoreError, StoreServer};

/// "node 3 never arrived", or for many "nodes 1-4, 7, 9-12 never arrived (9 of 16)": ranges,
/// at most 20 of them, and a count (issue 45, defect 25: 50,000 missing nodes made a 1.29 MB
/// message).
pub fn never_arrived(nodes: &[usize], of: usize) -> String {
    let mut sorted = nodes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    if let [one] = sorted[..] {
        return format!("node {one} never arrived");
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &n in &sorted {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == n => *hi = n,
            _ => runs.push((n, n)),
        }
    }
    let mut parts: Vec<String> = runs
        .iter()
        .take(20)
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect();
    if runs.len() > 20 {
        parts.push("...".into());
    }
    format!(
        "nodes {} never arrived ({} of {of})",
        parts.join(", "),
        sorted.len()
    )
}

/// This node's membership in a running job.
pub struct Job {
    pub node: usize,
    pub nnodes: usize,
    pub client: StoreClient,
    /// Node 0 serves the store for the whole job.
    pub server: Option<StoreServer>,
    /// The ring between node leaders, handed to local rank 0.
    pub ring: Option<TcpRing>,
    /// Links the rings of sub-groups that span nodes (`Collective::split`), as the job's ring
    /// was linked.
    pub links: Arc<dyn RingLinker>,
    /// Set when this node's training ended: its heartbeats stop counting a lost store as fatal.
    pub done: Arc<AtomicBool>,
    /// Set by the heartbeats when the job was stopped or node 0's store was lost.
    pub stop: Arc<JobStop>,
}

type StopHook = Box<dyn Fn(&str) + Send>;

/// Why the job stopped under this node, and what to do about it: the heartbeat thread records
/// the reason and runs the hooks the node registered (stop its ranks, close its ring), so the
/// node's training fails at once and reports the reason, instead of the process exiting from
/// a thread.
#[derive(Default)]
pub struct JobStop {
    /// The reason (once stopped) and the hooks still to run, under one lock so that a hook is
    /// either run by `stop` or, registered after it, at once by `on_stop`.
    state: Mutex<(Option<String>, Vec<StopHook>)>,
}

impl JobStop {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Option<String>, Vec<StopHook>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `hook` when the job stops (at once if it already has).
    pub fn on_stop(&self, hook: impl Fn(&str) + Send + 'static) {
        let mut st = self.lock();
        match st.0.clone() {
            Some(reason) => {
                drop(st);
                hook(&reason);
            }
            None => st.1.push(Box::new(hook)),
        }
    }

    /// Records `reason` (the first one wins) and runs the hooks registered so far.
    pub fn stop(&self, reason: &str) {
        let hooks = {
            let mut st = self.lock();
            st.0.get_or_insert_with(|| reason.to_string());
            std::mem::take(&mut st.1)
        };
        for h in hooks {
            h(reason);
        }
    }

    /// Why the job stopped, if it did.
    pub fn reason(&self) -> Option<String> {
        self.lock().0.clone()
    }
}

impl Job {
    /// Tells the store this node finished; node 0 keeps serving until every node did.
    pub fn finish(&mut self, timeout: Duration) {
        self.done.store(true, Ordering::SeqCst);
        let _ = self.client.set(&format!("done/{}", self.node), "1");
        if self.node == 0 {
            let keys: Vec<String> = (0..self.nnodes).map(|n| format!("done/{n}")).collect();
            let _ = self.client.wait(&keys, timeout);
        }
    }
}

/// Joins round `round` (restarts so far) of the job described by `[launch]` with `nproc` ranks
/// on this node.
pub fn join(c: &Config, nproc: usize, token: &str, round: usize) -> Result<Job, StoreError> {
    let l = &c.launch;
    let (node, nnodes) = (l.node_rank, l.nnodes);
    let addr = format!("{}:{}", l.master_addr, l.master_port);
    let timeout = Duration::from_secs(l.rendezvous_timeout_secs);
    let deadline = Instant::now() + timeout;
    let heartbeat = Duration::from_secs(l.heartbeat_secs);
    let server = if node == 0 {
        Some(StoreServer::start(
            &addr,
            token.to_string(),
            round,
            heartbeat,
        )?)
    } else {
        None
    };
    let mut client = StoreClient::connect(&addr, token, node, round, timeout)?;
    // the ring listener, on the interface that reaches node 0 (a UDP "connection" picks the
    // route and sends nothing: a TCP probe would show node 0's store a connection without a
    // hello, logged as refused)
    let local_ip = std::net::UdpSocket::bind(if l.master_addr.contains(':') {
        "[::]:0"
    } else {
        "0.0.0.0:0"
    })
    .and_then(|u| u.connect(&addr).and_then(|_| u.local_addr()))
    .map(|a| a.ip().to_string())
    .unwrap_or_else(|_| l.master_addr.clone());
    let listener = TcpListener::bind(format!("{local_ip}:0"))?;
    let ring_addr = listener.local_addr()?.to_string();
    client.set(&format!("node/{node}/ring"), &ring_addr)?;
    client.set(&format!("node/{node}/nproc"), &nproc.to_string())?;
    let keys: Vec<String> = (0..nnodes).map(|n| format!("node/{n}/ring")).collect();
    let rings = match client.wait(&keys, deadline.saturating_duration_since(Instant::now()))? {
        Ok(v) => v,
        Err(missing) => {
            let nodes: Vec<usize> = missing
                .iter()
                .filter_map(|k| {
                    k.trim_start_matches("node/")
                        .trim_end_matches("/ring")
                        .parse()
                        .ok()
                })
                .collect();
            return Err(StoreError::Timeout {
                secs: timeout.as_secs(),
                missing: vec![never_arrived(&nodes, nnodes)],
            });
        }
    };
    agree(c, &mut client, node, nproc, &addr, deadline)?;
    let ring = if nnodes > 1 {
        let next_addr = &rings[(node + 1) % nnodes];
        // the link out waits for the next node's answer while this node answers its previous
        // one: both at once (in sequence, every node would wait on the next)
        let prev_node = (node + nnodes - 1) % nnodes;
        let (next, prev) = std::thread::scope(|sc| {
            let next = sc.spawn(|| ring_link(next_addr, token, node, deadline));
            let prev = accept_prev(&listener, token, prev_node, deadline);
            let next = next.join().unwrap_or_else(|_| {
                Err(StoreError::Refused {
                    addr: next_addr.clone(),
                    why: "the ring link's thread panicked".into(),
                })
            });
            (next, prev)
        });
        let (next, prev) = (next?, prev?);
        Some(TcpRing::new(
            node,
            nnodes,
            nproc,
            Some(next),
            Some(prev),
            Duration::from_secs(c.strategy.timeout_secs),
        ))
    } else {
        None
    };
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(JobStop::default());
    if !heartbeat.is_zero() {
        start_heartbeats(
            &addr,
            token,
            node,
            round,
            heartbeat,
            Arc::clone(&done),
            Arc::clone(&stop),
        )?;
    }
    let links = Arc::new(JobLinks {
        ip: local_ip,
        token: token.to_string(),
        timeout: Duration::from_secs(c.strategy.timeout_secs),
        stop: Arc::clone(&stop),
    });
    Ok(Job {
        node,
        nnodes,
        client,
        server,
        ring,
        links,
        done,
        stop,
    })
}

/// Every node has this node's device count (`nproc`) and settings (`job_settings`): the ones
/// that shape the job's collectives and steps (issue 58, defect 17: nodes with different
/// `strategy.shard_size` failed with "collective size mismatch in all_gather #0").
fn agree(
    c: &Config,
    client: &mut StoreClient,
    node: usize,
    nproc: usize,
    addr: &str,
    deadline: Instant,
) -> Result<(), StoreError> {
    let nnodes = c.launch.nnodes;
    let procs: Vec<String> = (0..nnodes).map(|n| format!("node/{n}/nproc")).collect();
    if let Ok(p) = client.wait(&procs, Duration::from_secs(5))? {
        if let Some((n, other)) = p.iter().enumerate().find(|(_, v)| **v != nproc.to_string()) {
            return Err(StoreError::Refused {
                addr: addr.to_string(),
                why: format!("node {n} has {other} devices but node {node} has {nproc}; every node needs the same `strategy.devices`"),
            });
        }
    }
    let mine = job_settings(c);
    let text = serde_json::to_string(&mine).unwrap_or_default();
    client.set(&format!("node/{node}/settings"), &text)?;
    let keys: Vec<String> = (0..nnodes).map(|n| format!("node/{n}/settings")).collect();
    let all = match client.wait(&keys, deadline.saturating_duration_since(Instant::now()))? {
        Ok(all) => all,
        Err(missing) => {
            return Err(StoreError::Mismatch(format!(
                "{} published no settings (a kiln older than this node's?)",
                missing.join(", ")
            )))
        }
    };
    // (read: node 0, which serves the store, waits for this before it exits on a mismatch, so
    // that every node reports the mismatch (exit 2) instead of a lost connection)
    let _ = client.set(&format!("node/{node}/settings_read"), "1");
    for (n, theirs) in all.iter().enumerate().filter(|(n, _)| *n != node) {
        let theirs: std::collections::BTreeMap<String, String> =
            serde_json::from_str(theirs).unwrap_or_default();
        if let Some(why) = differing(&mine, &theirs, node, n) {
            if node == 0 {
                let read: Vec<String> = (1..nnodes)
                    .map(|n| format!("node/{n}/settings_read"))
                    .collect();
                let wait = deadline
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_secs(10));
                let _ = client.wait(&read, wait);
            }
            return Err(StoreError::Mismatch(why));
        }
    }
    Ok(())
}

/// Keys that may differ from node to node: where each node is and listens, its threads and
/// loader, where it reads its files from (a node-local copy), how it reports.
const NODE_LOCAL: &[&str] = &[
    "launch.",
    // (each node's GPU ordinals; their count is compared on its own)
    "strategy.devices",
    "backend.adapter",
    "backend.threads",
    "backend.nccl",
    "data.workers",
    "data.prefetch",
    "data.path",
    "data.eval_path",
    "data.labels_path",
    "data.eval_labels_path",
    "data.tokenizer",
    "model.init_from",
    "experiment.output_dir",
    "log.",
    "slurm.",
    "sweep.",
    "profile.",
];

/// The config as dotted keys and values, less the `NODE_LOCAL` ones: what every node of a job
/// must agree on.
pub fn job_settings(c: &Config) -> std::collections::BTreeMap<String, String> {
    let local = |k: &str| {
        NODE_LOCAL.iter().any(|l| {
            if l.ends_with('.') {
                k.starts_with(l)
            } else {
                k == *l || k.starts_with(&format!("{l}."))
            }
        })
    };
    let mut out = crate::config::flat(c);
    out.retain(|k, _| !local(k));
    out
}

/// The first setting node `n` has otherwise than this node (`node`), said with both values.
fn differing(
    mine: &std::collections::BTreeMap<String, String>,
    theirs: &std::collections::BTreeMap<String, String>,
    node: usize,
    n: usize,
) -> Option<String> {
    let unset = "(unset)".to_string();
    let keys: std::collections::BTreeSet<&String> = mine.keys().chain(theirs.keys()).collect();
    let key = keys.into_iter().find(|k| mine.get(*k) != theirs.get(*k))?;
    Some(format!(
        "node {n} has `{key}` = {} but node {node} has {} (only launch.*, thread counts, loaders, input paths and logging may differ)",
        crate::config::brief(theirs.get(key).unwrap_or(&unset), 100),
        crate::config::brief(mine.get(key).unwrap_or(&unset), 100)
    ))
}

/// Sends this node's heartbeats; when the job is stopped (a node went silent) or node 0's store
/// disappears while this node still trains, it stops the job under this node (`JobStop`): the
/// node's training fails saying why, its process exits 1, and an agent with restarts left
/// starts the next round.
fn start_heartbeats(
    addr: &str,
    token: &str,
    node: usize,
    round: usize,
    every: Duration,
    done: Arc<AtomicBool>,
    stop: Arc<JobStop>,
) -> Result<(), StoreError> {
    let mut client = StoreClient::connect(addr, token, node, round, every)?;
    std::thread::Builder::new()
        .name("kiln-heartbeat".into())
        .spawn(move || loop {
            let res = client.heartbeat(node);
            if done.load(Ordering::SeqCst) {
                return;
            }
            if let Err(e) = res {
                let why = match e {
                    StoreError::Aborted(r) => format!("the job was stopped: {r}"),
                    other => format!("lost node 0's rendezvous store: {other}"),
                };
                stop.stop(&format!("node {node}: {why}"));
                return;
            }
            std::thread::sleep(every / 3);
        })?;
    Ok(())
}

/// The job's [`RingLinker`]: a new ring's listener on the interface that reaches node 0, its
/// links made and checked as the job's ring's (the token in each hello, strangers dropped),
/// within `strategy.timeout_secs`, and its sockets closed when the job stops.
struct JobLinks {
    ip: String,
    token: String,
    timeout: Duration,
    stop: Arc<JobStop>,
}

impl RingLinker for JobLinks {
    fn listen(&self) -> std::io::Result<(TcpListener, String)> {
        let l = TcpListener::bind(format!("{}:0", self.ip))?;
        let addr = l.local_addr()?.to_string();
        Ok((l, addr))
    }

    fn link(
        &self,
        listener: &TcpListener,
        next: &str,
        node: usize,
        prev: usize,
    ) -> Result<(TcpStream, TcpStream), String> {
        let deadline = Instant::now() + self.timeout;
        let (out, inn) = std::thread::scope(|sc| {
            let out = sc.spawn(|| ring_link(next, &self.token, node, deadline));
            let inn = accept_prev(listener, &self.token, prev, deadline);
            let out = out.join().unwrap_or_else(|_| {
                Err(StoreError::Refused {
                    addr: next.to_string(),
                    why: "the ring link's thread panicked".into(),
                })
            });
            (out, inn)
        });
        let out = out.map_err(|e| format!("linking to {next}: {e}"))?;
        let inn = inn.map_err(|e| format!("waiting for node {prev}'s link: {e}"))?;
        Ok((out, inn))
    }

    fn close_on_stop(&self, closer: std::sync::Weak<RingCloser>) {
        self.stop.on_stop(move |_| {
            if let Some(c) = closer.upgrade() {
                c.close();
            }
        });
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn connect_until(addr: &str, deadline: Instant) -> Result<TcpStream, StoreError> {
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => return Err(StoreError::Io(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Connects this node's ring link to the next node: says the hello and waits for its answer,
/// connecting again (until `deadline`) when the link is closed first, as it is when strangers
/// crowd the next node's listener.
fn ring_link(
    addr: &str,
    token: &str,
    node: usize,
    deadline: Instant,
) -> Result<TcpStream, StoreError> {
    use crate::rendezvous::store::{read_frame_within, HELLO_SECS};
    loop {
        let mut s = connect_until(addr, deadline)?;
        let answered = write_frame(&mut s, &json!({"ring": {"token": token, "node": node}}))
            .and_then(|()| {
                let until = Instant::now() + Duration::from_secs(HELLO_SECS);
                read_frame_within(&mut s, until, 64)
            });
        match answered {
            Ok(v) if v["ok"] == json!(true) => {
                s.set_read_timeout(None)?;
                return Ok(s);
            }
            Ok(v) => {
                return Err(StoreError::Refused {
                    addr: addr.to_string(),
                    why: format!("the ring link was answered with {v}"),
                })
            }
            Err(e) if Instant::now() >= deadline => return Err(StoreError::Io(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Accepts the previous node's ring connection. Each connection shows the token and its node
/// on a thread of its own, within a deadline, so a stranger (silent, trickling, or one of a
/// flood) never holds up the job; anything else is dropped.
fn accept_prev(
    listener: &TcpListener,
    token: &str,
    prev: usize,
    deadline: Instant,
) -> Result<TcpStream, StoreError> {
    use crate::rendezvous::store::{
        read_frame_within, same_secret, HelloSlots, HELLO_SECS, MAX_HELLO,
    };
    listener.set_nonblocking(true)?;
    let (tx, rx) = std::sync::mpsc::channel::<TcpStream>();
    let slots = Arc::new(HelloSlots::default());
    loop {
        if let Ok(s) = rx.try_recv() {
            s.set_read_timeout(None)?;
            return Ok(s);
        }
        match listener.accept() {
            Ok((mut s, _)) => {
                let Some((slot, _)) = slots.enter(&s) else {
                    continue; // closed: the peer connects again
                };
                let (tx, token) = (tx.clone(), token.to_string());
                let _ = std::thread::Builder::new()
                    .name("kiln-ring-hello".into())
                    .spawn(move || {
                        if s.set_nonblocking(false).is_err() {
                            return;
                        }
                        let until = Instant::now() + Duration::from_secs(HELLO_SECS);
                        let ok = read_frame_within(&mut s, until, MAX_HELLO).is_ok_and(|h| {
                            h["ring"]["token"]
                                .as_str()
                                .is_some_and(|t| same_secret(t, &token))
                                && h["ring"]["node"] == prev
                        });
                        // out of the hello slots before answering: an eviction now would cut
                        // the accepted link
                        drop(slot);
                        // the peer waits for this answer, and connects again without it
                        if ok && write_frame(&mut s, &json!({"ok": true})).is_ok() {
                            let _ = tx.send(s);
                        }
                    });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(StoreError::Timeout {
                        secs: 0,
                        missing: vec![format!("node {prev} never connected its ring link")],
                    });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(StoreError::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Node `node` of a 2-node job on 127.0.0.1:`port`, without heartbeats.
    fn two_nodes(port: u16, node: usize) -> Config {
        let mut c = Config::default();
        c.launch.nnodes = 2;
        c.launch.node_rank = node;
        c.launch.master_addr = "127.0.0.1".into();
        c.launch.master_port = port;
        c.launch.heartbeat_secs = 0;
        c.launch.rendezvous_timeout_secs = 30;
        c
    }

    /// Issue 31: torchrun's processes (and a bare srun's tasks) derive one token alike, the
    /// restart count aside; any other process derives none (node 0 generates and prints it),
    /// and a given token always wins.
    #[test]
    fn launchers_give_every_process_the_same_token_and_only_launchers_do() {
        fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        }
        let torch = [
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ];
        let a = launcher_token(env(&[
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("RANK", "3"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ]));
        assert!(a.is_some());
        assert_eq!(a, launcher_token(env(&torch)));
        assert_ne!(
            a,
            launcher_token(env(&[
                ("TORCHELASTIC_RUN_ID", "abd"),
                ("WORLD_SIZE", "4"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500"),
            ]))
        );
        let srun = [
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_STEP_NODELIST", "n[1-2]"),
        ];
        assert!(launcher_token(env(&srun)).is_some());
        // an srun step given MASTER_ADDR, or of one task, or no launcher at all: none
        for pairs in [
            &[
                ("SLURM_JOB_ID", "7"),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_PROCID", "1"),
                ("SLURM_STEP_NUM_TASKS", "2"),
                ("MASTER_ADDR", "n1"),
            ][..],
            &[
                ("SLURM_JOB_ID", "7"),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_PROCID", "0"),
                ("SLURM_STEP_NUM_TASKS", "1"),
            ][..],
            &[][..],
        ] {
            assert_eq!(launcher_token(env(pairs)), None, "{pairs:?}");
        }
        // KILN_JOB_TOKEN wins over a launcher's
        let c = Config::default();
        assert_eq!(
            token_with(&c, Some("given".into()), env(&torch)).unwrap(),
            ("given".to_string(), false)
        );
        assert_eq!(
            token_with(&c, None, env(&torch)).unwrap(),
            (a.unwrap(), false)
        );
    }

    /// Item 8 of the safety issue: strangers at the ring listener (a silent flood larger than
    /// the hello slots, a trickle, a huge frame, a wrong token, the right token from the wrong
    /// node) neither hold up nor lock out the real peer. Its deadline is shorter than the time
    /// a stranger may take for its hello, so waiting on any one of them would miss it.
    #[test]
    fn the_ring_listener_takes_its_peer_past_strangers_who_stall_trickle_flood_or_lie() {
        use std::io::{Read, Write};

        use crate::rendezvous::store::{read_frame, HELLO_SECS, MAX_PENDING};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let mut strangers: Vec<TcpStream> = (0..2 * MAX_PENDING)
            .map(|_| TcpStream::connect(&addr).unwrap())
            .collect();
        let mut trickle = TcpStream::connect(&addr).unwrap();
        trickle.write_all(&[0, 0]).unwrap();
        let mut huge = TcpStream::connect(&addr).unwrap();
        huge.write_all(&u32::MAX.to_be_bytes()).unwrap();
        strangers.extend([trickle, huge]);
        let mut liars = Vec::new();
        for (token, node) in [("wrong", 0), ("t0k", 2)] {
            let mut s = TcpStream::connect(&addr).unwrap();
            write_frame(&mut s, &json!({"ring": {"token": token, "node": node}})).unwrap();
            liars.push(s);
        }
        let deadline = Instant::now() + Duration::from_secs(HELLO_SECS - 2);
        let peer = std::thread::spawn(move || {
            let mut s = ring_link(&addr, "t0k", 0, deadline).unwrap();
            write_frame(&mut s, &json!({"data": 42})).unwrap();
        });
        let mut s = accept_prev(&listener, "t0k", 0, deadline).unwrap();
        assert_eq!(read_frame(&mut s).unwrap()["data"], 42);
        peer.join().unwrap();
        // the liars are closed without an answer
        for mut l in liars {
            l.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut b = [0u8; 1];
            assert!(matches!(l.read(&mut b), Ok(0) | Err(_)));
        }
        drop(strangers);
    }

    /// Issue 18: a normal two-node join leaves nothing in node 0's list of refused
    /// connections (it used to hold each node's probe for its own address, read as intrusions).
    #[test]
    fn kilns_own_nodes_leave_nothing_in_the_stores_refused_list() {
        let port = crate::testdir::free_port();
        let (c0, c1) = (two_nodes(port, 0), two_nodes(port, 1));
        let other = std::thread::spawn(move || join(&c1, 1, "tok", 0).map(|j| j.node));
        let j0 = join(&c0, 1, "tok", 0).unwrap();
        assert_eq!(other.join().unwrap().unwrap(), 1);
        assert!(j0.ring.is_some());
        assert_eq!(j0.server.as_ref().unwrap().rejected(), Vec::<String>::new());
    }

    /// Issue 44 item 4: sub-groups across nodes over TCP. Two nodes of two ranks each (global
    /// ranks 0-1 on node 0, 2-3 on node 1) split as HSDP lays them out (shard groups on a node,
    /// replica groups across nodes with keys that reorder their ranks), and unevenly ({0} and
    /// {1, 2, 3}: one member on node 0, two on node 1); every op gives what one process gives.
    #[test]
    fn sub_groups_span_nodes_over_rings_of_their_own() {
        use crate::collective::node::NodeRank;
        use crate::collective::{Collective, LocalGroup, ReduceOp};
        let port = crate::testdir::free_port();
        let run_node = move |node: usize| {
            let mut c = two_nodes(port, node);
            c.strategy.timeout_secs = 30;
            let mut job = join(&c, 2, "tok", 0).unwrap();
            let mut ring = job.ring.take();
            let ranks = LocalGroup::ranks(2, Duration::from_secs(30));
            let links = Arc::clone(&job.links);
            let out = std::thread::scope(|s| {
                let hs: Vec<_> = ranks
                    .into_iter()
                    .map(|l| {
                        let r = if l.rank() == 0 { ring.take() } else { None };
                        let links = Some(Arc::clone(&links));
                        s.spawn(move || on_rank(NodeRank::new(l, r, node, 2, links)))
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            });
            job.finish(Duration::from_secs(10));
            out
        };
        fn on_rank(mut c: NodeRank) -> Vec<f32> {
            let r = c.rank();
            let mut seen = Vec::new();
            let mut shard = c.split(r / 2, r).unwrap();
            let mut replica = c.split(r % 2, 10 - r).unwrap();
            let mut uneven = c.split(usize::from(r != 0), r).unwrap();
            for g in [&shard, &replica, &uneven] {
                seen.extend([g.rank() as f32, g.world() as f32]);
            }
            let mut a = [r as f32 + 1.0];
            replica.all_reduce(&mut a, ReduceOp::Sum).unwrap();
            let mut g = [0.0; 2];
            replica.all_gather(&[r as f32, 0.0][..1], &mut g).unwrap();
            let mut u = [0.0; 3];
            if uneven.world() == 3 {
                uneven.all_gather(&[r as f32 * 10.0], &mut u).unwrap();
                let mut b = [r as f32];
                // group rank 1 is global rank 2
                uneven.broadcast(&mut b, 1).unwrap();
                u[0] += b[0] * 100.0;
                let mut rs = [0.0; 1];
                uneven
                    .reduce_scatter(&[1.0, 2.0, 3.0], &mut rs, ReduceOp::Sum)
                    .unwrap();
                u[1] += rs[0] * 1000.0;
            }
            let mut w = [1.0];
            shard.all_reduce(&mut w, ReduceOp::Sum).unwrap();
            // the parent still works, and a split of a split across nodes
            let mut p = [1.0];
            c.all_reduce(&mut p, ReduceOp::Sum).unwrap();
            let mut again = replica.split(0, replica.rank()).unwrap();
            let mut x = [r as f64];
            again.all_reduce_f64(&mut x, ReduceOp::Sum).unwrap();
            seen.extend(a);
            seen.extend(g);
            seen.extend(u);
            seen.extend([w[0], p[0], x[0] as f32]);
            seen
        }
        let other = std::thread::spawn(move || run_node(1));
        let mut all = run_node(0);
        all.extend(other.join().unwrap());
        // per rank: (rank, world) of shard, replica, uneven; replica sum; replica gather;
        // uneven gather (+100 x broadcast, +1000 x its reduce-scatter); shard sum; parent sum;
        // the split of the replica group's sum
        let want: Vec<Vec<f32>> = vec![
            vec![0., 2., 1., 2., 0., 1., 4., 2., 0., 0., 0., 0., 2., 4., 2.],
            vec![
                1., 2., 1., 2., 0., 3., 6., 3., 1., 210., 3020., 30., 2., 4., 4.,
            ],
            vec![
                0., 2., 0., 2., 1., 3., 4., 2., 0., 210., 6020., 30., 2., 4., 2.,
            ],
            vec![
                1., 2., 0., 2., 2., 3., 6., 3., 1., 210., 9020., 30., 2., 4., 4.,
            ],
        ];
        assert_eq!(all, want);
    }

    /// Issue 45, defect 25: the nodes that never arrived, as ranges and a count.
    #[test]
    fn missing_nodes_are_told_as_ranges_and_a_count() {
        assert_eq!(never_arrived(&[3], 4), "node 3 never arrived");
        assert_eq!(
            never_arrived(&[9, 1, 2, 3, 4, 7, 10, 11, 12], 16),
            "nodes 1-4, 7, 9-12 never arrived (9 of 16)"
        );
        let all: Vec<usize> = (1..50_000).collect();
        assert_eq!(
            never_arrived(&all, 50_000),
            "nodes 1-49999 never arrived (49999 of 50000)"
        );
        let odd: Vec<usize> = (0..1000).map(|i| 2 * i + 1).collect();
        let m = never_arrived(&odd, 2000);
        assert!(m.len() < 200, "{m}");
        assert!(
            m.contains("37, 39, ...") && m.ends_with("(1000 of 2000)"),
            "{m}"
        );
    }

    #[test]
    fn a_stop_runs_every_hook_once_whenever_it_was_registered() {
        let stop = JobStop::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&runs);
        stop.on_stop(move |why| {
            assert_eq!(why, "node 1: gone");
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(stop.reason(), None);
        stop.stop("node 1: gone");
        stop.stop("node 2: later");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(stop.reason().as_deref(), Some("node 1: gone"));
        // registered after the stop: runs at once, with the first reason
        let r = Arc::clone(&runs);
        stop.on_stop(move |why| {
            assert_eq!(why, "node 1: gone");
            r.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }
}
