//! Collectives across node processes over TCP, for the CPU backend: the node leaders form a
//! ring (each sends to the next node and receives from the previous one). All-reduce is the ring
//! algorithm (reduce-scatter, then all-gather, n-1 steps each); all-gather and broadcast pass
//! chunks around the ring. Every message carries the op and its number, so a peer that stops or
//! falls behind is reported with the op it was last seen in, and reads time out.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::{CollectiveError, OpId, OpKind};

/// An element type that can travel: f32 or f64, little-endian.
pub trait Wire: Copy + Send + Sync + std::ops::AddAssign + 'static {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn get(b: &[u8]) -> Self;
}

impl Wire for f32 {
    const SIZE: usize = 4;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        f32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

impl Wire for f64 {
    const SIZE: usize = 8;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(b: &[u8]) -> Self {
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        f64::from_le_bytes(a)
    }
}

/// Closes a ring's sockets (see `TcpRing::closer`).
pub struct RingCloser(Vec<TcpStream>);

impl RingCloser {
    pub fn close(&self) {
        for s in &self.0 {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A node in a ring, as errors name it: the job's node number and the ranks (of the ring's
/// group) on it, its leader's first.
#[derive(Clone, Debug)]
pub struct RingPeer {
    pub node: usize,
    pub ranks: Vec<usize>,
}

/// This node's place in a ring of node leaders: the job's ring (every node, global ranks), or
/// a sub-group's (the nodes that have members of it, in node order).
pub struct TcpRing {
    /// This node's position in the ring.
    pub node: usize,
    pub nnodes: usize,
    peers: Vec<RingPeer>,
    next: Option<TcpStream>,
    prev: Option<TcpStream>,
    seq: u64,
    /// The last op header received from the previous node.
    last_from_prev: Option<OpId>,
    timeout: Duration,
}

fn kind_code(k: OpKind) -> u8 {
    match k {
        OpKind::AllReduce => 1,
        OpKind::Broadcast => 2,
        OpKind::AllGather => 3,
        OpKind::ReduceScatter => 4,
        OpKind::Reduce => 5,
        OpKind::Barrier => 6,
        OpKind::Update => 7,
        OpKind::Split => 8,
    }
}

fn code_kind(c: u8) -> Option<OpKind> {
    Some(match c {
        1 => OpKind::AllReduce,
        2 => OpKind::Broadcast,
        3 => OpKind::AllGather,
        4 => OpKind::ReduceScatter,
        5 => OpKind::Reduce,
        6 => OpKind::Barrier,
        7 => OpKind::Update,
        8 => OpKind::Split,
        _ => return None,
    })
}

impl TcpRing {
    /// The job's ring over connected sockets (`None` for a single node): `nproc` global ranks
    /// per node, node-major.
    pub fn new(
        node: usize,
        nnodes: usize,
        nproc: usize,
        next: Option<TcpStream>,
        prev: Option<TcpStream>,
        timeout: Duration,
    ) -> Self {
        let peers = (0..nnodes)
            .map(|n| RingPeer {
                node: n,
                ranks: (n * nproc..(n + 1) * nproc).collect(),
            })
            .collect();
        Self::of_peers(node, peers, next, prev, timeout)
    }

    /// A ring through `peers` (this node is `peers[pos]`) over connected sockets.
    pub fn of_peers(
        pos: usize,
        peers: Vec<RingPeer>,
        next: Option<TcpStream>,
        prev: Option<TcpStream>,
        timeout: Duration,
    ) -> Self {
        if let Some(p) = &prev {
            let _ = p.set_read_timeout(Some(timeout));
        }
        if let Some(n) = &next {
            let _ = n.set_write_timeout(Some(timeout));
            let _ = n.set_nodelay(true);
        }
        TcpRing {
            node: pos,
            nnodes: peers.len(),
            peers,
            next,
            prev,
            seq: 0,
            last_from_prev: None,
            timeout,
        }
    }

    /// "rank 2 (node 1)", "ranks 2-3 (node 1)", "ranks 1, 3 (node 1)" of ring position `pos`.
    fn ranks_of(&self, pos: usize) -> String {
        let Some(p) = self.peers.get(pos) else {
            return format!("node {pos}");
        };
        let r = &p.ranks;
        let consecutive = r.windows(2).all(|w| w[1] == w[0] + 1);
        let list = match r[..] {
            [one] => format!("rank {one}"),
            [lo, .., hi] if consecutive => format!("ranks {lo}-{hi}"),
            _ => format!(
                "ranks {}",
                r.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        format!("{list} (node {})", p.node)
    }

    /// The rank errors of position `pos` are told as: its leader's.
    fn rank_at(&self, pos: usize) -> usize {
        self.peers
            .get(pos)
            .and_then(|p| p.ranks.first().copied())
            .unwrap_or(pos)
    }

    fn prev_node(&self) -> usize {
        (self.node + self.nnodes - 1) % self.nnodes
    }

    fn io_error(&self, op: OpId, peer: usize, e: &std::io::Error) -> CollectiveError {
        let rank = self.rank_at(self.node);
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            let seen = self
                .last_from_prev
                .map(|o| o.to_string())
                .unwrap_or_else(|| "no collective yet".into());
            CollectiveError::Timeout {
                rank,
                op,
                secs: self.timeout.as_secs(),
                missing: vec![format!(
                    "{} never reached {op} (last seen: {seen})",
                    self.ranks_of(peer)
                )],
            }
        } else {
            CollectiveError::Aborted {
                rank,
                op,
                reason: format!("lost the connection to {}: {e}", self.ranks_of(peer)),
            }
        }
    }

    /// Sends `out` to the next node while receiving `n` elements from the previous one.
    fn exchange<T: Wire>(
        &mut self,
        op: OpId,
        out: &[T],
        n: usize,
    ) -> Result<Vec<T>, CollectiveError> {
        let mut msg = Vec::with_capacity(17 + out.len() * T::SIZE);
        msg.push(kind_code(op.kind));
        msg.extend_from_slice(&op.seq.to_le_bytes());
        msg.extend_from_slice(&(out.len() as u64).to_le_bytes());
        for v in out {
            v.put(&mut msg);
        }
        let next_node = (self.node + 1) % self.nnodes;
        let prev_node = self.prev_node();
        let (Some(next), Some(prev)) = (self.next.as_mut(), self.prev.as_mut()) else {
            return Ok(Vec::new());
        };
        let (sent, received) = std::thread::scope(|s| {
            let sender = s.spawn(|| next.write_all(&msg).and_then(|_| next.flush()));
            let mut header = [0u8; 17];
            let recv = prev.read_exact(&mut header).and_then(|_| {
                let len = u64::from_le_bytes(header[9..17].try_into().unwrap_or([0; 8])) as usize;
                let mut body = vec![0u8; len * T::SIZE];
                prev.read_exact(&mut body).map(|_| (header, len, body))
            });
            (
                sender
                    .join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("sender panicked"))),
                recv,
            )
        });
        sent.map_err(|e| self.io_error(op, next_node, &e))?;
        let (header, len, body) = received.map_err(|e| self.io_error(op, prev_node, &e))?;
        let theirs = OpId {
            seq: u64::from_le_bytes(header[1..9].try_into().unwrap_or([0; 8])),
            kind: code_kind(header[0]).unwrap_or(OpKind::Barrier),
        };
        self.last_from_prev = Some(theirs);
        if theirs != op || code_kind(header[0]).is_none() {
            return Err(CollectiveError::Mismatch {
                rank: self.rank_at(self.node),
                op,
                other: self.rank_at(prev_node),
                other_op: theirs,
            });
        }
        if len != n {
            return Err(CollectiveError::Size {
                rank: self.rank_at(self.node),
                op,
                len: n,
                other: self.rank_at(prev_node),
                other_len: len,
            });
        }
        Ok(body.chunks_exact(T::SIZE).map(T::get).collect())
    }

    fn next_op(&mut self, kind: OpKind) -> OpId {
        let op = OpId {
            seq: self.seq,
            kind,
        };
        self.seq += 1;
        op
    }

    /// Ring all-reduce (sum) in place: after it, every node holds the sum of all nodes' `buf`.
    pub fn all_reduce_sum<T: Wire>(&mut self, buf: &mut [T]) -> Result<(), CollectiveError> {
        let op = self.next_op(OpKind::AllReduce);
        let n = self.nnodes;
        if n == 1 {
            return Ok(());
        }
        let len = buf.len();
        let chunk = len.div_ceil(n);
        let range = |c: usize| (c * chunk).min(len)..((c + 1) * chunk).min(len);
        // reduce-scatter: after n-1 steps node i holds the full sum of chunk (i + 1) % n
        for s in 0..n - 1 {
            let send_c = (self.node + n - s) % n;
            let recv_c = (self.node + n - s - 1) % n;
            let out = buf[range(send_c)].to_vec();
            let got = self.exchange(op, &out, range(recv_c).len())?;
            for (b, g) in buf[range(recv_c)].iter_mut().zip(got) {
                *b += g;
            }
        }
        // all-gather the reduced chunks
        for s in 0..n - 1 {
            let send_c = (self.node + 1 + n - s) % n;
            let recv_c = (self.node + n - s) % n;
            let out = buf[range(send_c)].to_vec();
            let got = self.exchange(op, &out, range(recv_c).len())?;
            buf[range(recv_c)].copy_from_slice(&got);
        }
        Ok(())
    }

    /// Every node's `mine` (equal lengths), in node order.
    pub fn all_gather<T: Wire>(&mut self, mine: &[T]) -> Result<Vec<T>, CollectiveError> {
        let op = self.next_op(OpKind::AllGather);
        let n = self.nnodes;
        let k = mine.len();
        let mut out: Vec<T> = Vec::with_capacity(k * n);
        out.extend_from_slice(mine);
        out.resize(
            k * n,
            mine.first().copied().unwrap_or_else(|| T::get(&[0u8; 8])),
        );
        out[self.node * k..(self.node + 1) * k].copy_from_slice(mine);
        let mut carry = mine.to_vec();
        for s in 0..n.saturating_sub(1) {
            let got = self.exchange(op, &carry, k)?;
            let from = (self.node + n - s - 1) % n;
            out[from * k..(from + 1) * k].copy_from_slice(&got);
            carry = got;
        }
        Ok(out)
    }

    /// `root`'s buffer to every node.
    pub fn broadcast<T: Wire>(
        &mut self,
        buf: &mut [T],
        root: usize,
    ) -> Result<(), CollectiveError> {
        let gathered = self.all_gather(buf)?;
        let k = buf.len();
        buf.copy_from_slice(&gathered[root * k..(root + 1) * k]);
        Ok(())
    }

    /// Closes the sockets: peers blocked on this node fail at once instead of timing out.
    pub fn shutdown(&self) {
        for s in [&self.next, &self.prev].into_iter().flatten() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    /// A handle that closes this ring's sockets from another thread: an op blocked on them
    /// fails at once (how a node stops when its job is stopped).
    pub fn closer(&self) -> RingCloser {
        RingCloser(
            [&self.next, &self.prev]
                .into_iter()
                .flatten()
                .filter_map(|s| s.try_clone().ok())
                .collect(),
        )
    }
}

/// How a node leader links a new ring (a sub-group's, at `Collective::split`) across nodes:
/// the job's rendezvous knows the address peers reach this node at and the job's token, which
/// every link's hello shows.
pub trait RingLinker: Send + Sync {
    /// A listener for a new ring on this node, and its address as peers reach it.
    fn listen(&self) -> std::io::Result<(std::net::TcpListener, String)>;
    /// Connects to the next node's listener at `next` (saying this is node `node`) while
    /// accepting node `prev`'s link on `listener`: the links out and in.
    fn link(
        &self,
        listener: &std::net::TcpListener,
        next: &str,
        node: usize,
        prev: usize,
    ) -> Result<(TcpStream, TcpStream), String>;
    /// Closes `closer`'s sockets when the job stops, as the job's own ring's are, if the ring
    /// still exists then (its owner holds the `Arc`: a dropped ring's sockets are closed).
    fn close_on_stop(&self, closer: std::sync::Weak<RingCloser>);
    /// How long a new ring's reads and writes wait.
    fn timeout(&self) -> Duration;
}
