//! Where a rank's shards live, one value chosen once ([`Shards`]): on the host (the shards,
//! their optimizer state and the step's gradient shards in host buffers, the update there), or
//! on the device ([`DeviceShards`], made by `DeviceResident::keep`, the update there and a host
//! copy brought up to date when asked). `Fsdp`'s methods match on it once and delegate; the
//! collectives around it (gathers, reduce-scatters, their queues beside the compute) are the
//! same for both.

use super::device::DeviceShards;
use super::*;

/// A rank's shards and their optimizer states in host buffers: the truth on the host path, a
/// copy on the device path.
#[derive(Default)]
pub(super) struct HostState {
    /// Per fsdp unit: this rank's shard (padded length `shard_len`).
    pub shards: Vec<Vec<f32>>,
    /// Per fsdp unit: the optimizer over its shard.
    pub opts: Vec<Optimizer>,
}

/// The host path: the shards, their update and the step's gradient shards on the host.
#[derive(Default)]
pub(super) struct HostShards {
    pub state: HostState,
    /// Per fsdp unit: this rank's shard of the step's reduced gradient, summed over
    /// micro-steps.
    pub grads: Vec<Option<Vec<f32>>>,
    /// The learning rate of the update this micro-step leads to, when its gradients are the
    /// step's final ones and each unit may step as soon as its shard is reduced
    /// (`before_micro`).
    pub backward_lr: Option<f64>,
    /// Per fsdp unit: whether it stepped early this step; and whether a gradient it stepped
    /// with had NaN or infinite values.
    pub stepped: Vec<bool>,
    pub stepped_non_finite: bool,
}

impl HostShards {
    /// The host path over `state` (nothing of a step begun).
    pub fn new(state: HostState) -> HostShards {
        let n = state.opts.len();
        HostShards {
            state,
            grads: vec![None; n],
            backward_lr: None,
            stepped: vec![false; n],
            stepped_non_finite: false,
        }
    }

    /// Steps unit `i`'s shard with its final gradient shard, which is freed: the update
    /// `update` would make (each unit has its own optimizer state), only earlier.
    pub fn step_unit(&mut self, i: usize, shard_len: usize, lr: f64) {
        let g = self.grads[i].take().unwrap_or_else(|| vec![0.0; shard_len]);
        if !crate::params::all_finite(&g) {
            self.stepped_non_finite = true;
        }
        self.state.opts[i].step(&mut self.state.shards[i], &g, lr);
        self.stepped[i] = true;
    }

    /// Whether a gradient shard of this step (or one a unit stepped with) has NaN or infinite
    /// values.
    pub fn grads_non_finite(&self) -> bool {
        self.stepped_non_finite
            || self
                .grads
                .iter()
                .flatten()
                .any(|g| !crate::params::all_finite(g))
    }

    /// The step's update of every shard that did not step in the backward: the gradient
    /// shards clipped by their global norm (all-reduced over `comm`), then each unit's step.
    /// The units inside the first `frozen` flat elements never step.
    pub fn update(
        &mut self,
        comm: &mut Overlapped,
        units: &[Unit],
        frozen: usize,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        // a unit that got no gradient this step (none can: every unit is in a stage) steps
        // with zeros; a unit that stepped in the backward (`step_in_backward`) is done, and a
        // frozen one never steps (AdamW would decay it)
        let mut stepped = std::mem::replace(&mut self.stepped, vec![false; units.len()]);
        for (s, u) in stepped.iter_mut().zip(units) {
            *s |= u.start < frozen;
        }
        self.stepped_non_finite = false;
        self.backward_lr = None;
        let mut shard_grads: Vec<Vec<f32>> = self
            .grads
            .iter_mut()
            .zip(units)
            .zip(&stepped)
            .map(|((g, u), &done)| {
                let g = g.take();
                match done {
                    // (its gradient went with its step; nothing arrives after it)
                    true => {
                        debug_assert!(g.is_none(), "a gradient arrived after its unit stepped");
                        Vec::new()
                    }
                    false => g.unwrap_or_else(|| vec![0.0; u.shard_len]),
                }
            })
            .collect();
        debug_assert!(
            clip.is_none()
                || !stepped
                    .iter()
                    .zip(units)
                    .any(|(&s, u)| s && u.start >= frozen),
            "clipping after units stepped early"
        );
        if let Some(max_norm) = clip {
            // the global norm: every shard's sum of squares, all-reduced
            let mut sq = [shard_grads.iter().map(|g| sum_squares(g)).sum::<f64>()];
            comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
            let norm = sq[0].sqrt();
            for g in &mut shard_grads {
                clip_by_norm(g, norm, max_norm);
            }
        }
        let state = &mut self.state;
        for (((shard, g), opt), done) in state
            .shards
            .iter_mut()
            .zip(&shard_grads)
            .zip(&mut state.opts)
            .zip(stepped)
        {
            if !done {
                opt.step(shard, g, lr);
            }
        }
        Ok(())
    }

    /// Forgets the step's gradients (a skipped step).
    pub fn discard(&mut self) {
        debug_assert!(
            !self.stepped.contains(&true),
            "a skippable step stepped units early"
        );
        self.backward_lr = None;
        self.stepped.iter_mut().for_each(|d| *d = false);
        self.stepped_non_finite = false;
        self.grads.iter_mut().for_each(|g| *g = None);
    }
}

/// Where this rank's shards are: chosen once, by `DeviceResident::keep` (`Fsdp::host_only`
/// says when it may not choose the device).
pub(super) enum Shards {
    Host(HostShards),
    Device(DeviceShards),
}

impl Shards {
    /// The host buffers of the shards (`with_state`: and their optimizer states), brought up
    /// to date from the device first on the device path.
    pub fn host(&mut self, rank: usize, with_state: bool) -> Result<&HostState, CollectiveError> {
        match self {
            Shards::Host(h) => Ok(&h.state),
            Shards::Device(d) => d.host_copy(rank, with_state),
        }
    }

    /// Appends shard `i` (read from the device on the device path) to `send`.
    pub fn read_shard(
        &mut self,
        i: usize,
        rank: usize,
        send: &mut Vec<f32>,
    ) -> Result<(), CollectiveError> {
        match self {
            Shards::Host(h) => send.extend_from_slice(&h.state.shards[i]),
            Shards::Device(d) => send.extend_from_slice(
                &d.shards[i]
                    .params()
                    .map_err(|e| device_error(rank, OpKind::AllGather, e))?,
            ),
        }
        Ok(())
    }

    /// Adds a micro-step's reduced shard of unit `i`, reduced on the host, into the step's
    /// (on the device path: written back to the device).
    pub fn add_grad(
        &mut self,
        i: usize,
        rank: usize,
        shard: Vec<f32>,
    ) -> Result<(), CollectiveError> {
        match self {
            Shards::Host(h) => {
                host::add_shard(&mut h.grads[i], shard);
                Ok(())
            }
            Shards::Device(d) => d.add_host_shard(rank, i, &shard),
        }
    }

    /// The optimizer states' bytes, where they are.
    pub fn state_bytes(&self) -> usize {
        match self {
            Shards::Host(h) => h.state.opts.iter().map(|o| o.state_bytes()).sum(),
            Shards::Device(d) => d.state_bytes(),
        }
    }

    /// Back to the host path, the host copy being the truth again (`init`, `load_optimizer`
    /// replace it), with nothing of the state it replaces in flight.
    pub fn move_to_host(&mut self, comm: &mut Overlapped) {
        let state = match std::mem::replace(self, Shards::Host(HostShards::default())) {
            Shards::Host(h) => h.state,
            Shards::Device(mut d) => {
                d.settle(comm);
                std::mem::take(&mut d.host)
            }
        };
        *self = Shards::Host(HostShards::new(state));
    }

    /// The device path from the host path's state, in buffers like `proto`; the host path
    /// stays when the backend's buffers are not f32 (the masters stay on the host).
    pub fn move_to_device(&mut self, proto: &dyn DeviceTensor) {
        let Shards::Host(h) = self else {
            return;
        };
        let state = std::mem::take(&mut h.state);
        *self = match DeviceShards::new(proto, state) {
            Ok(d) => Shards::Device(d),
            Err(state) => Shards::Host(HostShards::new(state)),
        };
    }
}
