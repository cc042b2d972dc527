//! Where a rank's training starts: the parameters handed to its strategy (a checkpoint's,
//! `model.init_from`'s or the seeded initialisation), the step and data position it goes on
//! from, and the step it ends at.

use super::events::{TrainError, TrainInput};
use super::loader::Pos;
use crate::checkpoint::State;
use crate::config::Config;
use crate::plan::Plan;
use crate::strategy::Strategy;

/// Where a checkpoint's data position continues: exactly (same world, batch and strategy) or by
/// the global cursor.
fn resume_pos(plan: &Plan, c: &Config, s: &State) -> Pos {
    let p = s.position;
    let same = s.world_size == plan.world_size
        && s.micro_batch == plan.micro_batch
        && s.strategy == crate::config::choice_name(&c.strategy.kind);
    if same {
        Pos {
            epoch: p.epoch,
            start: p.segment_start,
            j: p.segment_micro,
        }
    } else {
        Pos {
            epoch: p.epoch,
            start: p.cursor,
            j: 0,
        }
    }
    .normalize(plan)
}

/// Steps the run ends at, from step `step` at position `pos`.
pub(super) fn total_steps(c: &Config, plan: &Plan, step: usize, pos: Pos) -> usize {
    if let Some(m) = c.train.max_steps {
        return m;
    }
    let epochs = c.train.epochs as u64;
    let remaining = if pos.epoch < epochs {
        (plan.segment_micro(pos.start) - pos.j)
            + (epochs - pos.epoch - 1) as usize * plan.micro_per_epoch
    } else {
        0
    };
    step + remaining.div_ceil(plan.accum)
}

/// The rank's parameters (and optimizer state) given to the strategy, and the step and data
/// position the run goes on from: a checkpoint's, `model.init_from`'s parameters at step 0, or
/// the seeded initialisation (once for the process's ranks).
pub(super) fn start_from(
    input: &TrainInput<'_>,
    strategy: &mut dyn Strategy,
) -> Result<(usize, Pos), TrainError> {
    let (c, plan, model) = (input.config, input.plan, input.model);
    Ok(match input.resume {
        Some(l) => {
            strategy.init(&l.params)?;
            strategy.load_optimizer(&l.opt);
            (l.state.step, resume_pos(plan, c, &l.state))
        }
        None => {
            match input.init {
                Some(p) => strategy.init(p)?,
                None => {
                    // one seeded initialisation for the process's ranks, freed once they
                    // took it
                    let init = input.shared_init.get(|| model.init(c.experiment.seed));
                    strategy.init(&init)?;
                }
            }
            (
                0,
                Pos {
                    epoch: 0,
                    start: 0,
                    j: 0,
                },
            )
        }
    })
}
