//! One micro-step, unit by unit: the one place that decides what happens when. The model runs
//! stage by stage (`Compute::stages`: the embeddings, each block or layer, the head); the
//! strategy is asked for a stage's unit parameters just before the stage computes (fsdp gathers
//! them, and the stage drops them when it is done), and is handed each unit's gradient as soon
//! as the backward of the unit's last use is done (ddp all-reduces it, fsdp reduce-scatters it
//! and keeps its shard). Forward, in stage order:
//!
//! ```text
//! prefetch(0)
//! for s in 0..n:   params(s) -> prefetch(s+1) -> forward(s) -> (drop params unless s keeps
//!                  its graph)
//! for s in n-1..0: params(s) again if s is recomputed or resharded -> prefetch(s-1) if it
//!                  is -> backward(s)
//!                  -> strategy.unit_grads(the units of s whose last use this was)
//! ```
//!
//! `prefetch` and `unit_grads` start communication that, with `strategy.overlap`, runs on the
//! rank's communication thread while the next stage computes: fsdp's next all-gather, ddp's
//! all-reduce and fsdp's reduce-scatter of the units just finished. Each is one op per stage
//! (a stage's units travel together). The strategy waits for it where it needs the result
//! (the next `params`, the update).
//!
//! A rank without samples in this micro-step runs the same gathers and hands in zero gradients,
//! so every rank issues the same collectives in the same order.

use super::events::TrainError;
use super::placement::Placement;
use super::timing::{Clock, Phase};
use crate::collective::{device_error, CollectiveError, OpKind};
use crate::model::{regathered, Compute, ComputeOn, GradScale, Input, StepKey, UnitParams};
use crate::params::transfers::{record, Moved};
use crate::params::{DeviceFlat, DeviceTensor, Grads, RawFn};
use crate::strategy::Strategy;

/// How a micro-step runs.
pub struct MicroOpts<'a, B: ComputeOn> {
    /// `train.activation_checkpointing = "units"`: every stage but the last is recomputed.
    pub checkpointing: bool,
    /// `strategy.reshard_after_forward`: where the strategy gathers each stage's units and the
    /// compute can (`Compute::reshards`), every stage but the last two drops its gathered
    /// parameters after its forward and is handed them again, gathered anew, for its backward.
    pub reshard: bool,
    /// Whether this micro-step's gradients are synchronised (see `Strategy::unit_grad`).
    pub sync: bool,
    /// Where the rank computes and keeps its state: on a device, host parameters handed to it
    /// and gradients read from it are counted as host transfers (`params::transfers`); where
    /// the state lives there, device gathers are made like its `proto` and gradients stay.
    pub placement: &'a Placement<B::InnerBackend>,
    /// f16's dynamic loss scale and `strategy.reduce_dtype` (the micro-batch's weight comes
    /// with its batch).
    pub grads: GradScale,
}

/// Unit `u`'s parameters: on the device when the strategy keeps or gathers them there,
/// otherwise on the host.
pub fn unit_params(
    strategy: &mut dyn Strategy,
    layout: &crate::params::ParamLayout,
    u: usize,
    proto: Option<&dyn DeviceTensor>,
) -> Result<UnitParams, CollectiveError> {
    let range = layout.unit_range(u);
    if let Some(proto) = proto {
        let on_device = strategy.on_device();
        if let Some(d) = on_device
            .map(|d| d.unit_params(u, range.clone(), proto))
            .transpose()?
            .flatten()
        {
            return Ok(UnitParams::Device(d));
        }
    }
    Ok(UnitParams::Host(strategy.unit_params(u, range)?))
}

/// Runs one micro-step on `batch` (`None`: this rank has no samples in it) with its dropout key
/// and gradient scale; returns the unscaled mean loss when there was a batch, with the part of it
/// that is the model's own (`MicroStep::own_loss`).
pub fn micro_step<B: ComputeOn>(
    compute: &dyn Compute<B>,
    strategy: &mut dyn Strategy,
    batch: Option<(Input, StepKey, f64)>,
    opts: &MicroOpts<'_, B>,
    clock: &Clock,
) -> Result<Option<(f64, Option<f64>)>, TrainError> {
    let stages = compute.stages();
    let layout = compute.layout();
    let n = stages.len();
    let rank = strategy.rank();
    let (proto, on_device) = (opts.placement.proto(), opts.placement.on_device());
    let fetch = |strategy: &mut dyn Strategy, s: usize| -> Result<Vec<UnitParams>, TrainError> {
        stages[s]
            .iter()
            .map(|&u| unit_params(strategy, layout, u, proto).map_err(TrainError::from))
            .collect()
    };
    let prefetch = |strategy: &mut dyn Strategy, s: usize| -> Result<(), TrainError> {
        Ok(strategy.prefetch(&stages[s])?)
    };
    // uses of each unit that trains still to come in the backward (a tied unit is used by two
    // stages); a frozen unit's backward computes no gradient of it, and hands none in
    let trains = |u: &&usize| !layout.unit_frozen(**u);
    let mut uses = vec![0usize; layout.num_units()];
    for s in stages {
        for &u in s.iter().filter(trains) {
            uses[u] += 1;
        }
    }
    // the stages whose backward has something to compute: from the first with a unit that
    // trains on (frozen embeddings need no backward, nor do frozen first layers)
    let needed = crate::model::trains_up_to(layout, stages);
    // (every rank decides the same: the strategy, the config and the build decide it)
    let reshard =
        opts.reshard && !opts.checkpointing && strategy.shards_params() && compute.reshards();
    let how = (opts.checkpointing, reshard);
    let mut micro = batch.map(|(input, key, scale)| {
        let grads = GradScale {
            weight: scale,
            ..opts.grads
        };
        compute.micro(input, key, grads, how)
    });
    // the last recomputed stage's backward comes right after the head's: when the strategy
    // gathers, its parameters are kept from the forward instead of gathered again (torch FSDP2
    // leaves the last module unsharded after its forward the same way)
    let keep = (opts.checkpointing && n >= 2 && strategy.shards_params()).then(|| n - 2);
    let mut kept: Option<Vec<UnitParams>> = None;
    if n > 0 {
        prefetch(strategy, 0)?;
    }
    for s in 0..n {
        let params = fetch(strategy, s)?;
        if s + 1 < n {
            prefetch(strategy, s + 1)?;
        }
        if keep == Some(s) {
            // (on every rank, with samples or not: they all skip the same gather)
            kept = host_copy(&params);
        }
        if let Some(m) = micro.as_mut() {
            count_uploads(&params, on_device);
            clock.time(Phase::Forward, || m.forward(s, params))?;
        }
    }
    let loss = micro.as_ref().map(|m| (m.loss(), m.own_loss()));
    // gradients stay on the device where the update runs there, or NCCL reduces them there;
    // otherwise they go to the host at once, where the strategy reduces and steps
    let raw_fn = opts
        .placement
        .raw_fn()
        .filter(|_| resident(strategy) || strategy.comm_mut().device_ops().is_some());
    let mut pending: Vec<Option<Grads>> = (0..layout.num_units()).map(|_| None).collect();
    for s in (0..n).rev() {
        if !needed[s] {
            // (every rank stops here: the layout decides it)
            break;
        }
        let params = match kept.take_if(|_| keep == Some(s)) {
            Some(p) => Some(p),
            None if regathered(s, n, how) => Some(fetch(strategy, s)?),
            None => None,
        };
        // (the kept stage needs no gather)
        let held = s > 0 && keep == Some(s - 1) && kept.is_some();
        if s > 0 && needed[s - 1] && regathered(s - 1, n, how) && !held {
            prefetch(strategy, s - 1)?;
        }
        let grads: Vec<Grads> = match micro.as_mut() {
            Some(m) => {
                if let Some(p) = &params {
                    count_uploads(p, on_device);
                }
                let tensors = clock.time(Phase::Backward, || m.backward(s, params))?;
                tensors
                    .into_iter()
                    .map(|g| to_grads::<B>(g, raw_fn, on_device, rank))
                    .collect::<Result<_, _>>()?
            }
            // a rank without samples hands in zeros, so every rank runs the same collectives
            None => {
                let units: Vec<usize> = stages[s].iter().filter(trains).copied().collect();
                zero_grads(&units, layout, proto.filter(|_| raw_fn.is_some()), rank)?
            }
        };
        let units: Vec<usize> = stages[s].iter().filter(trains).copied().collect();
        let done = ready(layout, &units, grads, (&mut pending, &mut uses), rank)?;
        if !done.is_empty() {
            strategy.unit_grads(done, opts.sync)?;
        }
    }
    Ok(loss)
}

/// The gradients of `units` (a stage's that train, in stage order) whose last use in the
/// backward this was, with their flat ranges; the others wait in `pending` (`uses`: each unit's
/// uses still to come).
#[allow(clippy::type_complexity)]
fn ready(
    layout: &crate::params::ParamLayout,
    units: &[usize],
    grads: Vec<Grads>,
    (pending, uses): (&mut [Option<Grads>], &mut [usize]),
    rank: usize,
) -> Result<Vec<(usize, std::ops::Range<usize>, Grads)>, TrainError> {
    let mut done = Vec::with_capacity(units.len());
    for (&u, g) in units.iter().zip(grads) {
        let g = match pending[u].take() {
            // a tied unit: the later use's gradient (in backward order) is added to the
            // earlier's, always in this order
            Some(mut acc) => {
                acc.add_at(0, g)
                    .map_err(|e| device_error(rank, OpKind::Update, e))?;
                acc
            }
            None => g,
        };
        uses[u] -= 1;
        if uses[u] == 0 {
            done.push((u, layout.unit_range(u), g));
        } else {
            pending[u] = Some(g);
        }
    }
    Ok(done)
}

/// Zero gradients for `units`: on the device (made like `proto`) where the gradients stay
/// there, else on the host.
fn zero_grads(
    units: &[usize],
    layout: &crate::params::ParamLayout,
    proto: Option<&dyn DeviceTensor>,
    rank: usize,
) -> Result<Vec<Grads>, TrainError> {
    let grads = units
        .iter()
        .map(|&u| {
            let len = layout.unit_range(u).len();
            match proto {
                Some(p) => p
                    .zeros(len)
                    .map(Grads::Device)
                    .map_err(|e| device_error(rank, OpKind::Update, e)),
                None => Ok(Grads::Host(vec![0.0; len])),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(grads)
}

/// Whether `strategy` holds this rank's parameters on the device now.
pub(super) fn resident(strategy: &mut dyn Strategy) -> bool {
    strategy.on_device().is_some_and(|d| d.resident())
}

/// Counts the host parameters a device backend is about to upload.
fn count_uploads(params: &[UnitParams], device: bool) {
    if device {
        for p in params {
            if let UnitParams::Host(v) = p {
                record(Moved::ParamsToDevice, v.len());
            }
        }
    }
}

/// A copy of host parameters (`None` when any is on the device).
fn host_copy(params: &[UnitParams]) -> Option<Vec<UnitParams>> {
    params
        .iter()
        .map(|p| match p {
            UnitParams::Host(v) => Some(UnitParams::Host(v.clone())),
            UnitParams::Device(_) => None,
        })
        .collect()
}

/// A unit's gradient from the backend: on the device when the step keeps gradients there
/// (NCCL reduces them in place; otherwise host-staged collectives write back), else read to
/// the host.
fn to_grads<B: ComputeOn>(
    g: burn::tensor::Tensor<B::InnerBackend, 1>,
    raw_fn: Option<RawFn<B::InnerBackend>>,
    device: bool,
    rank: usize,
) -> Result<Grads, TrainError> {
    Ok(match raw_fn {
        Some(f) => Grads::Device(Box::new(DeviceFlat::new(g, f))),
        None if device => {
            let g = Grads::Host(
                g.into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| device_error(rank, OpKind::Update, format!("{e:?}")))?,
            );
            record(Moved::GradsToHost, g.len());
            g
        }
        None => Grads::Host(
            g.into_data()
                .convert::<f32>()
                .into_vec::<f32>()
                .map_err(|e| device_error(rank, OpKind::Update, format!("{e:?}")))?,
        ),
    })
}
