//! What a session needs before it changes any file, made once per process (twice only when a
//! resumed checkpoint's seeds replace the config's): the backend placement, the data, the
//! model and its plan, with the weights of `model.init_from` for a fresh run; then checked
//! (`check`: watched metrics, memory) and the checkpoint a resumed run continues from, checked
//! against all of them (`load_checkpoint`). A node of a multi-node job prepares before the
//! rendezvous (bad data or weights stop it before it claims a directory) and trains on what it
//! prepared.

use std::path::Path;

use super::resume::Resumption;
use crate::backend::{self, Placement};
use crate::checkpoint::Loaded;
use crate::config::{self, Config, Resolved};
use crate::data::{self, Data};
use crate::error::{Error, Result};
use crate::model::SharedModel;
use crate::plan::Plan;
use crate::ui;

/// A session's inputs, checked.
pub(super) struct Prepared {
    pub placement: Placement,
    pub data: Data,
    pub model: SharedModel,
    pub plan: Plan,
    /// `model.init_from`'s weights (`None`: the seeded initialisation). A resumed run continues
    /// from its checkpoint instead and never reads the file.
    pub init: Option<Vec<f32>>,
}

impl Prepared {
    /// Resolves the backend, loads the data, builds the model and its plan, and (unless
    /// `resuming`) reads `model.init_from`.
    pub fn new(r: &Resolved, resuming: bool) -> Result<Prepared> {
        let c = &r.config;
        let placement = backend::resolve(c)?;
        let data = data::load(r)?;
        let model = crate::model::build(r, &data.input_shape())?;
        let plan = Plan::new(c, data.train.len(), model.num_params())
            .with_trainable(model.layout().num_trainable());
        let init = if resuming {
            None
        } else {
            super::init_from::init_weights(r, model.as_ref())?
        };
        Ok(Prepared {
            placement,
            data,
            model,
            plan,
            init,
        })
    }

    /// The metrics the run watches exist for its task and data, and its state fits in memory.
    /// (In a multi-node job these run after the rendezvous, where a node that fails them
    /// stops the others at once.)
    pub fn check(&self, r: &Resolved) -> Result<()> {
        let (c, model) = (&r.config, &self.model);
        super::check::watched_metrics(r, model.task(), self.data.eval.is_some())?;
        super::check::fits(
            r,
            &crate::strategy::estimate(c, model.layout(), self.plan.world_size),
            model.as_ref(),
        )
    }

    /// The checkpoint `resume` continues from (none for a fresh run, or a resumed job whose
    /// first round saved none), checked against the model and the data; optimizer state of
    /// another family is dropped with a warning.
    pub fn load_checkpoint(
        &self,
        c: &Config,
        resume: Option<&Resumption>,
    ) -> Result<Option<Loaded>> {
        let Some((path, state)) = resume.and_then(|res| res.from.as_ref()) else {
            return Ok(None);
        };
        let model = &self.model;
        if state.num_params != model.num_params() {
            return Err(Error::Usage(format!(
                "the checkpoint has {} parameters but the model has {}; the model config changed",
                state.num_params,
                model.num_params()
            )));
        }
        let mut l =
            crate::checkpoint::load(path, &model.layout().specs()).map_err(Error::Checkpoint)?;
        check_position(c, &self.plan, &l.state, path)?;
        // optimizer state of another kind (sgd momentum vs Adam moments) would be misread
        let kind = config::choice_name(&c.optim.kind);
        let family = |k: &str| if k.starts_with("adam") { "adam" } else { "sgd" };
        if family(&l.state.optimizer.kind) != family(&kind) {
            ui::note(&format!(
                "warning: the checkpoint's optimizer is {} but optim.kind is {kind}: its state is dropped and {kind} starts fresh",
                l.state.optimizer.kind
            ));
            l.opt = crate::checkpoint::OptState::default();
        }
        Ok(Some(l))
    }
}

/// The data position of a checkpoint against the data it resumes on: a cursor past the
/// training samples, or more micro-batches into a segment than it has, is no run's (it would
/// skip an epoch silently).
fn check_position(
    c: &Config,
    plan: &Plan,
    s: &crate::checkpoint::State,
    path: &Path,
) -> Result<()> {
    let p = &s.position;
    let n = plan.train_samples;
    let same = s.world_size == plan.world_size
        && s.micro_batch == plan.micro_batch
        && s.strategy == config::choice_name(&c.strategy.kind);
    let why = if p.cursor > n || p.segment_start > n || p.segment_start > p.cursor {
        Some(format!(
            "`position` (cursor {}, segment_start {}) is not within the {n} training samples",
            p.cursor, p.segment_start
        ))
    } else if same && p.segment_micro > plan.segment_micro(p.segment_start) {
        Some(format!(
            "`position.segment_micro` = {} is past the {} micro-batches of its segment",
            p.segment_micro,
            plan.segment_micro(p.segment_start)
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(Error::Checkpoint(
            crate::checkpoint::CheckpointError::Invalid {
                path: path.to_path_buf(),
                why: format!("state.json: {why}"),
            },
        )),
        None => Ok(()),
    }
}
