//! `dp`: torch DataParallel. One optimizer on the main device (rank 0). Every step the main
//! device's parameters are replicated to the other devices (broadcast), each replica runs its
//! chunk of the global batch, and the gradients are reduced (summed, weighted by chunk size)
//! onto the main device, which alone steps. The main device carries the optimizer state, as in
//! torch.
//!
//! Over a device collective (NCCL) with f32 parameters, every replica keeps its parameters on its
//! device (`DeviceParams`): the reduction to the main device, its update and the broadcast back
//! all run on device buffers, and the host copy is refreshed only when asked for.

use std::ops::Range;

use super::{
    full_snapshot, whole_memory, DeviceCopy, DeviceResident, Memory, Snapshot, Strategy, WholeGrads,
};
use crate::checkpoint::OptState;
use crate::collective::{device_error, Collective, CollectiveError, GradsOps, OpKind, ReduceOp};
use crate::config::{Config, OptimConfig};
use crate::params::{clip_and_step, DeviceTensor, Grads, Optimizer, ParamLayout};

pub struct Dp {
    comm: Box<dyn Collective>,
    params: Vec<f32>,
    /// Only the main device has an optimizer.
    opt: Option<Optimizer>,
    optim: OptimConfig,
    /// This replica's parameters (and, on the main device, the optimizer state) on the device.
    device: DeviceCopy,
    /// Elements of the gradient: the trainable parameters (`ParamLayout::trainable`).
    num_params: usize,
    /// Leading parameters that never train (see `Ddp`).
    frozen: usize,
    /// The step's gradient, reduced onto the main device at the update.
    grads: WholeGrads,
}

impl Dp {
    /// `opt`: the main device's optimizer of the whole parameters (its undecayed ranges set).
    pub fn new(
        c: &Config,
        layout: &ParamLayout,
        opt: Optimizer,
        comm: Box<dyn Collective>,
    ) -> Self {
        let opt = (comm.rank() == 0).then_some(opt);
        Dp {
            comm,
            params: Vec::new(),
            opt,
            optim: c.optim.clone(),
            device: DeviceCopy::with_frozen(layout.frozen),
            num_params: layout.num_trainable(),
            frozen: layout.frozen,
            grads: WholeGrads::default(),
        }
    }

    /// Brings `params` and `opt` up to date with the device.
    /// (`with_state`: the optimizer state too, for a checkpoint or the host update.)
    fn sync_host(&mut self, with_state: bool) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        self.device.sync(
            rank,
            &mut self.params,
            if with_state { self.opt.as_mut() } else { None },
        )
    }

    /// The device path of `update`: reduce onto the main device, step there, broadcast back.
    fn update_on_device(
        &mut self,
        grads: &mut dyn DeviceTensor,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let err = |e| device_error(rank, OpKind::Update, e);
        let world = self.comm.world();
        let Some(dev) = &mut self.device.dev else {
            return Ok(());
        };
        let Some(ops) = self.comm.device_ops() else {
            return Err(err("no device collective".into()));
        };
        if world > 1 {
            ops.reduce_raw(grads.raw().map_err(err)?, ReduceOp::Sum, 0)?;
        }
        if rank == 0 {
            dev.step(grads, lr, clip).map_err(err)?;
        }
        if world > 1 {
            ops.broadcast_raw(dev.raw().map_err(err)?, 0)?;
        }
        self.device.stepped();
        Ok(())
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
    fn on_device(&mut self) -> Option<&mut dyn DeviceResident> {
        Some(self)
    }
    fn comm(&self) -> &dyn Collective {
        self.comm.as_ref()
    }
    fn comm_mut(&mut self) -> &mut dyn Collective {
        self.comm.as_mut()
    }
    fn init(&mut self, init: &[f32]) -> Result<(), CollectiveError> {
        self.params = init.to_vec();
        self.device.reset();
        self.replicate()
    }
    fn params(&mut self) -> Result<&[f32], CollectiveError> {
        self.sync_host(false)?;
        Ok(&self.params)
    }
    fn grad_weight(&self, local: usize, global: usize) -> f64 {
        local as f64 / global.max(1) as f64
    }
    fn unit_grad(
        &mut self,
        _unit: usize,
        range: Range<usize>,
        grad: Grads,
        _sync: bool,
    ) -> Result<(), CollectiveError> {
        // DataParallel reduces once, after the backward
        let rank = self.comm.rank();
        let f = self.frozen;
        self.grads
            .add(rank, self.num_params, range.start - f..range.end - f, grad)?;
        Ok(())
    }
    fn grads_non_finite(&mut self) -> Result<bool, CollectiveError> {
        let rank = self.comm.rank();
        self.grads
            .non_finite()
            .map_err(|e| device_error(rank, OpKind::Update, e))
    }
    fn update(&mut self, lr: f64, clip: Option<f64>) -> Result<(), CollectiveError> {
        let mut grads = self.grads.take(self.num_params);
        if let (Some(_), Grads::Device(g)) = (&self.device.dev, &mut grads) {
            return self.update_on_device(g.as_mut(), lr, clip);
        }
        self.sync_host(true)?;
        self.device.reset();
        let mut grads = if self.comm.world() > 1 {
            grads.reduce_to_host(self.comm.as_mut(), ReduceOp::Sum, 0)?
        } else {
            grads.into_host(0)?
        };
        if let Some(opt) = &mut self.opt {
            clip_and_step(opt, &mut self.params[self.frozen..], &mut grads, lr, clip);
        }
        self.replicate()
    }
    fn discard_grads(&mut self) -> Result<(), CollectiveError> {
        // (reduced only at the update: nothing is in flight)
        self.grads.take(self.num_params);
        Ok(())
    }
    fn placement(&mut self) -> String {
        self.device.placement("the main device's update runs")
    }
    fn memory(&self) -> Memory {
        let optim = self
            .device
            .state_bytes()
            .unwrap_or_else(|| self.opt.as_ref().map(|o| o.state_bytes()).unwrap_or(0));
        whole_memory(self.rank(), &self.params, self.num_params, optim)
    }
    fn snapshot(&mut self) -> Result<Snapshot, CollectiveError> {
        self.sync_host(true)?;
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
        // a device copy (if any) is made again from the host state
        self.device.reset();
    }
}

impl DeviceResident for Dp {
    fn unit_params(
        &mut self,
        _unit: usize,
        range: Range<usize>,
        proto: &dyn DeviceTensor,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError> {
        // the reduction to the main device and the broadcast back run on device buffers only
        // over a device collective; host-staged, the replicas take host parameters each step
        if self.comm.device_ops().is_none() {
            return Ok(None);
        }
        // replicas get the optimizer's settings only; they never step
        let replica = Optimizer::new(&self.optim);
        let opt = self.opt.as_ref().unwrap_or(&replica);
        Ok(self.device.slice(&self.params, opt, proto, range))
    }
    fn resident(&self) -> bool {
        self.device.dev.is_some()
    }
}
