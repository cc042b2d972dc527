//! `kiln check`'s work: everything a run checks before it writes anything (config, backend
//! placement, data, model, plan), and what the run would hold in memory. Writes nothing.

use crate::backend::{self, Placement};
use crate::config::Resolved;
use crate::data;
use crate::error::Result;
use crate::plan::Plan;
use crate::strategy::{self, Memory};

/// What `kiln check` reports about a resolved config.
#[derive(Debug)]
pub struct CheckReport {
    pub placement: Placement,
    pub plan: Plan,
    /// Bytes each rank would hold at rest.
    pub memory: Vec<Memory>,
    /// Math threads per rank.
    pub threads: usize,
}

/// Checks `r` the way a run would, without writing anything.
pub fn check(r: &Resolved) -> Result<CheckReport> {
    let placement = backend::resolve(&r.config)?;
    let d = data::load(r)?;
    let model = crate::model::build(r, &d.input_shape())?;
    super::weights::init_weights(r, model.as_ref())?;
    let plan = Plan::new(&r.config, d.train.len(), model.num_params());
    let memory = strategy::estimate(&r.config, model.layout(), plan.world_size);
    let threads = backend::threads(&r.config.backend, r.config.strategy.devices.count());
    Ok(CheckReport {
        placement,
        plan,
        memory,
        threads,
    })
}
