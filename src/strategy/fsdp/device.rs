//! fsdp's device path: sharding = "full" on a device backend (`DeviceResident::keep`), where each
//! rank's shards and their optimizer state live on the device ([`DeviceShards`]) and the update
//! runs there. Over NCCL the gathers run on the device, and with `strategy.overlap` they and the
//! reduce-scatters are queued on NCCL's own stream beside the compute; over a host collective
//! they are host-staged (the shard read to the host, the unit written back). Host shards over
//! NCCL gather into device buffers too (`gather_host_shard`).

use std::collections::VecDeque;

use super::shards::HostState;
use super::*;

/// A reduce-scatter in flight: the unit, its padded gradient and its shard's buffer.
pub(super) type Scattering = (usize, [Box<dyn DeviceTensor>; 2], Started);

/// The device path's state, made once by `DeviceResident::keep`: while an fsdp has one, the
/// device shards are the truth and `host` a copy brought up to date when asked (`host_copy`).
pub(super) struct DeviceShards {
    /// The host copy of the shards and their optimizer states.
    pub host: HostState,
    /// Per unit: this rank's shard and its optimizer state.
    pub shards: Vec<Box<dyn DeviceParams>>,
    /// Per unit: this rank's shard of the step's reduced gradient.
    pub grads: Vec<Option<Box<dyn DeviceTensor>>>,
    /// What of the host copy lags behind.
    pub stale: Stale,
    /// Over NCCL with `strategy.overlap`: all-gathers `prefetch` queued on NCCL's stream, each
    /// unit's padded buffer (alive until the gather is done), oldest first.
    pub ahead: VecDeque<(usize, Box<dyn DeviceTensor>, Started)>,
    /// ... and reduce-scatters queued as units' backwards ended: the unit, its padded gradient
    /// and its shard's buffer (both alive until done), oldest first.
    pub inflight: VecDeque<Scattering>,
}

/// What of the host copy lags behind the device shards.
#[derive(Default, Clone, Copy)]
pub(super) struct Stale {
    pub params: bool,
    pub state: bool,
}

impl DeviceShards {
    /// The device shards of `host`'s shards and their optimizer states, like `proto`, `host`
    /// kept as their copy; `host` back when the backend's buffers are not f32 (the masters stay
    /// on the host).
    pub fn new(proto: &dyn DeviceTensor, host: HostState) -> Result<DeviceShards, HostState> {
        let Some(shards) = host
            .shards
            .iter()
            .zip(&host.opts)
            .map(|(shard, opt)| proto.device_params(shard, 0, opt))
            .collect::<Option<Vec<_>>>()
        else {
            return Err(host);
        };
        Ok(DeviceShards {
            host,
            grads: shards.iter().map(|_| None).collect(),
            shards,
            stale: Stale::default(),
            ahead: VecDeque::new(),
            inflight: VecDeque::new(),
        })
    }

    /// The host copy, its shards (`with_state`: and their optimizer states) brought up to
    /// date first.
    pub fn host_copy(
        &mut self,
        rank: usize,
        with_state: bool,
    ) -> Result<&HostState, CollectiveError> {
        let err = |e| device_error(rank, OpKind::Update, e);
        if self.stale.params {
            for (shard, d) in self.host.shards.iter_mut().zip(&mut self.shards) {
                *shard = d.params().map_err(err)?;
            }
            self.stale.params = false;
        }
        if with_state && self.stale.state {
            for (opt, d) in self.host.opts.iter_mut().zip(&mut self.shards) {
                opt.import_whole(&d.export().map_err(err)?);
            }
            self.stale.state = false;
        }
        Ok(&self.host)
    }

    /// The reduce-scatters queued on NCCL's stream that finished (`all`: every one, waiting)
    /// added to their shards' gradients, oldest first.
    pub fn collect(&mut self, comm: &mut Overlapped, all: bool) -> Result<(), CollectiveError> {
        let rank = comm.rank();
        while let Some(&(_, _, started)) = self.inflight.front() {
            let Some(ops) = comm.device_ops() else {
                break;
            };
            if !all && !ops.is_done(started) {
                break;
            }
            ops.wait(started)?;
            if let Some((i, [send, shard], _)) = self.inflight.pop_front() {
                drop(send);
                add_device_shard(&mut self.grads[i], shard)
                    .map_err(|e| device_error(rank, OpKind::ReduceScatter, e))?;
            }
        }
        Ok(())
    }

    /// Waits for everything queued on NCCL's stream, then forgets it (a failure there is the
    /// collective's: it shows at its next op, and an aborted communicator returns at once).
    pub fn settle(&mut self, comm: &mut Overlapped) {
        let last = self
            .ahead
            .iter()
            .map(|q| q.2)
            .chain(self.inflight.iter().map(|q| q.2))
            .max_by_key(|s| s.ticket);
        if let (Some(last), Some(ops)) = (last, comm.device_ops()) {
            let _ = ops.wait(last);
        }
        self.ahead.clear();
        self.inflight.clear();
    }

    /// Forgets the gathers `prefetch` queued (of parameters an update replaces, or that the
    /// step never asked for), once they are done: their buffers stay alive until then.
    pub fn drop_ahead(&mut self, comm: &mut Overlapped) -> Result<(), CollectiveError> {
        if let Some(&(_, _, started)) = self.ahead.back() {
            if let Some(ops) = comm.device_ops() {
                ops.wait(started)?;
            }
        }
        self.ahead.clear();
        Ok(())
    }

    /// Queues the all-gather of unit `i` from its device shard on NCCL's stream (once).
    pub fn start_gather(
        &mut self,
        comm: &mut Overlapped,
        u: &Unit,
        i: usize,
    ) -> Result<(), CollectiveError> {
        if self.ahead.iter().any(|(j, _, _)| *j == i) {
            return Ok(());
        }
        let rank = comm.rank();
        let err = |e: String| device_error(rank, OpKind::AllGather, e);
        let padded = u.padded_len(comm.world());
        let send = self.shards[i].raw().map_err(err)?;
        let mut recv = self.shards[i].slice(0..0).zeros(padded).map_err(err)?;
        let recv_raw = recv.raw().map_err(err)?;
        let ops = comm
            .device_ops()
            .ok_or_else(|| err("no device collective".into()))?;
        let started = ops.start(RawOp::AllGather {
            send,
            recv: recv_raw,
        })?;
        self.ahead.push_back((i, recv, started));
        Ok(())
    }

    /// Unit `i` from a gather `start_gather` queued, once it is done (unpadded).
    pub fn take_gathered(
        &mut self,
        comm: &mut Overlapped,
        u: &Unit,
        i: usize,
    ) -> Result<Option<Box<dyn DeviceTensor>>, CollectiveError> {
        let Some(k) = self.ahead.iter().position(|(j, _, _)| *j == i) else {
            return Ok(None);
        };
        if let Some(ops) = comm.device_ops() {
            ops.wait(self.ahead[k].2)?;
        }
        Ok(self
            .ahead
            .remove(k)
            .map(|(_, recv, _)| recv.slice(0..u.len)))
    }

    /// Reduce-scatters (mean) unit `i`'s whole gradient into its shard's gradient: on NCCL's
    /// stream beside the backward with `strategy.overlap`, else now.
    pub fn reduce_scatter(
        &mut self,
        comm: &mut Overlapped,
        u: &Unit,
        i: usize,
        mut grad: Grads,
    ) -> Result<(), CollectiveError> {
        let rank = comm.rank();
        let err = |e: String| device_error(rank, OpKind::ReduceScatter, e);
        if let Grads::Host(v) = &grad {
            // (a unit no micro-step handed a device gradient: its zeros)
            crate::params::transfers::record(crate::params::Moved::GradsToDevice, v.len());
            grad = Grads::Device(self.shards[i].slice(0..0).upload(v).map_err(err)?);
        }
        if let (true, Grads::Device(d)) = (comm.overlaps_on_device(), &grad) {
            let mut send = d
                .padded(0..u.len, u.shard_len * comm.world())
                .map_err(err)?;
            let mut shard = d.zeros(u.shard_len).map_err(err)?;
            let (send_raw, shard_raw) = (send.raw().map_err(err)?, shard.raw().map_err(err)?);
            let ops = comm
                .device_ops()
                .ok_or_else(|| err("no device collective".into()))?;
            let started = ops.start(RawOp::ReduceScatter {
                send: send_raw,
                recv: shard_raw,
                op: ReduceOp::Mean,
            })?;
            self.inflight.push_back((i, [send, shard], started));
            return self.collect(comm, false);
        }
        let shard = grad.reduce_scatter_device(comm, 0..u.len, u.shard_len, ReduceOp::Mean)?;
        drop(grad);
        add_device_shard(&mut self.grads[i], shard).map_err(err)
    }

    /// Adds a host-staged reduction's shard of unit `i` (written back to the device).
    pub fn add_host_shard(
        &mut self,
        rank: usize,
        i: usize,
        shard: &[f32],
    ) -> Result<(), CollectiveError> {
        let err = |e| device_error(rank, OpKind::ReduceScatter, e);
        crate::params::transfers::record(crate::params::Moved::GradsToDevice, shard.len());
        let up = self.shards[i].slice(0..0).upload(shard).map_err(err)?;
        add_device_shard(&mut self.grads[i], up).map_err(err)
    }

    /// Whether a gradient shard of this step has NaN or infinite values.
    pub fn grads_non_finite(&self, rank: usize) -> Result<bool, CollectiveError> {
        for g in self.grads.iter().flatten() {
            if g.non_finite()
                .map_err(|e| device_error(rank, OpKind::Update, e))?
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `update` here: the shards' gradients clipped by their global norm, then each shard's
    /// optimizer step, on the device.
    pub fn update(
        &mut self,
        comm: &mut Overlapped,
        units: &[Unit],
        frozen: usize,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), CollectiveError> {
        let rank = comm.rank();
        let err = |e| device_error(rank, OpKind::Update, e);
        let mut grads = Vec::with_capacity(units.len());
        for (i, u) in units.iter().enumerate() {
            // a unit that got no gradient this step (none can: every unit is in a stage)
            // steps with zeros; a frozen unit (inside the first `frozen` elements) never steps
            grads.push(match self.grads[i].take() {
                _ if u.start < frozen => None,
                Some(g) => Some(g),
                None => Some(self.shards[i].slice(0..0).zeros(u.shard_len).map_err(err)?),
            });
        }
        let coef = match clip {
            Some(max_norm) => {
                let mut sq = [0.0f64];
                for g in grads.iter().flatten() {
                    sq[0] += g.sum_squares().map_err(err)?;
                }
                comm.all_reduce_f64(&mut sq, ReduceOp::Sum)?;
                crate::params::clip_coef(sq[0].sqrt(), max_norm)
            }
            None => None,
        };
        for (d, g) in self.shards.iter_mut().zip(&mut grads) {
            if let Some(g) = g {
                d.step_scaled(g.as_mut(), lr, coef).map_err(err)?;
            }
        }
        self.stale = Stale {
            params: true,
            state: true,
        };
        Ok(())
    }

    /// Unit `i` gathered from the device shards into a new device buffer like `proto`
    /// (unpadded): with one rank its shard is the unit; over NCCL on the device; otherwise
    /// host-staged.
    pub fn gather(
        &mut self,
        comm: &mut Overlapped,
        u: &Unit,
        i: usize,
        proto: &dyn DeviceTensor,
    ) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
        let rank = comm.rank();
        let err = |e: String| device_error(rank, OpKind::AllGather, e);
        if comm.world() == 1 {
            return Ok(self.shards[i].slice(0..u.len));
        }
        if comm.device_ops().is_some() {
            let send = self.shards[i].raw().map_err(err)?;
            return nccl_gather(comm, send, u, proto);
        }
        let shard = self.shards[i].params().map_err(err)?;
        let mut out = vec![0f32; u.padded_len(comm.world())];
        comm.all_gather(&shard, &mut out)?;
        out.truncate(u.len);
        crate::params::transfers::record(crate::params::Moved::ParamsToDevice, u.len);
        proto.upload(&out).map_err(err)
    }

    pub fn state_bytes(&self) -> usize {
        self.shards.iter().map(|d| d.state_bytes()).sum()
    }
}

/// Host shard `shard` of unit `u` all-gathered over NCCL into a new device buffer like `proto`
/// (unpadded): the path of host shards over a device collective.
pub(super) fn gather_host_shard(
    comm: &mut Overlapped,
    shard: &[f32],
    u: &Unit,
    proto: &dyn DeviceTensor,
) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
    let rank = comm.rank();
    let err = |e: String| device_error(rank, OpKind::AllGather, e);
    crate::params::transfers::record(crate::params::Moved::ParamsToDevice, u.shard_len);
    let mut send = proto.upload(shard).map_err(err)?;
    let send_raw = send.raw().map_err(err)?;
    let gathered = nccl_gather(comm, send_raw, u, proto);
    drop(send);
    gathered
}

/// Unit `u` all-gathered over the device collective from this rank's shard at `send` (alive
/// until this returns) into a new device buffer like `proto` (unpadded).
fn nccl_gather(
    comm: &mut Overlapped,
    send: crate::params::RawBuf,
    u: &Unit,
    proto: &dyn DeviceTensor,
) -> Result<Box<dyn DeviceTensor>, CollectiveError> {
    let rank = comm.rank();
    let err = |e: String| device_error(rank, OpKind::AllGather, e);
    let mut recv = proto.zeros(u.padded_len(comm.world())).map_err(err)?;
    let recv_raw = recv.raw().map_err(err)?;
    match comm.device_ops() {
        Some(ops) => ops.all_gather_raw(send, recv_raw)?,
        None => return Err(err("no device collective".into())),
    }
    Ok(recv.slice(0..u.len))
}

/// Adds a micro-step's reduced shard on the device into the step's (the first one is it).
fn add_device_shard(
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
