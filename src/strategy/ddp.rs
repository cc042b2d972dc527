//! `ddp`: torch DistributedDataParallel. Rank 0's initial parameters are broadcast; every rank
//! keeps a full replica and its own optimizer; at the last micro-step of a step the gradients are
//! averaged by all-reduce in buckets of `bucket_cap_mb` (earlier micro-steps accumulate locally
//! without communication, like `no_sync`).

use super::{clip_and_step, full_snapshot, whole_memory, Memory, Snapshot, Strategy};
use crate::checkpoint::OptState;
use crate::collective::{Collective, CollectiveError, Grads, ReduceOp};
use crate::config::Config;
use crate::train::optim::Optimizer;

pub struct Ddp {
    comm: Box<dyn Collective>,
    params: Vec<f32>,
    opt: Optimizer,
    bucket_elems: usize,
}

impl Ddp {
    pub fn new(c: &Config, num_params: usize, comm: Box<dyn Collective>) -> Self {
        let bucket_elems = ((c.strategy.bucket_cap_mb * 1024.0 * 1024.0 / 4.0) as usize)
            .clamp(1, num_params.max(1));
        Ddp {
            comm,
            params: Vec::new(),
            opt: Optimizer::new(&c.optim),
            bucket_elems,
        }
    }
}

impl Strategy for Ddp {
    fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        self.comm.as_mut()
    }
    fn init(&mut self, mut init: Vec<f32>) -> Result<(), CollectiveError> {
        self.comm.broadcast(&mut init, 0)?;
        self.params = init;
        Ok(())
    }
    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        Ok(&self.params)
    }
    fn grad_weight(&self, _local: usize, _global: usize) -> f64 {
        1.0
    }
    fn micro_sync(&mut self, grads: &mut Grads) -> Result<(), CollectiveError> {
        let n = grads.len();
        for start in (0..n).step_by(self.bucket_elems) {
            let bucket = start..(start + self.bucket_elems).min(n);
            grads.all_reduce(self.comm.as_mut(), bucket, ReduceOp::Mean)?;
        }
        Ok(())
    }
    fn update(
        &mut self,
        mut grads: Grads,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        self.micro_sync(&mut grads)?;
        let mut grads = grads.into_host(self.comm.rank())?;
        clip_and_step(&mut self.opt, &mut self.params, &mut grads, lr, clip);
        Ok(())
    }
    fn memory(&self) -> Memory {
        whole_memory(self.rank(), &self.params, self.opt.state_bytes())
    }
    fn snapshot(&mut self) -> Snapshot {
        full_snapshot(self.rank(), &self.params, Some(self.opt.export()))
    }
    fn load_optimizer(&mut self, opt: &OptState) {
        self.opt.import_whole(opt);
    }
}
