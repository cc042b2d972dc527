//! `kiln check`: validates everything a run would check (config, data, backend, plan) and prints
//! the resolved config with the source of each value. Writes nothing.

use super::ConfigArgs;
use crate::plan::Plan;
use crate::{backend, config, data, strategy, Result};

pub fn check(a: &ConfigArgs) -> Result<()> {
    let r = a.resolve()?;
    let placement = backend::resolve(&r.config)?;
    let be = placement.backend;
    let d = data::load(&r)?;
    let model = crate::model::build(&r.config.model, &d.input_shape())?;
    let plan = Plan::new(&r.config, d.train.len(), model.num_params());
    println!(
        "# {} resolved: each value is followed by its source",
        a.file.display()
    );
    print!("{}", config::annotated(&r));
    println!();
    println!("# {}", plan.describe());
    for m in strategy::estimate(&r.config, model.layout(), plan.world_size) {
        println!(
            "# memory at rest, rank {}: params {} B, grads {} B, optimizer state {} B",
            m.rank, m.params_bytes, m.grads_bytes, m.optim_bytes
        );
    }
    if let Some(note) = &placement.note {
        println!("# {note}");
    }
    println!(
        "# backend: {} with {} threads per rank; config hash {}",
        be.name(),
        backend::threads(&r.config.backend, r.config.strategy.devices.count()),
        config::config_hash(&r.config)
    );
    Ok(())
}
