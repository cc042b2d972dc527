//! Checks that span sections (a section's own checks are its `check`, beside its struct).

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// A week at most for every wait: longer means a stuck job, and huge numbers overflow clocks.
pub(super) fn waits(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    for (key, v) in [
        ("strategy.timeout_secs", c.strategy.timeout_secs),
        (
            "launch.rendezvous_timeout_secs",
            c.launch.rendezvous_timeout_secs,
        ),
        ("launch.heartbeat_secs", c.launch.heartbeat_secs),
    ] {
        if v > 604_800 {
            return Err(r.range_error(
                key,
                format!("`{key}` = {v} is out of range: at most 604800 (a week)"),
                None,
            ));
        }
    }
    Ok(())
}

/// `profile.ranks` among the job's ranks.
pub(super) fn profile_ranks(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    let world = super::Mesh::of(c).world;
    if let Some(bad) = c.profile.ranks.iter().find(|&&rk| rk >= world) {
        return Err(r.key_error(
            "profile.ranks",
            format!("`profile.ranks` names rank {bad}, but the job has {world} ranks (0..{world})"),
            Some(
                "list ranks below strategy.devices x launch.nnodes, or leave it empty for all"
                    .into(),
            ),
        ));
    }
    Ok(())
}

/// `strategy.shard_size`: fsdp's, and a divisor of the world size.
pub(super) fn shard_size(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    let st = &c.strategy;
    let Some(size) = st.shard_size else {
        return Ok(());
    };
    let key = "strategy.shard_size";
    if st.kind != StrategyKind::Fsdp || st.sharding == Sharding::None {
        return Err(r.key_error(
            key,
            format!(
                "`strategy.shard_size` groups fsdp's shards, but the run has no shards (`strategy.kind` = \"{}\"{})",
                choice_name(&st.kind),
                if st.kind == StrategyKind::Fsdp { ", `strategy.sharding` = \"none\"" } else { "" }
            ),
            Some("remove it, or use `strategy.kind = \"fsdp\"` with sharding".into()),
        ));
    }
    let (devices, nnodes) = (st.devices.count(), c.launch.nnodes.max(1));
    let mesh = super::Mesh::of(c);
    let (world, s) = (mesh.world, mesh.group);
    // (no devices: `strategy.devices`'s own check says so)
    if s == 0 {
        return Ok(());
    }
    if world % s != 0 {
        let given = match size {
            ShardSize::Ranks(n) => n.to_string(),
            ShardSize::Node => format!("\"node\" ({s})"),
        };
        return Err(r.key_error(
            key,
            format!(
                "`strategy.shard_size` = {given} does not divide the {world} ranks (strategy.devices {devices} x launch.nnodes {nnodes}): the shard groups must be equal"
            ),
            Some(format!(
                "use a divisor of {world} (e.g. {}), or \"node\"",
                (1..world).rev().find(|d| world % d == 0 && *d <= s).unwrap_or(1)
            )),
        ));
    }
    Ok(())
}

/// The model's classes are the data's.
pub(super) fn classes(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    if c.data.classes != c.model.classes {
        return Err(r.key_error(
            "model.classes",
            format!(
                "`model.classes` = {} does not match `data.classes` = {}",
                c.model.classes, c.data.classes
            ),
            Some("set both to the number of classes in the data".into()),
        ));
    }

    Ok(())
}

/// Sizes whose products must not wrap (a global batch of 0, a model of 0 bytes).
pub(super) fn sizes(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    const MAX_SIZE: usize = 1 << 30;
    for (key, v) in [
        ("train.batch_size", c.train.batch_size),
        ("train.grad_accum_steps", c.train.grad_accum_steps),
        ("strategy.devices", c.strategy.devices.count()),
        ("launch.nnodes", c.launch.nnodes),
        ("data.samples", c.data.samples),
        ("data.eval_samples", c.data.eval_samples),
        ("data.features", c.data.features),
        ("model.input_size", c.model.input_size),
        ("model.classes", c.model.classes),
    ] {
        if v > MAX_SIZE {
            return Err(r.range_error(
                key,
                format!("`{key}` = {v} is out of range: at most {MAX_SIZE}"),
                None,
            ));
        }
    }
    let global = [
        c.train.batch_size,
        c.train.grad_accum_steps,
        c.strategy.devices.count(),
        c.launch.nnodes.max(1),
    ]
    .iter()
    .try_fold(1usize, |a, b| a.checked_mul(*b).filter(|v| *v <= MAX_SIZE));
    if global.is_none() {
        return Err(r.key_error(
            "train.batch_size",
            format!(
                "the global batch, train.batch_size {} x train.grad_accum_steps {} x strategy.devices {} x launch.nnodes {}, is more than {MAX_SIZE} samples",
                c.train.batch_size,
                c.train.grad_accum_steps,
                c.strategy.devices.count(),
                c.launch.nnodes
            ),
            Some("lower one of them".into()),
        ));
    }
    Ok(())
}

/// Early stopping and keep-best act at each evaluation: there must be evaluations before the end.
pub(super) fn evaluations(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    // both watch the metric at each evaluation: with none before the end they could not act
    for (key, on) in [
        ("train.early_stopping", c.train.early_stopping.is_some()),
        ("checkpoint.keep_best", c.checkpoint.keep_best.is_some()),
    ] {
        if on && c.train.eval_every == 0 {
            return Err(r.key_error(
                "train.eval_every",
                format!("`{key}` acts at each evaluation, but `train.eval_every` = 0 evaluates only at the end"),
                Some("set train.eval_every to evaluate every N steps".into()),
            ));
        }
    }

    Ok(())
}

/// Ranks on the CPU (or a wgpu adapter), and their math threads, bounded.
pub(super) fn host_ranks(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    let st = &c.strategy;
    // ranks on the CPU (or a wgpu adapter) are threads of this process, each with a replica,
    // its buffers and its thread pool: beyond these, a run takes the machine's memory before
    // it trains
    if c.backend.device.shared_by_ranks() && st.devices.count() > MAX_HOST_RANKS {
        return Err(r.range_error(
            "strategy.devices",
            format!(
                "`strategy.devices` = {} is out of range: at most {MAX_HOST_RANKS} ranks per node on the {}",
                st.devices.count(),
                c.backend.device.noun()
            ),
            Some("CPU ranks share this machine's cores; use launch.nnodes for more ranks, or a few devices".into()),
        ));
    }
    if c.backend.device.shared_by_ranks()
        && st.devices.count().saturating_mul(c.backend.threads.max(1)) > MAX_HOST_THREADS
    {
        return Err(r.key_error(
            "backend.threads",
            format!(
                "`backend.threads` = {} for each of `strategy.devices` = {} ranks is {} math threads, more than {MAX_HOST_THREADS}",
                c.backend.threads,
                st.devices.count(),
                st.devices.count().saturating_mul(c.backend.threads)
            ),
            Some("leave backend.threads 0 to share this machine's cores among the ranks".into()),
        ));
    }
    Ok(())
}

/// Ranks of one node on its devices: NCCL only on CUDA with one rank per GPU, device lists
/// only on CUDA.
pub(super) fn placement(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    let st = &c.strategy;
    let nccl = c.backend.device.has_nccl();
    let wgpu = c.backend.device == Device::Wgpu;
    if wgpu && st.collective == CollectiveKind::Nccl {
        return Err(r.key_error(
            "strategy.collective",
            "`strategy.collective` = \"nccl\" needs CUDA; wgpu has no NCCL".into(),
            Some(
                "wgpu ranks reduce through the host: use `collective = \"host\"` (or \"auto\")"
                    .into(),
            ),
        ));
    }
    if !nccl && st.collective == CollectiveKind::Nccl {
        return Err(r.key_error(
            "strategy.collective",
            "`strategy.collective` = \"nccl\" needs `backend.device` = \"cuda\"".into(),
            Some("CPU ranks use `collective = \"host\"` (or \"auto\")".into()),
        ));
    }
    if !c.backend.device.has_ordinals() && matches!(st.devices, Devices::List(_)) {
        return Err(r.key_error(
            "strategy.devices",
            "`strategy.devices` lists device ordinals, which only CUDA has".into(),
            Some("give CPU runs a count, e.g. `devices = 2`".into()),
        ));
    }
    if let Devices::List(l) = &st.devices {
        let mut seen = l.clone();
        seen.sort_unstable();
        seen.dedup();
        if nccl && seen.len() < l.len() && st.collective == CollectiveKind::Nccl {
            return Err(r.key_error(
                "strategy.collective",
                format!("`strategy.devices` = {l:?} puts two ranks on one GPU, which NCCL refuses (before NCCL 2.30)"),
                Some("set `strategy.collective = \"host\"` (host-staged collectives work for several ranks on one GPU), or give each rank its own GPU".into()),
            ));
        }
    }

    Ok(())
}

/// Several nodes need a strategy that runs in several processes.
pub(super) fn nodes(r: &Resolved) -> Result<(), ConfigError> {
    let (l, st) = (&r.config.launch, &r.config.strategy);
    if l.nnodes > 1 && matches!(st.kind, StrategyKind::Single | StrategyKind::Dp) {
        // blame the value someone set: the node count when the strategy is the default
        let kind_is_default =
            super::describe_source(&r.figment, "strategy.kind") == super::load::DEFAULT_SOURCE;
        return Err(r.key_error(
            if kind_is_default {
                "launch.nnodes"
            } else {
                "strategy.kind"
            },
            format!(
                "`strategy.kind` = \"{}\" runs in one process, but `launch.nnodes` = {}",
                choice_name(&st.kind),
                l.nnodes
            ),
            Some("use `strategy.kind = \"ddp\"` or \"fsdp\" across nodes".into()),
        ));
    }

    Ok(())
}

/// A Slurm job of a CUDA run gets GPUs.
pub(super) fn slurm_gpus(r: &Resolved) -> Result<(), ConfigError> {
    let c = &r.config;
    if c.slurm.gpus_per_node == Some(0) && c.backend.device.needs_gpus() {
        return Err(r.key_error(
            "slurm.gpus_per_node",
            "`slurm.gpus_per_node` = 0 with backend.device = \"cuda\": the job would get no GPU"
                .into(),
            Some("leave it unset (strategy.devices GPUs per node) or give the GPUs".into()),
        ));
    }
    Ok(())
}

/// An mlp on synthetic feature rows takes as many inputs as the rows have features.
pub(super) fn features(r: &Resolved) -> Result<(), ConfigError> {
    let (d, m) = (&r.config.data, &r.config.model);
    let rows = d.kind == DataKind::Synthetic && d.vocab.is_none() && d.image.is_empty();
    if rows && m.kind == "mlp" && d.features != m.input_size {
        return Err(r.key_error(
            "model.input_size",
            format!(
                "`model.input_size` = {} does not match `data.features` = {}",
                m.input_size, d.features
            ),
            Some("set both to the same number of features".into()),
        ));
    }
    Ok(())
}

/// The cosine schedule's floor lies in [0, optim.lr].
pub(super) fn schedule_floor(r: &Resolved) -> Result<(), ConfigError> {
    let (s, o) = (&r.config.schedule, &r.config.optim);
    in_range(
        r,
        "schedule.min_lr",
        s.min_lr,
        s.min_lr >= 0.0 && s.min_lr <= o.lr,
        "in [0, optim.lr]",
    )
}
