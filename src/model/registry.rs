//! The registry: `model.kind` -> the builder of that family's `Model`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::api::{ModelError, SharedModel};
use super::cnn::Cnn;
use super::engine::FamilyModel;
use super::gpt::Gpt;
use super::mlp::Mlp;
use crate::config::{closest, Resolved};

/// Builds a model from the resolved config (its `[model]` section, with every value's source
/// for errors) and the shape of one input sample.
pub type Builder =
    Box<dyn Fn(&Resolved, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync>;

/// Model families by name.
pub struct Registry {
    builders: BTreeMap<String, Builder>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::builtin()
    }
}

impl Registry {
    /// The families kiln ships.
    pub fn builtin() -> Self {
        let mut r = Registry {
            builders: BTreeMap::new(),
        };
        r.register("mlp", |r, input| {
            Ok(Arc::new(FamilyModel::new(Mlp::for_input(r, input)?)))
        });
        r.register("cnn", |r, input| {
            Ok(Arc::new(FamilyModel::new(Cnn::for_input(r, input)?)))
        });
        r.register("gpt", |r, input| {
            Ok(Arc::new(FamilyModel::new(Gpt::for_input(r, input)?)))
        });
        r
    }

    /// Adds (or replaces) the family `kind`.
    pub fn register(
        &mut self,
        kind: &str,
        builder: impl Fn(&Resolved, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync + 'static,
    ) {
        self.builders.insert(kind.to_string(), Box::new(builder));
    }

    /// The registered names, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.builders.keys().map(String::as_str).collect()
    }

    /// The builder `model.kind` names. An unknown kind is an error about `model.kind` that
    /// names its source and the closest registered name.
    fn builder(&self, r: &Resolved) -> Result<&Builder, ModelError> {
        let kind = r.config.model.kind.as_str();
        self.builders.get(kind).ok_or_else(|| {
            let kinds = self.kinds();
            let help = match closest(kind, &kinds) {
                Some(k) => format!("did you mean \"{k}\"? registered: {}", kinds.join(", ")),
                None => format!("registered: {}", kinds.join(", ")),
            };
            r.key_error(
                "model.kind",
                format!("`model.kind` = \"{kind}\" is not a registered model family"),
                Some(help),
            )
            .into()
        })
    }

    /// Checks that `model.kind` is registered (what a sweep checks of every trial up front).
    pub fn check(&self, r: &Resolved) -> Result<(), ModelError> {
        self.builder(r).map(|_| ())
    }

    /// The model `model.kind` names, for samples of shape `input`.
    pub fn build(&self, r: &Resolved, input: &[usize]) -> Result<SharedModel, ModelError> {
        self.builder(r)?(r, input)
    }
}

/// The built-in model that `[model]` of `r` describes, for samples of shape `input`.
pub fn build(r: &Resolved, input: &[usize]) -> Result<SharedModel, ModelError> {
    Registry::builtin().build(r, input)
}
