//! The registry: `model.kind` -> the builder of that family's `Model`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::api::{ModelError, SharedModel};
use super::engine::FamilyModel;
use super::mlp::Mlp;
use crate::config::ModelConfig;

/// Builds a model from `[model]` and the shape of one input sample.
pub type Builder =
    Box<dyn Fn(&ModelConfig, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync>;

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
        r.register("mlp", |c, _input| {
            Ok(Arc::new(FamilyModel::new(Mlp::new(c))))
        });
        r
    }

    /// Adds (or replaces) the family `kind`.
    pub fn register(
        &mut self,
        kind: &str,
        builder: impl Fn(&ModelConfig, &[usize]) -> Result<SharedModel, ModelError>
            + Send
            + Sync
            + 'static,
    ) {
        self.builders.insert(kind.to_string(), Box::new(builder));
    }

    /// The registered names, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.builders.keys().map(String::as_str).collect()
    }

    /// The model `kind` for `[model]` and samples of shape `input`.
    pub fn build(
        &self,
        kind: &str,
        c: &ModelConfig,
        input: &[usize],
    ) -> Result<SharedModel, ModelError> {
        match self.builders.get(kind) {
            Some(b) => b(c, input),
            None => Err(ModelError::Build {
                kind: kind.to_string(),
                reason: format!(
                    "no such model family; registered: {}",
                    self.kinds().join(", ")
                ),
            }),
        }
    }
}

/// The built-in model `[model]` names, for samples of shape `input`.
pub fn build(c: &ModelConfig, input: &[usize]) -> Result<SharedModel, ModelError> {
    let kind = match c.kind {
        crate::config::ModelKind::Mlp => "mlp",
    };
    Registry::builtin().build(kind, c, input)
}
