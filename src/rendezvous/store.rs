//! The rendezvous store: node 0 serves a small key-value store on `master_addr:master_port`;
//! every node registers, learns the world, exchanges what the collectives need (addresses) and
//! waits at a barrier whose timeout names the nodes that never arrived.
//!
//! Wire format: frames of a 4-byte big-endian length and a JSON body, at most 1 MiB. A client's
//! first frame must be `{"hello": {"token": ..., "node": r}}` with the job token; a connection
//! without it, or sending anything else, is logged and closed without disturbing the run.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Largest frame the store accepts.
const MAX_FRAME: usize = 1 << 20;
/// Largest first frame (the hello) of a connection that has not shown the token yet.
pub const MAX_HELLO: usize = 4 << 10;
/// How long a new connection has for its whole hello (however it trickles in).
pub const HELLO_SECS: u64 = 5;
/// Connections still in their hello at once; more are closed at once (a flood of strangers
/// must not cost node 0 a thread and a buffer each).
pub const MAX_PENDING: usize = 16;

/// Compares secrets in time independent of where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads one frame of at most `max` bytes that must arrive whole before `deadline` (a peer
/// sending a byte now and then does not keep the connection).
pub fn read_frame_within(
    s: &mut TcpStream,
    deadline: Instant,
    max: usize,
) -> std::io::Result<Value> {
    let mut fill = |buf: &mut [u8]| -> std::io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the hello did not arrive in time",
                ));
            }
            s.set_read_timeout(Some(left))?;
            match s.read(&mut buf[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // the read timeout is the deadline
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the hello did not arrive in time",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    let mut len = [0u8; 4];
    fill(&mut len)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {n} bytes is too long"),
        ));
    }
    let mut body = vec![0u8; n];
    fill(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not JSON: {e}")))
}

/// The connections in their hello, at most `MAX_PENDING`. One more closes the oldest: a real
/// peer says its hello as soon as it connects, so strangers that hold their slots (silent,
/// trickling, a flood) can delay a peer by a moment, never lock it out. The threads of closed
/// connections take a moment to end; while `2 * MAX_PENDING` are alive a new connection is
/// closed at once (a peer connects again), so a flood never costs more threads than that.
#[derive(Default)]
pub struct HelloSlots {
    open: Mutex<std::collections::VecDeque<(u64, TcpStream)>>,
    next: std::sync::atomic::AtomicU64,
    alive: std::sync::atomic::AtomicUsize,
}

/// A connection's place among the `HelloSlots`, given up when dropped.
pub struct Pending {
    slots: Arc<HelloSlots>,
    id: u64,
}

impl HelloSlots {
    /// Takes a slot for `conn`, `None` (close it) while too many threads are alive; the second
    /// value says whether the oldest connection in its hello was closed to make room.
    pub fn enter(self: &Arc<Self>, conn: &TcpStream) -> Option<(Pending, bool)> {
        use std::sync::atomic::Ordering;
        if self.alive.fetch_add(1, Ordering::SeqCst) >= 2 * MAX_PENDING {
            self.alive.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let mut evicted = false;
        if let Ok(mut open) = self.open.lock() {
            if open.len() >= MAX_PENDING {
                if let Some((_, oldest)) = open.pop_front() {
                    // its reader sees the end of the stream at once and gives up
                    let _ = oldest.shutdown(std::net::Shutdown::Both);
                    evicted = true;
                }
            }
            if let Ok(c) = conn.try_clone() {
                open.push_back((id, c));
            }
        }
        let slot = Pending {
            slots: Arc::clone(self),
            id,
        };
        Some((slot, evicted))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Ok(mut open) = self.slots.open.lock() {
            open.retain(|(id, _)| *id != self.id);
        }
        self.slots
            .alive
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl From<StoreError> for crate::error::Error {
    fn from(e: StoreError) -> Self {
        match e {
            // bad input: the launcher's variable
            StoreError::HandedOver { .. } | StoreError::Mismatch(_) => {
                crate::error::Error::Usage(e.to_string())
            }
            e => crate::error::Error::Launch(Box::new(e)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot serve the rendezvous store on {addr}: {source}\n  = help: is another job using --master-port? pick a free port")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the rendezvous store at {addr} within {secs}s: {why}\n  = help: start node 0 first (or together), and check --master-addr/--master-port")]
    Connect {
        addr: String,
        secs: u64,
        why: String,
    },
    #[error("the rendezvous store at {addr} refused this node: {why}\n  = help: every node needs the same job token (KILN_JOB_TOKEN or [launch] token_file)")]
    Refused { addr: String, why: String },
    #[error("rendezvous timed out after {secs}s: {}\n  = help: start every node with the same --nnodes, --master-addr and --master-port (and KILN_JOB_TOKEN)", .missing.join("; "))]
    Timeout { secs: u64, missing: Vec<String> },
    #[error("rendezvous store connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("the job was stopped: {0}")]
    Aborted(String),
    /// Two nodes of one job with different settings (exit 2).
    #[error("the nodes of this job disagree: {0}\n  = help: start every node with the same experiment file and --set flags")]
    Mismatch(String),
    /// `KILN_STORE_FD` names no listening TCP socket on the job's port (exit 2).
    #[error("{STORE_FD}={fd}: {why}\n  = help: hand over a listening TCP socket bound to the job's port (--master-port), or unset {STORE_FD} to let node 0 bind it")]
    HandedOver { fd: String, why: String },
}

/// Writes one frame.
pub fn write_frame(s: &mut impl Write, v: &Value) -> std::io::Result<()> {
    let body = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    s.write_all(&(body.len() as u32).to_be_bytes())?;
    s.write_all(&body)?;
    s.flush()
}

/// Reads one frame; garbage (too long, not JSON) is an error.
pub fn read_frame(s: &mut impl Read) -> std::io::Result<Value> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {n} bytes is too long"),
        ));
    }
    let mut body = vec![0u8; n];
    s.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not JSON: {e}")))
}

/// A listening socket node 0's launcher bound (to port 0, say) and handed over as this file
/// descriptor, kept open from its bind to node 0's first accept: no other process can take the
/// port in between (what kiln's tests do; systemd's socket activation works the same way).
pub const STORE_FD: &str = "KILN_STORE_FD";

/// The listener `KILN_STORE_FD` = `fd` hands over, checked to listen on `addr`'s port.
fn handed_over(fd: &str, addr: &str) -> Result<TcpListener, StoreError> {
    use std::os::fd::FromRawFd;
    let bad = |why: String| StoreError::HandedOver {
        fd: crate::config::brief(fd, 40),
        why,
    };
    let n = fd
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|n| *n > 2)
        .ok_or_else(|| bad("not a file descriptor number above 2".into()))?;
    // a socket of this process at `n`: fstat before taking it, so that no other file is closed
    // SAFETY: fstat writes only into `st`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(n, &mut st) } != 0 || (st.st_mode & libc::S_IFMT) != libc::S_IFSOCK {
        return Err(bad(format!("descriptor {n} is not an open socket")));
    }
    // a TCP socket that listens (issue 45, defect 24: UDP, bound-only and connected sockets
    // were taken, and the rendezvous then waited out its timeout)
    let opt = |name: libc::c_int| -> Option<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `v`.
        let r = unsafe {
            libc::getsockopt(
                n,
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    if opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM) {
        return Err(bad(format!("descriptor {n} is not a TCP socket")));
    }
    if !matches!(opt(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6)) {
        return Err(bad(format!("descriptor {n} is not an IP socket")));
    }
    if opt(libc::SO_ACCEPTCONN) != Some(1) {
        return Err(bad(format!(
            "descriptor {n} is a TCP socket that does not listen (bound only, or connected)"
        )));
    }
    // SAFETY: an open socket, handed to this process to own.
    let listener = unsafe { TcpListener::from_raw_fd(n) };
    let port = listener.local_addr().map(|a| a.port()).ok();
    let want = addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
    if port.is_none() || port != want {
        return Err(bad(format!(
            "the socket listens on port {}, not the job's",
            port.map_or("?".into(), |p| p.to_string())
        )));
    }
    Ok(listener)
}

#[derive(Default)]
struct StoreData {
    kv: HashMap<String, String>,
    /// Last heartbeat of each node.
    beats: HashMap<u64, Instant>,
    aborted: Option<String>,
    /// Rejected connections, for the log.
    rejected: Vec<String>,
    /// Connections closed in their hello because `MAX_PENDING` newer ones came.
    busy: usize,
}

/// The server side (node 0).
pub struct StoreServer {
    pub addr: SocketAddr,
    state: Arc<(Mutex<StoreData>, Condvar)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    token: String,
    node: usize,
    /// The restart round: a node of another round is talking to a stale store.
    #[serde(default)]
    round: usize,
}

impl StoreServer {
    /// Binds exactly `addr` (never all interfaces), or takes the listening socket its launcher
    /// handed over (`KILN_STORE_FD`), and serves in background threads. With `heartbeat`
    /// non-zero, a node silent for that long stops the job.
    pub fn start(
        addr: &str,
        token: String,
        round: usize,
        heartbeat: Duration,
    ) -> Result<StoreServer, StoreError> {
        let listener = match std::env::var(STORE_FD) {
            Ok(fd) => handed_over(&fd, addr)?,
            Err(_) => TcpListener::bind(addr).map_err(|source| StoreError::Bind {
                addr: addr.to_string(),
                source,
            })?,
        };
        let local = listener.local_addr()?;
        let state: Arc<(Mutex<StoreData>, Condvar)> = Arc::default();
        let st = Arc::clone(&state);
        let slots = Arc::new(HelloSlots::default());
        std::thread::Builder::new()
            .name("kiln-store".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let slot = slots.enter(&conn);
                    if slot.as_ref().is_none_or(|(_, evicted)| *evicted) {
                        if let Ok(mut s) = st.0.lock() {
                            s.busy += 1;
                        }
                    }
                    let Some((slot, _)) = slot else { continue };
                    let st = Arc::clone(&st);
                    let token = token.clone();
                    let _ = std::thread::Builder::new()
                        .name("kiln-store-conn".into())
                        .spawn(move || serve(conn, &token, round, &st, slot));
                }
            })?;
        if !heartbeat.is_zero() {
            let st = Arc::clone(&state);
            std::thread::Builder::new()
                .name("kiln-store-heartbeats".into())
                .spawn(move || loop {
                    std::thread::sleep(heartbeat / 4);
                    let (lock, cv) = &*st;
                    let Ok(mut s) = lock.lock() else { return };
                    if s.aborted.is_some() {
                        return;
                    }
                    let late = s
                        .beats
                        .iter()
                        .find(|(_, t)| t.elapsed() > heartbeat)
                        .map(|(n, _)| *n);
                    if let Some(n) = late {
                        s.aborted = Some(format!(
                            "node {n} sent no heartbeat for {}s (launch.heartbeat_secs)",
                            heartbeat.as_secs()
                        ));
                        cv.notify_all();
                    }
                })?;
        }
        Ok(StoreServer { addr: local, state })
    }

    /// Connections that were refused (peer and why), for the log.
    pub fn rejected(&self) -> Vec<String> {
        self.state
            .0
            .lock()
            .map(|s| {
                let mut r = s.rejected.clone();
                if s.busy > 0 {
                    r.push(format!(
                        "{} connection(s) closed before their hello ended: more than {MAX_PENDING} were in their hello at once",
                        s.busy
                    ));
                }
                r
            })
            .unwrap_or_default()
    }
}

fn reject(st: &(Mutex<StoreData>, Condvar), peer: &str, why: &str) {
    if let Ok(mut s) = st.0.lock() {
        // a flood is summed up, not kept line by line
        if s.rejected.len() < 100 {
            s.rejected.push(format!("{peer}: {why}"));
        } else if s.rejected.len() == 100 {
            s.rejected.push("... and more refused connections".into());
        }
    }
}

fn serve(
    mut conn: TcpStream,
    token: &str,
    round: usize,
    st: &(Mutex<StoreData>, Condvar),
    slot: Pending,
) {
    let peer = conn
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    // a client has a few seconds for its whole (small) hello; a port scan, a stuck or a
    // trickling peer is dropped
    let deadline = Instant::now() + Duration::from_secs(HELLO_SECS);
    let hello = match read_frame_within(&mut conn, deadline, MAX_HELLO) {
        Ok(v) => v,
        Err(e) => return reject(st, &peer, &format!("no valid hello ({e})")),
    };
    drop(slot);
    let hello = serde_json::from_value::<Hello>(hello["hello"].clone()).ok();
    if hello.as_ref().is_none_or(|h| !same_secret(&h.token, token)) {
        let _ = write_frame(&mut conn, &json!({"error": "bad job token"}));
        return reject(st, &peer, "bad job token");
    }
    if hello.as_ref().is_some_and(|h| h.round != round) {
        let _ = write_frame(&mut conn, &json!({"error": "stale round"}));
        return;
    }
    if write_frame(&mut conn, &json!({"ok": true})).is_err() {
        return;
    }
    let _ = conn.set_read_timeout(None);
    while let Ok(req) = read_frame(&mut conn) {
        let reply = handle(&req, st);
        if write_frame(&mut conn, &reply).is_err() {
            return;
        }
    }
}

fn handle(req: &Value, st: &(Mutex<StoreData>, Condvar)) -> Value {
    let (lock, cv) = st;
    let Ok(mut s) = lock.lock() else {
        return json!({"error": "store poisoned"});
    };
    match req["op"].as_str() {
        Some("set") => {
            let (Some(k), Some(v)) = (req["key"].as_str(), req["value"].as_str()) else {
                return json!({"error": "set needs key and value"});
            };
            s.kv.insert(k.to_string(), v.to_string());
            cv.notify_all();
            json!({"ok": true})
        }
        Some("wait") => {
            let keys: Vec<String> = req["keys"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            // a week at most (the longest timeout a config allows): a huge number is a week
            let wait = Duration::from_millis(req["timeout_ms"].as_u64().unwrap_or(0))
                .min(Duration::from_secs(604_800));
            let deadline = Instant::now() + wait;
            loop {
                if let Some(r) = &s.aborted {
                    return json!({"aborted": r});
                }
                let missing: Vec<&String> =
                    keys.iter().filter(|k| !s.kv.contains_key(*k)).collect();
                if missing.is_empty() {
                    let values: Vec<&String> = keys.iter().filter_map(|k| s.kv.get(k)).collect();
                    return json!({"values": values});
                }
                let now = Instant::now();
                if now >= deadline {
                    return json!({"missing": missing});
                }
                s = match cv.wait_timeout(s, deadline - now) {
                    Ok(r) => r.0,
                    Err(_) => return json!({"error": "store poisoned"}),
                };
            }
        }
        Some("heartbeat") => {
            if let Some(n) = req["node"].as_u64() {
                s.beats.insert(n, Instant::now());
            }
            match &s.aborted {
                Some(r) => json!({"aborted": r}),
                None => json!({"ok": true}),
            }
        }
        Some("abort") => {
            let reason = req["reason"].as_str().unwrap_or("stopped").to_string();
            s.aborted.get_or_insert(reason);
            cv.notify_all();
            json!({"ok": true})
        }
        _ => json!({"error": "unknown op"}),
    }
}

/// The client side (every node, node 0 included).
pub struct StoreClient {
    conn: TcpStream,
    addr: String,
}

impl StoreClient {
    /// Connects (retrying until `timeout`, since node 0 may start later) and authenticates.
    /// A store of another restart round answers "stale round"; that is retried too.
    pub fn connect(
        addr: &str,
        token: &str,
        node: usize,
        round: usize,
        timeout: Duration,
    ) -> Result<StoreClient, StoreError> {
        let start = Instant::now();
        let (conn, first) = loop {
            let err = match TcpStream::connect(addr).and_then(|mut c| {
                c.set_nodelay(true)?;
                write_frame(
                    &mut c,
                    &json!({"hello": {"token": token, "node": node, "round": round}}),
                )?;
                let reply = read_frame(&mut c)?;
                Ok((c, reply))
            }) {
                Ok((c, reply)) if reply["error"] != json!("stale round") => break (c, reply),
                Ok(_) => "a store of an earlier round is still up".to_string(),
                Err(e) => e.to_string(),
            };
            if start.elapsed() >= timeout {
                return Err(StoreError::Connect {
                    addr: addr.to_string(),
                    secs: timeout.as_secs(),
                    why: err,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let reply = first;
        conn.set_read_timeout(None)?;
        if reply["ok"] != json!(true) {
            return Err(StoreError::Refused {
                addr: addr.to_string(),
                why: reply["error"].as_str().unwrap_or("no reason").to_string(),
            });
        }
        Ok(StoreClient {
            conn,
            addr: addr.to_string(),
        })
    }

    fn call(&mut self, req: Value) -> Result<Value, StoreError> {
        write_frame(&mut self.conn, &req)?;
        let reply = read_frame(&mut self.conn)?;
        if let Some(e) = reply["error"].as_str() {
            return Err(StoreError::Refused {
                addr: self.addr.clone(),
                why: e.to_string(),
            });
        }
        Ok(reply)
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.call(json!({"op": "set", "key": key, "value": value}))
            .map(|_| ())
    }

    /// Waits until every key exists; returns their values in order, or the missing keys.
    pub fn wait(
        &mut self,
        keys: &[String],
        timeout: Duration,
    ) -> Result<Result<Vec<String>, Vec<String>>, StoreError> {
        let reply = self
            .call(json!({"op": "wait", "keys": keys, "timeout_ms": timeout.as_millis() as u64}))?;
        if let Some(r) = reply["aborted"].as_str() {
            return Err(StoreError::Aborted(r.to_string()));
        }
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        if reply.get("values").is_some() {
            Ok(Ok(strings(&reply["values"])))
        } else {
            Ok(Err(strings(&reply["missing"])))
        }
    }

    /// Reports this node alive; `Err(Aborted)` once the job was stopped.
    pub fn heartbeat(&mut self, node: usize) -> Result<(), StoreError> {
        let reply = self.call(json!({"op": "heartbeat", "node": node}))?;
        match reply["aborted"].as_str() {
            Some(r) => Err(StoreError::Aborted(r.to_string())),
            None => Ok(()),
        }
    }

    pub fn abort(&mut self, reason: &str) -> Result<(), StoreError> {
        self.call(json!({"op": "abort", "reason": reason}))
            .map(|_| ())
    }
}
