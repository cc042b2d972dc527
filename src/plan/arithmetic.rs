//! The plan arithmetic.

use crate::config::{Config, StrategyKind};
use crate::data::sampler::{Sampler, Segment};

/// How a step's samples are divided among ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSplit {
    /// torch DistributedSampler: rank r takes every world-th index (single, ddp).
    Distributed,
    /// torch DataParallel: one global batch of micro x world, split into contiguous chunks (dp).
    SplitBatch,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub world_size: usize,
    pub split: DataSplit,
    /// Micro-batch of one rank (`train.batch_size`).
    pub micro_batch: usize,
    pub accum: usize,
    /// micro x accum x world.
    pub global_batch: usize,
    pub train_samples: usize,
    pub sampler: Sampler,
    /// Micro-batches each rank runs per epoch.
    pub micro_per_epoch: usize,
    /// Optimizer steps the run takes.
    pub total_steps: usize,
    /// Micro-batches the run consumes.
    pub total_micro: usize,
    pub num_params: usize,
    /// The parameters that train (all of them unless some are frozen: `with_trainable`).
    pub trainable_params: usize,
}

impl Plan {
    pub fn new(c: &Config, train_samples: usize, num_params: usize) -> Plan {
        let world_size = crate::config::Mesh::of(c).world;
        let split = match c.strategy.kind {
            StrategyKind::Dp => DataSplit::SplitBatch,
            StrategyKind::Single | StrategyKind::Ddp | StrategyKind::Fsdp => DataSplit::Distributed,
        };
        let micro_batch = c.train.batch_size;
        let accum = c.train.grad_accum_steps;
        let sampler = Sampler {
            len: train_samples,
            world: match split {
                DataSplit::Distributed => world_size,
                DataSplit::SplitBatch => 1,
            },
            // (a stream of documents or of a mixture's windows shuffles them itself: its rows
            // go in order)
            shuffle: c.sampler.shuffle && !c.data.streams(),
            seed: c.sampler.seed,
            drop_last: c.sampler.drop_last,
            // token files: windows can number billions, so no order is held in memory
            lazy: c.data.kind == crate::config::DataKind::Tokens,
        };
        let per_step = match split {
            DataSplit::Distributed => micro_batch,
            DataSplit::SplitBatch => micro_batch * world_size,
        };
        let micro_per_epoch = sampler.per_rank().div_ceil(per_step).max(1);
        let (total_steps, total_micro) = match c.train.max_steps {
            Some(steps) => (steps, steps * accum),
            None => {
                let micro = c.train.epochs * micro_per_epoch;
                (micro.div_ceil(accum), micro)
            }
        };
        Plan {
            world_size,
            split,
            micro_batch,
            accum,
            global_batch: micro_batch * accum * world_size,
            train_samples,
            sampler,
            micro_per_epoch,
            total_steps,
            total_micro,
            num_params,
            trainable_params: num_params,
        }
    }

    /// This plan for a model of which `n` parameters train (`ParamLayout::num_trainable`).
    pub fn with_trainable(mut self, n: usize) -> Plan {
        self.trainable_params = n;
        self
    }

    /// "N parameters", and how many train where not all do.
    fn params_said(&self) -> String {
        if self.trainable_params == self.num_params {
            format!("{} parameters", self.num_params)
        } else {
            format!(
                "{} parameters, {} of them trainable ({:.2}%)",
                self.num_params,
                self.trainable_params,
                100.0 * self.trainable_params as f64 / self.num_params.max(1) as f64
            )
        }
    }

    /// Rank `rank`'s sample indices of micro-batch `j` of an epoch segment `seg` (of the
    /// sampler's world: the ranks under `Distributed`, one under `SplitBatch`); also the size of
    /// the whole micro-batch across ranks (`SplitBatch`).
    pub fn micro_indices(&self, seg: &Segment, j: usize, rank: usize) -> (Vec<usize>, usize) {
        let b = self.micro_batch;
        match self.split {
            DataSplit::Distributed => {
                let n = seg.per_rank();
                let ks = (j * b).min(n)..((j + 1) * b).min(n);
                (ks.map(|k| seg.of_rank(rank, k)).collect(), 0)
            }
            DataSplit::SplitBatch => {
                let (lo, hi) = (
                    (j * b * self.world_size).min(seg.total),
                    ((j + 1) * b * self.world_size).min(seg.total),
                );
                let whole = hi - lo;
                let chunk = whole.div_ceil(self.world_size);
                let a = lo + (rank * chunk).min(whole);
                let z = lo + ((rank + 1) * chunk).min(whole);
                ((a..z).map(|q| seg.global(q)).collect(), whole)
            }
        }
    }

    /// Samples of the global order one micro-step consumes over all ranks.
    pub fn micro_span(&self) -> usize {
        self.micro_batch * self.world_size
    }

    /// Micro-batches (per rank) in the part of an epoch that starts at global position `start`.
    pub fn segment_micro(&self, start: usize) -> usize {
        let per_step = match self.split {
            DataSplit::Distributed => self.micro_batch,
            DataSplit::SplitBatch => self.micro_span(),
        };
        self.sampler.per_rank_from(start).div_ceil(per_step)
    }

    /// The global cursor after `j` micro-batches of a segment that started at `start`.
    pub fn cursor(&self, start: usize, j: usize) -> usize {
        (start + j * self.micro_span()).min(self.train_samples)
    }

    /// A one-paragraph description for `kiln check` and the start of `kiln run`.
    pub fn describe(&self) -> String {
        if self.train_samples >= crate::data::STREAM_ROWS {
            return format!(
                "plan: world {} x batch {} x accum {} = global batch {} rows, streamed; {} optimizer steps; {}",
                self.world_size,
                self.micro_batch,
                self.accum,
                self.global_batch,
                self.total_steps,
                self.params_said()
            );
        }
        format!(
            "plan: world {} x batch {} x accum {} = global batch {}; {} train samples, {} micro-batches/epoch/rank, {} optimizer steps; {}",
            self.world_size,
            self.micro_batch,
            self.accum,
            self.global_batch,
            self.train_samples,
            self.micro_per_epoch,
            self.total_steps,
            self.params_said()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        let mut c = Config::default();
        c.train.batch_size = 32;
        c.train.epochs = 2;
        let p = Plan::new(&c, 1000, 10);
        assert_eq!(p.micro_per_epoch, 32);
        assert_eq!(p.total_steps, 64);
        c.train.grad_accum_steps = 3;
        let p = Plan::new(&c, 1000, 10);
        assert_eq!((p.total_micro, p.total_steps, p.global_batch), (64, 22, 96));
        c.train.max_steps = Some(5);
        let p = Plan::new(&c, 1000, 10);
        assert_eq!((p.total_micro, p.total_steps), (15, 5));
    }

    #[test]
    fn dp_splits_one_global_batch() {
        let mut c = Config::default();
        c.strategy.kind = StrategyKind::Dp;
        c.strategy.devices = crate::config::Devices::Count(3);
        c.train.batch_size = 4;
        let p = Plan::new(&c, 30, 1);
        assert_eq!(p.micro_per_epoch, 3);
        let seg = Sampler {
            shuffle: false,
            ..p.sampler
        }
        .segment_of(0, 0);
        assert_eq!(p.micro_indices(&seg, 1, 2), ((20..24).collect(), 12));
        // the last global batch has 6 samples: chunks of 2
        assert_eq!(p.micro_indices(&seg, 2, 0), ((24..26).collect(), 6));
        assert_eq!(p.micro_indices(&seg, 2, 2), ((28..30).collect(), 6));
    }
}
