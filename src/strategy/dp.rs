//! `dp`: torch DataParallel. One optimizer on the main device (rank 0). Every step the main
//! device's parameters are replicated to the other devices (broadcast), each replica runs its
//! chunk of the global batch, and the gradients are reduced (summed, weighted by chunk size)
//! onto the main device, which alone steps. The main device carries the optimizer state, as in
//! torch.

use super::{clip_and_step, full_snapshot, whole_memory, Memory, Snapshot, Strategy};
use crate::checkpoint::OptState;
use crate::collective::{Collective, CollectiveError, Grads, ReduceOp};
use crate::config::Config;
use crate::train::optim::Optimizer;

pub struct Dp {
    comm: Box<dyn Collective>,
    params: Vec<f32>,
    /// Only the main device has an optimizer.
    opt: Option<Optimizer>,
}

impl Dp {
    pub fn new(c: &Config, comm: Box<dyn Collective>) -> Self {
        let opt = (comm.rank() == 0).then(|| Optimizer::new(&c.optim));
        Dp {
            comm,
            params: Vec::new(),
            opt,
        }
    }
}

impl Dp {
    /// replicate(module, devices): the main device's parameters to every replica.
    fn replicate(&mut self) -> Result<(), CollectiveError> {
        if self.comm.world() > 1 {
            self.comm.broadcast(&mut self.params, 0)?;
        }
        Ok(())
    }
}

impl Strategy for Dp {
    fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        self.comm.as_mut()
    }
    fn init(&mut self, init: Vec<f32>) -> Result<(), CollectiveError> {
        self.params = init;
        self.replicate()
    }
    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        Ok(&self.params)
    }
    fn grad_weight(&self, local: usize, global: usize) -> f64 {
        local as f64 / global.max(1) as f64
    }
    fn update(&mut self, grads: Grads, lr: f64, clip: Option<f64>) -> Result<(), CollectiveError> {
        let mut grads = if self.comm.world() > 1 {
            grads.reduce_to_host(self.comm.as_mut(), ReduceOp::Sum, 0)?
        } else {
            grads.into_host(0)?
        };
        if let Some(opt) = &mut self.opt {
            clip_and_step(opt, &mut self.params, &mut grads, lr, clip);
        }
        self.replicate()
    }
    fn memory(&self) -> Memory {
        whole_memory(
            self.rank(),
            &self.params,
            self.opt.as_ref().map(|o| o.state_bytes()).unwrap_or(0),
        )
    }
    fn snapshot(&mut self) -> Result<Snapshot, CollectiveError> {
        Ok(full_snapshot(
            self.rank(),
            &self.params,
            self.opt.as_ref().map(|o| o.export()),
        ))
    }
    fn load_optimizer(&mut self, opt: &OptState) {
        if let Some(o) = &mut self.opt {
            o.import_whole(opt);
        }
    }
}
