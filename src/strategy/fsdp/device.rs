//! fsdp's device path: sharding = "full" over a device collective (NCCL), where each rank's
//! shards and their optimizer state live on the device (`keep_on_device`), the update runs
//! there, and with `strategy.overlap` the all-gathers and reduce-scatters are queued on NCCL's
//! own stream beside the compute.

use super::*;

impl Fsdp {
    /// The reduce-scatters queued on NCCL's stream that finished (`all`: every one, waiting)
    /// added to their shards' gradients, oldest first.
    pub(super) fn collect_device(&mut self, all: bool) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        while let Some(&(_, _, started)) = self.dev_inflight.front() {
            let Some(ops) = self.comm.device_ops() else {
                break;
            };
            if !all && !ops.is_done(started) {
                break;
            }
            ops.wait(started)?;
            if let Some((i, [send, shard], _)) = self.dev_inflight.pop_front() {
                drop(send);
                add_device_shard(&mut self.dev_grads[i], shard)
                    .map_err(|e| device_error(rank, OpKind::ReduceScatter, e))?;
            }
        }
        Ok(())
    }

    /// Forgets the device shards: the host copy is the truth again.
    /// Waits for everything queued on NCCL's stream before its buffers go (a failure there is
    /// the collective's: it shows at its next op, and an aborted communicator returns at once).
    pub(super) fn settle_device_queue(&mut self) {
        let last = self
            .dev_ahead
            .iter()
            .map(|q| q.2)
            .chain(self.dev_inflight.iter().map(|q| q.2))
            .max_by_key(|s| s.ticket);
        if let (Some(last), Some(ops)) = (last, self.comm.device_ops()) {
            let _ = ops.wait(last);
        }
        self.dev_ahead.clear();
        self.dev_inflight.clear();
    }

    pub(super) fn reset_device(&mut self) {
        self.settle_device_queue();
        self.dev.clear();
        self.dev_grads.clear();
        self.stale = Stale::default();
        self.device_whole = None;
        // gathers and reductions of the state being replaced
        self.ahead.clear();
        self.ready.iter_mut().for_each(|p| *p = None);
        self.inflight = InFlight::default();
        self.backward_lr = None;
        self.stepped.iter_mut().for_each(|d| *d = false);
        self.stepped_non_finite = false;
    }

    /// All-gathers unit `i` from the device shards into a new device buffer like `proto`
    /// (unpadded): with one rank its shard is the unit; over NCCL on the device; otherwise
    /// host-staged (the shard read to the host, the unit written back).
    pub(super) fn gather_from_device(
        &mut self,
        i: usize,
        proto: &dyn DeviceTensor,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
        let rank = self.comm.rank();
        let world = self.comm.world();
        let err = |e: String| device_error(rank, OpKind::AllGather, e);
        let (len, padded) = (self.units[i].len, self.units[i].padded_len(world));
        if world == 1 {
            return Ok(self.dev[i].slice(0..len));
        }
        if self.comm.device_ops().is_some() {
            let send = self.dev[i].raw().map_err(err)?;
            return self.nccl_gather(send, i, proto);
        }
        let shard = self.dev[i].params().map_err(err)?;
        let mut out = vec![0f32; padded];
        self.comm.all_gather(&shard, &mut out)?;
        out.truncate(len);
        crate::params::transfers::record(crate::params::Moved::ParamsToDevice, len);
        proto.upload(&out).map_err(err)
    }

    /// The device path of `update`: the shards' gradients clipped by their global norm, then
    /// each shard's optimizer step, on the device.
    pub(super) fn update_on_device(
        &mut self,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        let rank = self.comm.rank();
        let err = |e| device_error(rank, OpKind::Update, e);
        let mut grads = Vec::with_capacity(self.units.len());
        for (i, u) in self.units.iter().enumerate() {
            // a unit that got no gradient this step (none can: every unit is in a stage)
            // steps with zeros
            grads.push(match self.dev_grads[i].take() {
                Some(g) => g,
                None => self.dev[i].slice(0..0).zeros(u.shard_len).map_err(err)?,
            });
        }
        for (p, u) in self.pending.iter_mut().zip(&self.units) {
            p.take(u.len);
        }
        let coef = match clip {
            Some(max_norm) => {
                let mut sq = [0.0f64];
                for g in &grads {
                    sq[0] += g.sum_squares().map_err(err)?;
                }
                self.comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
                crate::params::clip_coef(sq[0].sqrt(), max_norm)
            }
            None => None,
        };
        for (d, g) in self.dev.iter_mut().zip(&mut grads) {
            d.step_scaled(g.as_mut(), lr, coef).map_err(err)?;
        }
        self.stale = Stale {
            params: true,
            state: true,
        };
        // whole parameters an evaluation gathered are of the parameters this update replaced
        self.whole = None;
        Ok(())
    }

    /// All-gathers unit `i` into a new device buffer like `proto` (unpadded).
    pub(super) fn gather_unit_device(
        &mut self,
        i: usize,
        proto: &dyn DeviceTensor,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
        let rank = self.comm.rank();
        let err = |e: String| device_error(rank, OpKind::AllGather, e);
        crate::params::transfers::record(
            crate::params::Moved::ParamsToDevice,
            self.units[i].shard_len,
        );
        let mut send = proto.upload(&self.shards[i]).map_err(err)?;
        let send_raw = send.raw().map_err(err)?;
        let gathered = self.nccl_gather(send_raw, i, proto);
        drop(send);
        gathered
    }

    /// All-gathers unit `i` over the device collective from this rank's shard at `send` (alive
    /// until this returns) into a new device buffer like `proto` (unpadded).
    pub(super) fn nccl_gather(
        &mut self,
        send: crate::params::RawBuf,
        i: usize,
        proto: &dyn DeviceTensor,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
        let rank = self.comm.rank();
        let err = |e: String| device_error(rank, OpKind::AllGather, e);
        let u = &self.units[i];
        let (len, padded) = (u.len, u.padded_len(self.comm.world()));
        let mut recv = proto.zeros(padded).map_err(err)?;
        let recv_raw = recv.raw().map_err(err)?;
        match self.comm.device_ops() {
            Some(ops) => ops.all_gather_raw(send, recv_raw)?,
            None => return Err(err("no device collective".into())),
        }
        Ok(recv.slice(0..len))
    }

    /// Fsdp unit `i` of the device shards, gathered host-staged: from a gather `prefetch`
    /// started beside the compute (written to the device), or now.
    pub(super) fn unit_params_device_staged(
        &mut self,
        i: usize,
        proto: &dyn DeviceTensor,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError> {
        match self.take_ahead(i)? {
            Some(p) => {
                crate::params::transfers::record(crate::params::Moved::ParamsToDevice, p.len());
                let rank = self.comm.rank();
                proto
                    .upload(&p)
                    .map(Some)
                    .map_err(|e| device_error(rank, OpKind::AllGather, e))
            }
            None => Ok(Some(self.gather_from_device(i, proto)?)),
        }
    }
}

/// Adds a micro-step's reduced shard on the device into the step's (the first one is it).
pub(super) fn add_device_shard(
    acc: &mut Option<Box<dyn DeviceTensor>>,
    mut shard: Box<dyn DeviceTensor>,
) -> Result<(), String> {
    match acc {
        Some(acc) => acc.add_at(0, shard.as_mut()),
        slot => {
            *slot = Some(shard);
            Ok(())
        }
    }
}
