//! fsdp's collectives over host buffers, for both placements of the shards: all-gathers and
//! reduce-scatters on the host (started on the rank's communication thread with
//! `strategy.overlap`, the host shards' or, host-staged, the device shards'), and the units of a
//! stage gathered or reduce-scattered together.

use std::collections::VecDeque;

use super::*;

/// All-gathers `prefetch` started on the communication thread, oldest first (the fsdp units
/// each gathers together), and each unit's parameters split from one until the step asks.
#[derive(Default)]
pub(super) struct Ahead {
    queue: VecDeque<(Vec<usize>, Reduced)>,
    ready: Vec<Option<Vec<f32>>>,
}

impl Ahead {
    pub fn new(units: usize) -> Ahead {
        Ahead {
            queue: VecDeque::new(),
            ready: vec![None; units],
        }
    }

    /// Whether unit `i`'s parameters are gathered or being gathered.
    pub fn holds(&self, i: usize) -> bool {
        self.ready[i].is_some() || self.queue.iter().any(|(g, _)| g.contains(&i))
    }

    pub fn push(&mut self, group: Vec<usize>, p: Reduced) {
        self.queue.push_back((group, p));
    }

    /// Forgets every gather (of parameters an update replaces, or that the step never asked
    /// for).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.ready.iter_mut().for_each(|p| *p = None);
    }

    /// The parameters of fsdp unit `i` from a gather `prefetch` started, if one holds it.
    pub fn take(
        &mut self,
        comm: &mut Overlapped,
        units: &[Unit],
        i: usize,
    ) -> Result<Option<Vec<f32>>, CollectiveError> {
        if let Some(v) = self.ready[i].take() {
            return Ok(Some(v));
        }
        let at = self.queue.iter().position(|(g, _)| g.contains(&i));
        let Some((group, p)) = at.and_then(|k| self.queue.remove(k)) else {
            return Ok(None);
        };
        let gathered = comm.wait(p)?;
        self.split(units, comm.world(), &group, gathered);
        Ok(self.ready[i].take())
    }

    /// Splits the all-gather of `group`'s shards side by side (rank by rank) into each unit's
    /// parameters, kept until asked for.
    fn split(&mut self, units: &[Unit], world: usize, group: &[usize], gathered: Vec<f32>) {
        if let [i] = group[..] {
            self.ready[i] = Some(gathered);
            return;
        }
        let block: usize = group.iter().map(|&i| units[i].shard_len).sum();
        let mut at = 0;
        for &i in group {
            let u = &units[i];
            let mut whole = Vec::with_capacity(u.padded_len(world));
            for r in 0..world {
                let from = r * block + at;
                whole.extend_from_slice(&gathered[from..from + u.shard_len]);
            }
            whole.truncate(u.len);
            at += u.shard_len;
            self.ready[i] = Some(whole);
        }
    }
}

impl Fsdp {
    /// All-gathers unit `i` from the host shards and returns its unpadded parameters.
    pub(super) fn gather_unit(&mut self, i: usize) -> Result<Vec<f32>, CollectiveError> {
        let (rank, world) = (self.comm.rank(), self.comm.world());
        let u = &self.units[i];
        let mut out = vec![0f32; u.padded_len(world)];
        let host = self.shards.host(rank, false)?;
        self.comm.all_gather(&host.shards[i], &mut out)?;
        out.truncate(u.len);
        Ok(out)
    }

    /// Materialises the whole parameters from the shards.
    pub(super) fn gather_all(&mut self) -> Result<Vec<f32>, CollectiveError> {
        let mut full = vec![0f32; self.num_params];
        for i in 0..self.units.len() {
            let unit = self.gather_unit(i)?;
            full[self.units[i].range()].copy_from_slice(&unit);
        }
        Ok(full)
    }

    /// Adds the reduce-scatters that have finished (`all`: every one, waiting) into the shards'
    /// gradients, in the order they were started.
    pub(super) fn collect(&mut self, all: bool) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let (shards, units) = (&mut self.shards, &self.units);
        let mut early = Vec::new();
        self.inflight
            .collect(&mut self.comm, all, |(group, lr), reduced| {
                if let Some(lr) = lr {
                    early.extend(group.iter().map(|&i| (i, lr)));
                }
                if let [i] = group[..] {
                    return shards.add_grad(i, rank, reduced);
                }
                // the units' shards side by side
                let mut at = 0;
                for i in group {
                    let len = units[i].shard_len;
                    shards.add_grad(i, rank, reduced[at..at + len].to_vec())?;
                    at += len;
                }
                Ok(())
            })?;
        for (i, lr) in early {
            self.step_unit(i, lr);
        }
        Ok(())
    }

    /// Reduce-scatters the host gradients of several whole fsdp units in one op: rank r's part
    /// of the buffer holds the r-th shard of each unit, side by side.
    pub(super) fn reduce_scatter_together(
        &mut self,
        group: Vec<usize>,
        grads: Vec<Vec<f32>>,
    ) -> Result<(), CollectiveError> {
        let world = self.comm.world();
        let block: usize = group.iter().map(|&i| self.units[i].shard_len).sum();
        // made here, on the compute thread that frees it (see `unit_grad`)
        let mut send = vec![0f32; block * world];
        let mut at = 0;
        for (&i, g) in group.iter().zip(&grads) {
            let u = &self.units[i];
            for r in 0..world {
                let own = u.owned(r);
                let to = r * block + at;
                send[to..to + own.len()].copy_from_slice(&g[own]);
            }
            at += u.shard_len;
        }
        drop(grads);
        let mut out = vec![0f32; block];
        let replica = self.replica.clone();
        let p = self.comm.submit(OpKind::ReduceScatter, move |c| {
            c.reduce_scatter(&send, &mut out, ReduceOp::Mean)?;
            super::across_replicas(replica.as_ref(), &mut out)?;
            Ok(out)
        });
        let lr = self.step_in_backward();
        self.inflight.push((group, lr), p);
        self.collect(false)
    }
}

/// Adds a micro-step's reduced shard into the step's (the first one is it).
pub(super) fn add_shard(acc: &mut Option<Vec<f32>>, shard: Vec<f32>) {
    match acc {
        Some(acc) => acc.iter_mut().zip(&shard).for_each(|(a, b)| *a += b),
        slot => *slot = Some(shard),
    }
}
