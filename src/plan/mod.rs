//! Config -> plan: the batch and step arithmetic, checked up front. Pure: touches no device and
//! no file, so every number a run will use can be unit-tested and printed by `kiln check`.

use crate::config::Config;
use crate::data::sampler::Sampler;

#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub world_size: usize,
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
}

impl Plan {
    pub fn new(c: &Config, train_samples: usize, num_params: usize) -> Plan {
        let world_size = 1;
        let micro_batch = c.train.batch_size;
        let accum = c.train.grad_accum_steps;
        let sampler = Sampler {
            len: train_samples,
            world: world_size,
            shuffle: c.sampler.shuffle,
            seed: c.sampler.seed,
            drop_last: c.sampler.drop_last,
        };
        let micro_per_epoch = sampler.per_rank().div_ceil(micro_batch).max(1);
        let (total_steps, total_micro) = match c.train.max_steps {
            Some(steps) => (steps, steps * accum),
            None => {
                let micro = c.train.epochs * micro_per_epoch;
                (micro.div_ceil(accum), micro)
            }
        };
        Plan {
            world_size,
            micro_batch,
            accum,
            global_batch: micro_batch * accum * world_size,
            train_samples,
            sampler,
            micro_per_epoch,
            total_steps,
            total_micro,
            num_params,
        }
    }

    /// A one-paragraph description for `kiln check` and the start of `kiln run`.
    pub fn describe(&self) -> String {
        format!(
            "plan: world {} x batch {} x accum {} = global batch {}; {} train samples, {} micro-batches/epoch/rank, {} optimizer steps; {} parameters",
            self.world_size,
            self.micro_batch,
            self.accum,
            self.global_batch,
            self.train_samples,
            self.micro_per_epoch,
            self.total_steps,
            self.num_params
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
}
