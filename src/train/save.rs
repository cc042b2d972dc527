//! Checkpoints of a run: when one is due (`[checkpoint]`'s cadence, the best so far, the step
//! early stopping or a stop request ends at) and how every rank writes its part of it.

use super::events::{TrainError, TrainInput};
use crate::checkpoint::{
    encode_files, CheckpointDir, CheckpointError, DataPosition, LossScaleState, OptimizerInfo,
    RngState, SchedulerInfo, State, WatchState, FORMAT,
};
use crate::config::Config;
use crate::strategy::Strategy;

/// Whether checkpoint `done` is written: `[checkpoint]`'s step cadence, its epoch cadence
/// (`entered`: the epoch this step ended in, when it is a new one), the end, a new best, and the
/// step early stopping or a stop request ends the run at (without it a resume would go back to
/// an older checkpoint and train what the run decided not to).
pub(super) fn due(
    c: &Config,
    done: usize,
    entered: Option<u64>,
    is_last: bool,
    ends_here: bool,
    new_best: bool,
) -> bool {
    let ck = &c.checkpoint;
    let epoch_boundary =
        entered.is_some_and(|e| ck.every_epochs > 0 && e % ck.every_epochs as u64 == 0);
    (ck.every_steps > 0 && done % ck.every_steps == 0)
        || epoch_boundary
        || (is_last && ck.at_end)
        || ends_here
        || new_best
}

/// Writes checkpoint `step`: rank 0 opens it, every rank writes its files, rank 0 commits.
#[allow(clippy::too_many_arguments)]
pub(super) fn save_checkpoint(
    input: &TrainInput<'_>,
    strategy: &mut dyn Strategy,
    store: &CheckpointDir,
    step: usize,
    position: DataPosition,
    loss: f64,
    lr: f64,
    [early_stopping, best]: [Option<WatchState>; 2],
    loss_scale: Option<LossScaleState>,
) -> Result<(), TrainError> {
    let c = input.config;
    let rank = strategy.rank();
    if rank == 0 {
        store.begin(step as u64)?;
    }
    strategy.barrier()?;
    let snap = strategy.snapshot()?;
    // never a checkpoint of NaN or infinite parameters (an optimizer step that overflowed):
    // every rank checks its part, and all agree before anything is written
    let mut bad = [snap.data.as_ref().map_or(0.0, |(p, _)| {
        f64::from(u8::from(!crate::params::all_finite(p)))
    })];
    strategy.sum(&mut bad)?;
    if bad[0] > 0.0 {
        return Err(TrainError::Diverged {
            step,
            cause: format!("the parameters have NaN or infinite values (the loss is {loss})"),
        });
    }
    if let Some((params, opt)) = &snap.data {
        let files = encode_files(
            &snap.layout,
            rank,
            &input.model.layout().specs(),
            params,
            opt,
        )
        .map_err(|why| CheckpointError::Invalid {
            path: store.dir.clone(),
            why,
        })?;
        for (name, bytes) in &files {
            store.write_file(step as u64, name, bytes)?;
        }
    }
    strategy.barrier()?;
    if rank == 0 {
        let state = State {
            format: FORMAT.to_string(),
            step,
            position,
            accum_position: 0,
            rng: RngState {
                init_seed: c.experiment.seed,
                dropout_seed: c.experiment.seed,
                sampler_seed: c.sampler.seed,
                data_seed: c.data.seed,
            },
            world_size: input.plan.world_size,
            strategy: crate::config::choice_name(&c.strategy.kind),
            micro_batch: input.plan.micro_batch,
            grad_accum_steps: input.plan.accum,
            num_params: input.model.num_params(),
            input_shape: input.data.input_shape(),
            params: snap.layout.clone(),
            optimizer: OptimizerInfo {
                kind: crate::config::choice_name(&c.optim.kind),
                steps: step as u64,
            },
            scheduler: SchedulerInfo {
                kind: crate::config::choice_name(&c.schedule.kind),
                last_step: step,
                last_lr: lr,
            },
            last_loss: loss,
            config_hash: crate::config::config_hash(c),
            kiln_version: env!("CARGO_PKG_VERSION").to_string(),
            early_stopping,
            best,
            loss_scale,
        };
        store.commit(
            step as u64,
            &state,
            c.checkpoint.keep_last,
            c.checkpoint.keep_every as u64,
        )?;
    }
    strategy.barrier()?;
    Ok(())
}
