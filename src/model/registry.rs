//! The registry: `model.kind` -> the builder of that family's `Model`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

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
    /// Each family's builder, and whether it reads `[model]` keys of its own (else any key
    /// kiln does not know is an error before its builder runs).
    builders: BTreeMap<String, (Builder, bool)>,
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
        let own = |r: &mut Registry, kind: &str, b: Builder| {
            r.builders.insert(kind.to_string(), (b, false));
        };
        own(
            &mut r,
            "mlp",
            Box::new(|r, input| Ok(Arc::new(FamilyModel::new(Mlp::for_input(r, input)?)))),
        );
        own(
            &mut r,
            "cnn",
            Box::new(|r, input| Ok(Arc::new(FamilyModel::new(Cnn::for_input(r, input)?)))),
        );
        own(
            &mut r,
            "gpt",
            Box::new(|r, input| Ok(Arc::new(FamilyModel::new(Gpt::for_input(r, input)?)))),
        );
        r
    }

    /// Adds (or replaces) the family `kind`. Its builder gets the resolved config and the
    /// shape of one input sample; it reads its own `[model]` keys with
    /// `Resolved::model_keys::<YourKeys>()` and returns `FamilyModel::new(your_family)`.
    pub fn register(
        &mut self,
        kind: &str,
        builder: impl Fn(&Resolved, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync + 'static,
    ) {
        self.builders
            .insert(kind.to_string(), (Box::new(builder), true));
    }

    /// The registered names, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.builders.keys().map(String::as_str).collect()
    }

    /// The builder `model.kind` names. An unknown kind is an error about `model.kind` that
    /// names its source and the closest registered name.
    fn builder(&self, r: &Resolved) -> Result<&Builder, ModelError> {
        let kind = r.config.model.kind.as_str();
        if let Some((b, own_keys)) = self.builders.get(kind) {
            if !own_keys {
                r.no_extra_model_keys()?;
            }
            return Ok(b);
        }
        Err({
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
        let model = self.builder(r)?(r, input)?;
        model.check()?;
        model.use_fused_kernels(r.config.backend.fused);
        Ok(model)
    }
}

/// The registry of this process: the one `install`ed (by `kiln::cli::main_with`), else the
/// built-in families.
static PROCESS: OnceLock<Registry> = OnceLock::new();

/// Makes `registry` the one this process builds models from. Only the first call counts (it
/// returns false for later ones); call it before anything is built.
pub fn install(registry: Registry) -> bool {
    PROCESS.set(registry).is_ok()
}

/// The registry this process builds models from.
pub fn registry() -> &'static Registry {
    PROCESS.get_or_init(Registry::builtin)
}

/// The model that `[model]` of `r` describes, for samples of shape `input`, from this process's
/// registry.
pub fn build(r: &Resolved, input: &[usize]) -> Result<SharedModel, ModelError> {
    registry().build(r, input)
}
