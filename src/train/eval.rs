//! Exact evaluation: every sample counted once, whatever the world size. Rank r takes the eval
//! samples r, r + world, ...; the per-sample results are gathered and summed in global index
//! order, so the sums are the same bits for every world size (and `kiln eval` reproduces them).

use super::events::{EvalSums, TrainError};
use crate::collective::CollectiveError;
use crate::data::Dataset;
use crate::model::{Compute, ComputeOn, EvalOut, ModelError, UnitParams};
use crate::params::transfers::{record, Moved};
use crate::strategy::Strategy;

/// Per-sample losses and correctness of `params` on the rows `idx` of `ds`, in batches of
/// `batch`.
pub(super) fn evaluate<B: ComputeOn>(
    compute: &dyn Compute<B>,
    params: &[f32],
    ds: &Dataset,
    idx: &[usize],
    batch: usize,
) -> Result<EvalOut, ModelError> {
    // (a token file's ids are checked as they are read: the first bad one stops the batches)
    let mut failed = None;
    let mut batches = idx
        .chunks(batch.max(1))
        .map_while(|chunk| match ds.batch(chunk) {
            Ok(b) => Some(b.into()),
            Err(e) => {
                failed = Some(e);
                None
            }
        });
    let out = compute.evaluate(params, &mut batches)?;
    if let Some(e) = failed {
        return Err(ModelError::Data(format!("evaluation data: {e}")));
    }
    Ok(out)
}

/// Like `evaluate`, stage by stage with each stage's units from the strategy (fsdp gathers
/// them just before the stage and frees them after; the next stage's gather, or the next
/// batch's first, is started beside the compute), so no rank holds the whole model. Every rank runs `batches` batches
/// (the most any rank has): a rank past its last one takes part in the gathers without
/// computing. The same bits as `evaluate`.
pub(super) fn evaluate_by_units<B: ComputeOn>(
    compute: &dyn Compute<B>,
    strategy: &mut dyn Strategy,
    ds: &Dataset,
    idx: &[usize],
    batch: usize,
    batches: usize,
    placement: &super::placement::Placement<B::InnerBackend>,
) -> Result<EvalOut, TrainError> {
    let proto = placement.proto();
    let (layout, stages) = (compute.layout(), compute.stages());
    let mut out = EvalOut::default();
    let mut chunks = idx.chunks(batch.max(1));
    for b in 0..batches {
        let mut eval = match chunks.next() {
            Some(chunk) => {
                let b = ds
                    .batch(chunk)
                    .map_err(|e| TrainError::Data(format!("evaluation data: {e}")))?;
                Some(compute.eval_batch(b.into()))
            }
            None => None,
        };
        for (s, units) in stages.iter().enumerate() {
            // a stage that no earlier one prefetched is announced just before it is asked for
            if s == 0 && (b == 0 || stages.len() == 1) {
                strategy.prefetch(units)?;
            }
            // where the strategy keeps them (on the device, read in place)
            let params = units
                .iter()
                .map(|&u| super::step::unit_params(strategy, layout, u, proto))
                .collect::<Result<Vec<_>, CollectiveError>>()?;
            // the next stage's units, or the next batch's first stage's (not for a model of
            // one stage: that would be a second whole model)
            let next = stages
                .get(s + 1)
                .or_else(|| (b + 1 < batches && stages.len() > 1).then(|| &stages[0]));
            if let Some(next) = next {
                strategy.prefetch(next)?;
            }
            if let Some(e) = eval.as_mut() {
                if placement.on_device() {
                    for p in &params {
                        if let UnitParams::Host(v) = p {
                            record(Moved::ParamsToDevice, v.len());
                        }
                    }
                }
                e.forward(s, params)?;
            }
        }
        if let Some(e) = eval {
            e.finish(&mut out)?;
        }
    }
    Ok(out)
}

/// Evaluates `params` on `ds` exactly as a run of `world` ranks with micro-batches of `batch`
/// does: rank r's samples r, r + world, ... in its batches, summed in global index order. So
/// the sums are the bits the run logged (`kiln eval`).
pub fn evaluate_like_run<B: ComputeOn>(
    compute: &dyn Compute<B>,
    params: &[f32],
    ds: &Dataset,
    world: usize,
    batch: usize,
) -> Result<EvalSums, ModelError> {
    // ranks past the last sample hold nothing: with more ranks than samples each rank holds one
    // sample either way, so the sums are the same bits
    let world = world.clamp(1, ds.len().max(1));
    let per_rank = (0..world)
        .map(|r| {
            let idx: Vec<usize> = (r..ds.len()).step_by(world).collect();
            evaluate(compute, params, ds, &idx, batch)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(sum_in_global_order(ds.len(), world, |r, p| {
        let out = &per_rank[r];
        (out.losses[p], out.correct[p], out.targets.get(p).copied())
    }))
}

/// The sums of `n` per-sample (loss, correct, targets) results spread over `world` ranks
/// (global index i on rank i % world at position i / world, as `get(rank, position)` gives
/// them), added in global index order: the same bits for every world size. A sample counts
/// once, or (rows of documents) as many times as it has targets.
fn sum_in_global_order(
    n: usize,
    world: usize,
    get: impl Fn(usize, usize) -> (f64, f64, Option<u64>),
) -> EvalSums {
    let mut sums = EvalSums::default();
    for i in 0..n {
        let (loss, correct, targets) = get(i % world, i / world);
        sums.loss_sum += loss;
        sums.correct += correct;
        sums.count += targets.unwrap_or(1);
    }
    sums
}

/// Gathers every rank's per-sample results and sums them in global index order, so the totals
/// are identical for every world size. Rows of documents (`by_tokens`) also send each row's
/// targets: every rank sends the same fields, a rank without rows too.
pub(super) fn reduce_eval(
    strategy: &mut dyn Strategy,
    out: &EvalOut,
    n: usize,
    by_tokens: bool,
) -> Result<EvalSums, TrainError> {
    let world = strategy.world();
    let per = n.div_ceil(world);
    let fields = if by_tokens { 3 } else { 2 };
    let mut mine = vec![f64::NAN; fields * per];
    mine[..out.losses.len()].copy_from_slice(&out.losses);
    mine[per..per + out.correct.len()].copy_from_slice(&out.correct);
    if fields == 3 {
        for (m, &t) in mine[2 * per..].iter_mut().zip(&out.targets) {
            *m = t as f64;
        }
    }
    let all = strategy.gather(&mine)?;
    Ok(sum_in_global_order(n, world, |r, p| {
        let at = r * fields * per;
        let targets = (fields == 3).then(|| all[at + 2 * per + p] as u64);
        (all[at + p], all[at + per + p], targets)
    }))
}
