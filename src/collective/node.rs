//! Collectives across nodes: within a node the ranks use shared memory ([`LocalRank`]); across
//! nodes the node leaders (local rank 0) use a TCP ring ([`TcpRing`]). In the job's group,
//! global rank = node x nproc_per_node + local rank, so node-major order is global rank order.
//!
//! A sub-group (`split`) is the same shape: this node's members form an in-process sub-group,
//! and when the group spans nodes their leaders link a ring of their own (through the job's
//! [`RingLinker`], the addresses passed around by the parent group). Its ranks follow the keys,
//! so a node's members need not be consecutive, and nodes may hold different numbers of them.

use std::sync::Arc;

use super::tcp::{RingLinker, RingPeer, TcpRing, Wire};
use super::{Collective, CollectiveError, LocalRank, OpId, OpKind, ReduceOp};

pub struct NodeRank {
    local: LocalRank,
    /// Only the node leader (local rank 0) talks to the other nodes.
    ring: Option<TcpRing>,
    /// The nodes with ranks of this group, in node order (the ring's positions): the job's node
    /// number and its members' ranks in this group, in local rank order.
    nodes: Vec<RingPeer>,
    /// This node's position in `nodes`.
    pos: usize,
    world: usize,
    /// Links the rings of sub-groups that span nodes (none: they are refused).
    links: Option<Arc<dyn RingLinker>>,
    /// A sub-group's own ring: closed when the group is dropped (the job's stop hook holds it
    /// weakly), so its peers see the end at once and no descriptor outlives it.
    own_ring: Option<Arc<super::tcp::RingCloser>>,
}

impl Drop for NodeRank {
    fn drop(&mut self) {
        if let Some(c) = &self.own_ring {
            c.close();
        }
    }
}

/// A node's address in a split's exchange: its length, then 6 bytes per f64 (exact).
const ADDR_WORDS: usize = 12;

impl NodeRank {
    /// Local rank `local.rank()` of node `node` of `nnodes`, each with `local.world()` ranks.
    pub fn new(
        local: LocalRank,
        ring: Option<TcpRing>,
        node: usize,
        nnodes: usize,
        links: Option<Arc<dyn RingLinker>>,
    ) -> Self {
        let nproc = local.world();
        let nodes = (0..nnodes)
            .map(|n| RingPeer {
                node: n,
                ranks: (n * nproc..(n + 1) * nproc).collect(),
            })
            .collect();
        NodeRank {
            local,
            ring,
            nodes,
            pos: node,
            world: nnodes * nproc,
            links,
            own_ring: None,
        }
    }

    fn leader(&self) -> bool {
        self.local.rank() == 0
    }

    /// Sums `buf` over every rank of every node; everyone gets the result.
    fn sum_all<T: Wire>(
        &mut self,
        buf: &mut [T],
        local_sum: impl Fn(&mut LocalRank, &mut [T]) -> Result<(), CollectiveError>,
        local_bcast: impl Fn(&mut LocalRank, &mut [T]) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        local_sum(&mut self.local, buf)?;
        if let Some(ring) = &mut self.ring {
            ring.all_reduce_sum(buf)?;
        }
        local_bcast(&mut self.local, buf)
    }

    /// Every rank's `send` in group rank order: gathered on each node, the nodes' blocks
    /// (padded to the largest node's) passed around the ring, then put in rank order.
    fn gather<T: Wire>(
        &mut self,
        send: &[T],
        out: &mut [T],
        local_gather: impl Fn(&mut LocalRank, &[T], &mut [T]) -> Result<(), CollectiveError>,
        local_bcast: impl Fn(&mut LocalRank, &mut [T]) -> Result<(), CollectiveError>,
    ) -> Result<(), CollectiveError> {
        let k = send.len();
        let zero = T::get(&[0u8; 8]);
        let mut node_buf = vec![zero; k * self.nodes[self.pos].ranks.len()];
        local_gather(&mut self.local, send, &mut node_buf)?;
        if self.leader() {
            let widest = self.nodes.iter().map(|n| n.ranks.len()).max().unwrap_or(0);
            node_buf.resize(k * widest, zero);
            let all = match &mut self.ring {
                Some(ring) => ring.all_gather(&node_buf)?,
                None => node_buf,
            };
            for (p, n) in self.nodes.iter().enumerate() {
                for (i, &r) in n.ranks.iter().enumerate() {
                    let from = (p * widest + i) * k;
                    out[r * k..(r + 1) * k].copy_from_slice(&all[from..from + k]);
                }
            }
        }
        local_bcast(&mut self.local, out)
    }

    /// Where group rank `rank` is: its node's position and its local rank there.
    fn place_of(&self, rank: usize) -> (usize, usize) {
        self.nodes
            .iter()
            .enumerate()
            .find_map(|(p, n)| n.ranks.iter().position(|&r| r == rank).map(|i| (p, i)))
            .unwrap_or((0, 0))
    }
}

fn f64_bcast(l: &mut LocalRank, buf: &mut [f64]) -> Result<(), CollectiveError> {
    // f64 through the f32 broadcast would lose bits: gather from the leader instead
    let mut out = vec![0.0; buf.len() * l.world()];
    l.all_gather_f64(buf, &mut out)?;
    buf.copy_from_slice(&out[..buf.len()]);
    Ok(())
}

impl Collective for NodeRank {
    fn rank(&self) -> usize {
        self.nodes[self.pos].ranks[self.local.rank()]
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        self.sum_all(
            buf,
            |l, b| l.all_reduce(b, ReduceOp::Sum),
            |l, b| l.broadcast(b, 0),
        )?;
        if op == ReduceOp::Mean {
            let w = self.world() as f32;
            buf.iter_mut().for_each(|v| *v /= w);
        }
        Ok(())
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CollectiveError> {
        self.sum_all(buf, |l, b| l.all_reduce_f64(b, ReduceOp::Sum), f64_bcast)?;
        if op == ReduceOp::Mean {
            let w = self.world() as f64;
            buf.iter_mut().for_each(|v| *v /= w);
        }
        Ok(())
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        root: usize,
    ) -> Result<(), CollectiveError> {
        let mut tmp = buf.to_vec();
        self.all_reduce(&mut tmp, op)?;
        if self.rank() == root {
            buf.copy_from_slice(&tmp);
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        if root >= self.world {
            return Err(CollectiveError::Unsupported {
                rank: self.rank(),
                what: format!(
                    "broadcast from rank {root}, not a rank of this group of {}",
                    self.world
                ),
            });
        }
        let (root_pos, root_local) = self.place_of(root);
        if self.pos == root_pos {
            self.local.broadcast(buf, root_local)?;
        }
        if let Some(ring) = &mut self.ring {
            ring.broadcast(buf, root_pos)?;
        }
        if self.pos != root_pos {
            self.local.broadcast(buf, 0)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        self.gather(
            send,
            out,
            |l, s, o| l.all_gather(s, o),
            |l, b| l.broadcast(b, 0),
        )
    }

    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        self.gather(send, out, |l, s, o| l.all_gather_f64(s, o), f64_bcast)
    }

    fn reduce_scatter(
        &mut self,
        send: &[f32],
        out: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let mut all = send.to_vec();
        self.all_reduce(&mut all, op)?;
        let n = out.len();
        let r = self.rank();
        out.copy_from_slice(&all[r * n..(r + 1) * n]);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        let mut one = [0f32];
        self.all_reduce(&mut one, ReduceOp::Sum)
    }

    /// Ranks of one color, ordered by (key, rank). On one node, the in-process groups; across
    /// nodes, each node's members form an in-process group and the leaders of a group that
    /// spans nodes link a ring of their own.
    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        if self.nodes.len() == 1 {
            return self.local.split(color, key);
        }
        Ok(Box::new(self.split_nodes(color, key)?))
    }

    fn abort(&self, reason: &str) {
        self.local.abort(reason);
        if let Some(ring) = &self.ring {
            ring.shutdown();
        }
    }
}

impl NodeRank {
    fn split_nodes(&mut self, color: usize, key: usize) -> Result<NodeRank, CollectiveError> {
        let rank = self.rank();
        let unsupported = |what: String| CollectiveError::Unsupported { rank, what };
        for (what, v) in [("color", color), ("key", key)] {
            if i32::try_from(v).is_err() {
                return Err(unsupported(format!(
                    "split {what} {v} is above the limit (2^31 - 1)"
                )));
            }
        }
        // (every rank alike, before any exchange: none waits for another)
        if self.links.is_none() {
            return Err(unsupported(format!(
                "this group over {} nodes has no rendezvous to link a sub-group's ring through",
                self.nodes.len()
            )));
        }
        // every rank's (color, key), then this node's members of the color as a local group
        let mut table = vec![0.0; 2 * self.world];
        self.all_gather_f64(&[color as f64, key as f64], &mut table)?;
        let local = self.local.split_local(color, key)?;
        let mut members: Vec<(usize, usize)> = (0..self.world)
            .filter(|&r| table[2 * r] == color as f64)
            .map(|r| (table[2 * r + 1] as usize, r))
            .collect();
        members.sort_unstable();
        let group_rank = |r: usize| members.iter().position(|&(_, m)| m == r);
        // the nodes with members, in node order, each with its members' group ranks: a node's
        // members are in the local group's order, (key, rank) as the group's
        let nodes: Vec<RingPeer> = self
            .nodes
            .iter()
            .filter_map(|n| {
                let mut ranks: Vec<(usize, usize)> = n
                    .ranks
                    .iter()
                    .filter_map(|&r| group_rank(r).map(|g| (g, r)))
                    .collect();
                ranks.sort_unstable();
                let ranks: Vec<usize> = ranks.into_iter().map(|(g, _)| g).collect();
                (!ranks.is_empty()).then_some(RingPeer {
                    node: n.node,
                    ranks,
                })
            })
            .collect();
        let here = self.nodes[self.pos].node;
        let pos = nodes.iter().position(|n| n.node == here).unwrap_or(0);
        let spans = nodes.len() > 1;
        // the leader of each node's part of a group that spans nodes listens for its ring
        let mut listener = None;
        let mut addr = [0.0; ADDR_WORDS];
        if spans && local.rank() == 0 {
            let links = self
                .links
                .clone()
                .ok_or_else(|| unsupported("no rendezvous".into()))?;
            // a failure here still takes part in the exchange (length 0), so every member of
            // the group fails alike instead of waiting for this node
            if let Ok((l, a)) = links.listen() {
                if encode_addr(&a, &mut addr) {
                    listener = Some(l);
                }
            }
        }
        let mut addrs = vec![0.0; ADDR_WORDS * self.world];
        self.all_gather_f64(&addr, &mut addrs)?;
        let mut sub = NodeRank {
            local,
            ring: None,
            world: members.len(),
            nodes,
            pos,
            links: self.links.clone(),
            own_ring: None,
        };
        if !spans || sub.local.rank() != 0 {
            return Ok(sub);
        }
        // the leaders: each node's first member in the group's order
        let leader_addr = |p: usize| {
            let first = sub.nodes[p].ranks[0];
            let r = members[first].1;
            decode_addr(&addrs[r * ADDR_WORDS..(r + 1) * ADDR_WORDS])
        };
        let n = sub.nodes.len();
        let (next, prev) = ((pos + 1) % n, (pos + n - 1) % n);
        // every leader sees every address: a node that could not listen fails them all alike
        let failed: Vec<String> = (0..n)
            .filter(|&p| leader_addr(p).is_none())
            .map(|p| sub.nodes[p].node.to_string())
            .collect();
        let (Some(listener), Some(next_addr), true) =
            (listener, leader_addr(next), failed.is_empty())
        else {
            return Err(self.split_failed(
                rank,
                &format!("node {} could not listen for it", failed.join(", node ")),
            ));
        };
        let links = self
            .links
            .clone()
            .ok_or_else(|| unsupported("no rendezvous".into()))?;
        let (out, inn) = links
            .link(&listener, &next_addr, here, sub.nodes[prev].node)
            .map_err(|e| self.split_failed(rank, &e))?;
        let ring = TcpRing::of_peers(
            pos,
            sub.nodes.clone(),
            Some(out),
            Some(inn),
            links.timeout(),
        );
        let closer = Arc::new(ring.closer());
        links.close_on_stop(Arc::downgrade(&closer));
        sub.own_ring = Some(closer);
        sub.ring = Some(ring);
        Ok(sub)
    }

    /// A split that could not link its ring stops this group: its ranks on this node (and
    /// the groups split from or beside it) and its own ring, so the other nodes' ranks stop
    /// at their next op instead of waiting out the timeout.
    fn split_failed(&self, rank: usize, why: &str) -> CollectiveError {
        let reason = format!("a sub-group's ring could not be linked: {why}");
        self.abort(&reason);
        CollectiveError::Aborted {
            rank,
            op: OpId {
                seq: 0,
                kind: OpKind::Split,
            },
            reason,
        }
    }
}

/// Writes `addr` (UTF-8, at most 6 x (ADDR_WORDS - 1) bytes) into `out`: false if too long.
fn encode_addr(addr: &str, out: &mut [f64; ADDR_WORDS]) -> bool {
    let b = addr.as_bytes();
    if b.is_empty() || b.len() > 6 * (ADDR_WORDS - 1) {
        return false;
    }
    out[0] = b.len() as f64;
    for (i, chunk) in b.chunks(6).enumerate() {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        out[i + 1] = u64::from_le_bytes(w) as f64;
    }
    true
}

fn decode_addr(words: &[f64]) -> Option<String> {
    let len = *words.first()? as usize;
    if len == 0 || len > 6 * (ADDR_WORDS - 1) {
        return None;
    }
    let mut b = Vec::with_capacity(len);
    for w in &words[1..] {
        b.extend_from_slice(&(*w as u64).to_le_bytes()[..6]);
    }
    b.truncate(len);
    String::from_utf8(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_f64_exchange() {
        for a in ["10.0.0.1:29501", "[fe80::1%eth0]:65535", "x:1"] {
            let mut w = [0.0; ADDR_WORDS];
            assert!(encode_addr(a, &mut w));
            assert_eq!(decode_addr(&w).as_deref(), Some(a));
        }
        let mut w = [0.0; ADDR_WORDS];
        assert!(!encode_addr(&"a".repeat(100), &mut w));
        assert_eq!(decode_addr(&w), None);
    }
}
