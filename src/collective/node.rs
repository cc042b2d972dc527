//! Collectives across nodes: within a node the ranks use shared memory ([`LocalRank`]); across
//! nodes the node leaders (local rank 0) use the TCP ring ([`TcpRing`]). Global rank =
//! node x nproc_per_node + local rank, so node-major order is global rank order.

use super::tcp::{TcpRing, Wire};
use super::{Collective, CollectiveError, LocalRank, ReduceOp};

pub struct NodeRank {
    local: LocalRank,
    /// Only the node leader (local rank 0) talks to the other nodes.
    ring: Option<TcpRing>,
    node: usize,
    nnodes: usize,
    nproc: usize,
}

impl NodeRank {
    pub fn new(local: LocalRank, ring: Option<TcpRing>, node: usize, nnodes: usize) -> Self {
        let nproc = local.world();
        NodeRank {
            local,
            ring,
            node,
            nnodes,
            nproc,
        }
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
        self.node * self.nproc + self.local.rank()
    }

    fn world(&self) -> usize {
        self.nnodes * self.nproc
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
        let (root_node, root_local) = (root / self.nproc, root % self.nproc);
        if self.node == root_node {
            self.local.broadcast(buf, root_local)?;
        }
        if let Some(ring) = &mut self.ring {
            ring.broadcast(buf, root_node)?;
        }
        if self.node != root_node {
            self.local.broadcast(buf, 0)?;
        }
        Ok(())
    }

    fn all_gather(&mut self, send: &[f32], out: &mut [f32]) -> Result<(), CollectiveError> {
        let mut node_buf = vec![0.0; send.len() * self.nproc];
        self.local.all_gather(send, &mut node_buf)?;
        if let Some(ring) = &mut self.ring {
            let all = ring.all_gather(&node_buf)?;
            out.copy_from_slice(&all);
        }
        self.local.broadcast(out, 0)
    }

    fn all_gather_f64(&mut self, send: &[f64], out: &mut [f64]) -> Result<(), CollectiveError> {
        let mut node_buf = vec![0.0; send.len() * self.nproc];
        self.local.all_gather_f64(send, &mut node_buf)?;
        if let Some(ring) = &mut self.ring {
            let all = ring.all_gather(&node_buf)?;
            out.copy_from_slice(&all);
        }
        f64_bcast(&mut self.local, out)
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

    /// On one node, the in-process groups; across nodes not yet (that needs a TCP ring per
    /// group): an error on every rank.
    fn split(&mut self, color: usize, key: usize) -> Result<Box<dyn Collective>, CollectiveError> {
        if self.nnodes == 1 {
            return self.local.split(color, key);
        }
        Err(CollectiveError::Unsupported {
            rank: self.rank(),
            what: format!(
                "sub-groups (split) over {} nodes need a TCP ring per group, which kiln does not build yet: run on one node, or on CUDA with NCCL",
                self.nnodes
            ),
        })
    }

    fn abort(&self, reason: &str) {
        self.local.abort(reason);
        if let Some(ring) = &self.ring {
            ring.shutdown();
        }
    }
}
