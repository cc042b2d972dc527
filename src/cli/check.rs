//! `kiln check`: validates everything a run would check (config, data, backend, plan) and prints
//! the resolved config with the source of each value. Writes nothing.

use super::ConfigArgs;
use crate::{config, launch, Result};

pub fn check(a: &ConfigArgs) -> Result<()> {
    let r = a.resolve()?;
    let report = launch::check(&r)?;
    crate::outln!(
        "# {} resolved: each value is followed by its source",
        a.file.display()
    );
    crate::ui::out_raw(&config::annotated(&r));
    crate::outln!();
    for n in r.notes() {
        crate::outln!("# {n}");
    }
    crate::outln!("# {}", report.plan.describe());
    if !report.frozen.is_empty() {
        let p = &report.plan;
        crate::outln!(
            "# frozen: {} parameters in {} tensors (no gradient, no optimizer state); trainable: {}",
            p.num_params - p.trainable_params,
            report.frozen.len(),
            p.trainable_params
        );
        for name in &report.frozen {
            crate::outln!("#   {}", crate::ui::printable(name));
        }
    }
    if let Some(line) = &report.data {
        crate::outln!("# {line}");
    }
    for m in &report.memory {
        crate::outln!(
            "# memory at rest, rank {}: params {}, grads {}, optimizer state {}",
            m.rank,
            crate::ui::bytes(m.params_bytes as u64),
            crate::ui::bytes(m.grads_bytes as u64),
            crate::ui::bytes(m.optim_bytes as u64)
        );
    }
    crate::outln!(
        "# while a step computes, each rank also holds {} for what its stages install ({} stages{})",
        crate::ui::bytes(report.step_bytes as u64),
        report.stages,
        if r.config.train.activation_checkpointing == config::ActivationCheckpointing::Units {
            ", one at a time: activation checkpointing"
        } else {
            ", each kept for the backward"
        }
    );
    let c = &r.config;
    if c.optim.weight_decay != 0.0 {
        crate::outln!(
            "# weight decay {} (optim.decay = \"{}\"): {} parameters decayed, {} not",
            c.optim.weight_decay,
            config::choice_name(&report.decay),
            report.decayed,
            report.undecayed
        );
    }
    if c.strategy.kind == config::StrategyKind::Fsdp
        && c.strategy.sharding == config::Sharding::Full
        && c.train.activation_checkpointing == config::ActivationCheckpointing::None
    {
        crate::outln!("# note: fsdp with sharding = \"full\" keeps every gathered unit alive until its backward unless train.activation_checkpointing = \"units\" (the recompute frees each unit after its forward)");
    }
    if let Some(note) = &report.placement.note {
        crate::outln!("# {note}");
    }
    crate::outln!(
        "# backend: {} with {}; config hash {}",
        report.placement.backend.name(),
        crate::backend::cpu_split(&r.config),
        r.canonical_hash()
    );
    Ok(())
}
