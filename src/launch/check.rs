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
    /// What the run reads, where a line says more than the plan (`Data::describe`).
    pub data: Option<String>,
    /// Bytes each rank would hold at rest.
    pub memory: Vec<Memory>,
    /// Bytes a rank holds on top while a step computes (`strategy::step_bytes`).
    pub step_bytes: usize,
    /// Stages of the model's forward.
    pub stages: usize,
    /// Math threads per rank.
    pub threads: usize,
    /// Which parameters weight decay applies to (`optim.decay`, or the family's default), and
    /// how many it applies to and spares.
    pub decay: crate::config::DecayRule,
    pub decayed: usize,
    pub undecayed: usize,
    /// The frozen parameters' names (`model.freeze`), as the freeze globs match them.
    pub frozen: Vec<String>,
}

/// What to change when a CPU run does not fit: the ranks of one node share its memory, so more
/// devices there never help; sharding does when several ranks hold a replica each, and more
/// nodes do for fsdp.
fn fit_advice(
    kind: crate::config::StrategyKind,
    sharding: crate::config::Sharding,
    local: usize,
) -> String {
    use crate::config::StrategyKind;
    let shard = match kind {
        StrategyKind::Ddp | StrategyKind::Dp if local > 1 => format!(
            "use strategy.kind = \"fsdp\" (its {local} ranks here then hold one copy of the model state between them, not one each)"
        ),
        StrategyKind::Fsdp if sharding == crate::config::Sharding::None => format!(
            "set strategy.sharding = \"full\" (without sharding fsdp is ddp: each of its {local} ranks holds a whole copy of the model state)"
        ),
        StrategyKind::Fsdp => "run fsdp over more nodes (launch.nnodes; the ranks of one machine share its memory, so more devices here do not help)".into(),
        _ => "use strategy.kind = \"fsdp\" over several nodes (launch.nnodes; the ranks of one machine share its memory, so more devices here do not help)".into(),
    };
    format!("shrink [model] (model.hidden_sizes, ...), {shard}, or a machine with more memory")
}

/// A CPU run's ranks on this node hold their parameters, gradients and optimizer state, and
/// while a step computes what its stages install (`strategy::step_bytes`), plus one whole copy
/// of the parameters to start from, in the machine's memory: exit 2, before anything is
/// allocated, when that is more than it has available.
pub fn fits(
    r: &Resolved,
    memory: &[crate::strategy::Memory],
    model: &dyn crate::model::Model,
) -> Result<()> {
    let num_params = model.num_params();
    let step = strategy::step_bytes(&r.config, model.layout(), model.stages()) as u128;
    let c = &r.config;
    if !c.backend.device.on_host() {
        return Ok(());
    }
    let local = c.strategy.devices.count();
    let node = c.launch.node_rank;
    let need = memory
        .iter()
        .skip(node * local)
        .take(local)
        .map(|m| {
            (m.params_bytes as u128) + (m.grads_bytes as u128) + (m.optim_bytes as u128) + step
        })
        .sum::<u128>()
        + num_params as u128 * 4;
    let Some(have) = crate::memory::available() else {
        return Ok(());
    };
    if need > have as u128 {
        return Err(crate::error::Error::Usage(format!(
            "the model does not fit: its {} on this node need {} ({need} bytes: parameters, gradients and optimizer state, and what a step's stages install), but the machine has {} available\n  = help: {}",
            if local == 1 { "1 rank".to_string() } else { format!("{local} ranks") },
            crate::ui::bytes(need.min(u64::MAX as u128) as u64),
            crate::ui::bytes(have),
            fit_advice(c.strategy.kind, c.strategy.sharding, local)
        )));
    }
    Ok(())
}

/// The metrics that `train.early_stopping` and `checkpoint.keep_best` watch exist for this
/// model and data: evaluation data is there, and the metric fits the task (accuracy for a
/// classifier, perplexity for a language model).
pub fn watched_metrics(r: &Resolved, task: crate::model::Task, has_eval: bool) -> Result<()> {
    use crate::config::EvalMetric;
    let c = &r.config;
    let watched = [
        (
            "train.early_stopping.metric",
            c.train.early_stopping.as_ref().map(|e| e.metric),
        ),
        (
            "checkpoint.keep_best.metric",
            c.checkpoint.keep_best.as_ref().map(|b| b.metric),
        ),
    ];
    for (key, metric) in watched {
        let Some(metric) = metric else { continue };
        if !has_eval {
            return Err(r
                .key_error(
                    key,
                    format!(
                        "`{key}` = \"{}\" needs evaluation data, and this experiment has none",
                        metric.name()
                    ),
                    Some(
                        "set data.eval_path (csv, idx, text) or data.eval_samples (synthetic)"
                            .into(),
                    ),
                )
                .into());
        }
        let lm = matches!(task, crate::model::Task::LanguageModel { .. });
        let fits = match metric {
            EvalMetric::EvalLoss => true,
            EvalMetric::EvalAccuracy => !lm,
            EvalMetric::EvalPerplexity => lm,
        };
        if !fits {
            let (what, other) = if lm {
                ("a language model", "eval_perplexity")
            } else {
                ("a classifier", "eval_accuracy")
            };
            return Err(r
                .key_error(
                    key,
                    format!("`{key}` = \"{}\" is not measured for {what}", metric.name()),
                    Some(format!("use \"eval_loss\" or \"{other}\"")),
                )
                .into());
        }
    }
    Ok(())
}

/// An asha sweep's `sweep.metric` is one its trials report: asha ranks by it at every rung,
/// and a metric no trial has would rank them all alike, in trial order (issue 58, defect 4).
pub fn sweep_metric(r: &Resolved, task: crate::model::Task, has_eval: bool) -> Result<()> {
    let c = &r.config;
    if c.sweep.scheduler != crate::config::SweepScheduler::Asha {
        return Ok(());
    }
    let metric = c.sweep.metric.as_str();
    let lm = matches!(task, crate::model::Task::LanguageModel { .. });
    let what = if lm {
        "a language model"
    } else {
        "a classifier"
    };
    let eval = if lm {
        "eval_perplexity"
    } else {
        "eval_accuracy"
    };
    let missing = match metric {
        "eval_loss" | "eval_accuracy" | "eval_perplexity" if !has_eval => Some(format!(
            "no trial reports it: this experiment has no evaluation data, so {what} reports \
             final_loss and no eval_* metric"
        )),
        "eval_accuracy" if lm => Some(format!(
            "no trial reports it: {what} reports eval_loss and {eval}"
        )),
        "eval_perplexity" if !lm => Some(format!(
            "no trial reports it: {what} reports eval_loss and {eval}"
        )),
        "tokens_per_sec" if !lm => Some(format!(
            "no trial reports it: {what} reports samples_per_sec"
        )),
        "mfu" if c.backend.device != crate::config::Device::Cuda => {
            Some("no trial reports it: mfu is measured against a GPU's peak, on CUDA only".into())
        }
        _ => None,
    };
    let Some(why) = missing else { return Ok(()) };
    let help = if has_eval {
        format!("rank by \"eval_loss\" or \"{eval}\"")
    } else {
        "rank by \"final_loss\", or add evaluation data (data.eval_path, or data.eval_samples for synthetic data) and set train.eval_every".into()
    };
    Err(r
        .key_error(
            "sweep.metric",
            format!("asha ranks trials by `sweep.metric` = \"{metric}\", but {why}"),
            Some(help),
        )
        .into())
}

/// What an asha sweep checks before any trial runs, on one trial's config: its data and model
/// (not its weights) and that they report `sweep.metric`.
pub fn check_sweep_metric(r: &Resolved) -> Result<()> {
    let d = data::load(r)?;
    let model = crate::model::build(r, &d.input_shape())?;
    sweep_metric(r, model.task(), d.eval.is_some())
}

/// Checks `r` the way a run would, without writing anything.
pub fn check(r: &Resolved) -> Result<CheckReport> {
    let placement = backend::resolve(&r.config)?;
    let d = data::load(r)?;
    let model = crate::model::build(r, &d.input_shape())?;
    watched_metrics(r, model.task(), d.eval.is_some())?;
    sweep_metric(r, model.task(), d.eval.is_some())?;
    super::init_from::init_weights(r, model.as_ref())?;
    let plan = Plan::new(&r.config, d.train.len(), model.num_params())
        .with_trainable(model.layout().num_trainable());
    let memory = strategy::estimate(&r.config, model.layout(), plan.world_size);
    fits(r, &memory, model.as_ref())?;
    let step_bytes = strategy::step_bytes(&r.config, model.layout(), model.stages());
    let threads = backend::threads(
        &r.config.backend,
        r.config.strategy.devices.count(),
        r.config.data.workers,
    );
    let decay = model.decay_rule(&r.config.optim);
    // (of the parameters that train)
    let layout = model.layout();
    let undecayed: usize = crate::strategy::within(&layout.no_decay(decay), layout.trainable())
        .iter()
        .map(|r| r.len())
        .sum();
    let names = crate::model::freeze_names(model.as_ref());
    let frozen = layout
        .params
        .iter()
        .zip(names)
        .filter(|(p, _)| p.offset < layout.frozen)
        .flat_map(|(_, n)| n)
        .collect();
    Ok(CheckReport {
        placement,
        plan,
        data: d.describe(),
        memory,
        step_bytes,
        stages: model.stages().len(),
        threads,
        decay,
        decayed: layout.num_trainable() - undecayed,
        undecayed,
        frozen,
    })
}

#[cfg(test)]
mod fit_tests {
    use super::fit_advice;
    use crate::config::{Sharding, StrategyKind};

    /// Issue 31: the advice fits the strategy; more devices on one CPU host is never it.
    #[test]
    fn the_fit_advice_never_suggests_more_devices_on_one_host() {
        let ddp = fit_advice(StrategyKind::Ddp, Sharding::Full, 4);
        assert!(
            ddp.contains("strategy.kind = \"fsdp\" (its 4 ranks here"),
            "{ddp}"
        );
        for (kind, local) in [
            (StrategyKind::Fsdp, 4),
            (StrategyKind::Single, 1),
            (StrategyKind::Ddp, 1),
        ] {
            let a = fit_advice(kind, Sharding::Full, local);
            assert!(a.contains("launch.nnodes"), "{kind:?}: {a}");
            assert!(!a.contains("more devices or"), "{kind:?}: {a}");
        }
        // fsdp without sharding is ddp: sharding helps, more nodes of whole copies do not
        let none = fit_advice(StrategyKind::Fsdp, Sharding::None, 4);
        assert!(none.contains("strategy.sharding = \"full\""), "{none}");
    }
}
