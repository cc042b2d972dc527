//! Memory by formula: the bytes each rank holds at rest (`estimate`, what `kiln check` prints
//! and the strategies report after training) and on top while a step computes (`step_bytes`).

use super::fsdp;
use super::Memory;
use crate::config::{Config, Mesh, OptimKind, Sharding, StrategyKind};
use crate::params::ParamLayout;

/// Optimizer state elements per parameter element.
fn state_per_param(c: &Config) -> usize {
    match c.optim.kind {
        OptimKind::Sgd if c.optim.momentum > 0.0 => 1,
        OptimKind::Sgd => 0,
        OptimKind::Adam | OptimKind::Adamw => 2,
    }
}

/// The bytes a rank holds on top of its model state while a step computes, from the per-unit
/// figures: the parameters a stage installs and their gradient. With activation checkpointing
/// one stage's at a time; without it every stage keeps its parameters for the backward (its
/// graph holds them), so the whole parameters, plus the largest stage's gradient.
/// (Activations come on top; they depend on the batch.)
pub fn step_bytes(c: &Config, layout: &ParamLayout, stages: &[Vec<usize>]) -> usize {
    let stage_bytes =
        |s: &Vec<usize>| -> usize { s.iter().map(|&u| layout.unit_range(u).len() * 4).sum() };
    let largest = stages.iter().map(stage_bytes).max().unwrap_or(0);
    let whole_model_unit = c.strategy.kind == StrategyKind::Fsdp
        && c.strategy.unit == crate::config::FsdpUnit::Model
        && c.strategy.sharding == Sharding::Full;
    let checkpointing =
        c.train.activation_checkpointing == crate::config::ActivationCheckpointing::Units;
    if checkpointing && !whole_model_unit {
        2 * largest
    } else {
        layout.num_params() * 4 + largest
    }
}

/// The bytes each rank will hold at rest, from the plan alone (`kiln check` prints it; the
/// strategies report the same numbers after training).
pub fn estimate(c: &Config, layout: &ParamLayout, world: usize) -> Vec<Memory> {
    let whole = layout.num_params() * 4;
    // gradients and optimizer state: of the parameters that train
    let n = layout.num_trainable();
    let state = state_per_param(c);
    let mesh = Mesh::over(c, world);
    (0..world)
        .map(|rank| {
            let (params_bytes, grads_bytes, optim_elems) = match c.strategy.kind {
                StrategyKind::Dp => (whole, n * 4, if rank == 0 { n } else { 0 }),
                StrategyKind::Fsdp if mesh.sharded => {
                    // (HSDP: sharded over a group)
                    let group = mesh.hybrid().unwrap_or(world);
                    let units = fsdp::units(layout, c.strategy.unit, group);
                    let shard: usize = units.iter().map(|u| u.shard_len).sum();
                    // (frozen units have no gradient shard and no optimizer state)
                    let trains: usize = units
                        .iter()
                        .filter(|u| u.start >= layout.frozen)
                        .map(|u| u.shard_len)
                        .sum();
                    if c.strategy.sharding == Sharding::Full {
                        (shard * 4, trains * 4, trains)
                    } else {
                        (whole, trains * 4, trains)
                    }
                }
                // single, ddp, and fsdp without sharding (built as ddp)
                _ => (whole, n * 4, n),
            };
            Memory {
                rank,
                params_bytes,
                grads_bytes,
                optim_bytes: optim_elems * state * 4,
                peak_bytes: None,
                host_transfers: None,
            }
        })
        .collect()
}
