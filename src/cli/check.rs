//! `kiln check`: validates everything a run would check (config, data, backend, plan) and prints
//! the resolved config with the source of each value. Writes nothing.

use super::ConfigArgs;
use crate::model::Mlp;
use crate::plan::Plan;
use crate::{backend, config, data, Result};

pub fn check(a: &ConfigArgs) -> Result<()> {
    let r = a.resolve()?;
    let be = backend::resolve(&r.config.backend)?;
    let d = data::load(&r)?;
    let mlp = Mlp::new(&r.config.model);
    let plan = Plan::new(&r.config, d.train.len(), mlp.num_params());
    println!("# {} resolved: each value is followed by its source", a.file.display());
    print!("{}", config::annotated(&r));
    println!();
    println!("# {}", plan.describe());
    println!(
        "# backend: {} with {} threads; config hash {}",
        be.name(),
        backend::threads(&r.config.backend, plan.world_size),
        config::config_hash(&r.config)
    );
    Ok(())
}
