//! `single`: one device, no communication.

use super::{clip_and_step, full_snapshot, Memory, Snapshot, Strategy};
use crate::checkpoint::OptState;
use crate::collective::{Collective, CollectiveError};
use crate::config::Config;
use crate::train::optim::Optimizer;

pub struct Single {
    comm: Box<dyn Collective>,
    params: Vec<f32>,
    opt: Optimizer,
}

impl Single {
    pub fn new(c: &Config, comm: Box<dyn Collective>) -> Self {
        Single {
            comm,
            params: Vec::new(),
            opt: Optimizer::new(&c.optim),
        }
    }
}

impl Strategy for Single {
    fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        self.comm.as_mut()
    }
    fn init(&mut self, init: Vec<f32>) -> Result<(), CollectiveError> {
        self.params = init;
        Ok(())
    }
    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        Ok(&self.params)
    }
    fn grad_weight(&self, _local: usize, _global: usize) -> f64 {
        1.0
    }
    fn update(
        &mut self,
        mut grads: Vec<f32>,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        clip_and_step(&mut self.opt, &mut self.params, &mut grads, lr, clip);
        Ok(())
    }
    fn memory(&self) -> Memory {
        let bytes = self.params.len() * 4;
        Memory {
            rank: self.rank(),
            params_bytes: bytes,
            grads_bytes: bytes,
            optim_bytes: self.opt.state_bytes(),
        }
    }
    fn snapshot(&mut self) -> Snapshot {
        full_snapshot(self.rank(), &self.params, Some(self.opt.export()))
    }
    fn load_optimizer(&mut self, opt: &OptState) {
        self.opt.import(
            opt,
            0..opt.m.len().max(opt.v.len()),
            opt.m.len().max(opt.v.len()),
        );
    }
}
