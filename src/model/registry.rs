//! The registry: `model.kind` -> the builder of that family's `Model`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use super::api::{ModelError, SharedModel};
use super::cnn::Cnn;
use super::engine::FamilyModel;
use super::gpt::{Gpt, GptKeys};
use super::llama::{Llama, LlamaKeys};
use super::mlp::Mlp;
use crate::config::{closest, ConfigError, Resolved};

/// Builds a model from the resolved config (its `[model]` section, with every value's source
/// for errors) and the shape of one input sample.
pub type Builder =
    Box<dyn Fn(&Resolved, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync>;

/// A family's own `[model]` keys, a serde struct it reads with `Resolved::model_keys`: their
/// names (for errors and the configuration reference) and a check that reads them, run before the
/// builder (by `kiln check` and by a sweep for every trial up front).
pub struct FamilyKeys {
    names: Vec<String>,
    read: Box<ReadKeys>,
}

/// Reads a family's keys from a resolved config, to check them.
type ReadKeys = dyn Fn(&Resolved) -> Result<(), ConfigError> + Send + Sync;

impl FamilyKeys {
    /// The keys of `T` (`#[serde(deny_unknown_fields)]`, so that they can be listed).
    pub fn of<T: serde::de::DeserializeOwned + 'static>() -> Self {
        FamilyKeys {
            names: crate::config::struct_keys::<T>(),
            read: Box::new(|r: &Resolved| r.model_keys::<T>().map(|_| ())),
        }
    }
}

/// Which `[model]` keys beyond the shared ones a family reads.
enum Keys {
    /// None: any other key is an error before its builder runs.
    Shared,
    /// Its own, listed (kiln's gpt; a user's family registered with `register_with_keys`).
    Listed(FamilyKeys),
    /// Its own, read by its builder (a user's family registered with `register`).
    Unlisted,
}

/// Model families by name.
pub struct Registry {
    builders: BTreeMap<String, (Builder, Keys)>,
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
            r.builders.insert(kind.to_string(), (b, Keys::Shared));
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
        r.register_with_keys::<GptKeys>("gpt", |r, input| {
            Ok(Arc::new(FamilyModel::new(Gpt::for_input(r, input)?)))
        });
        // Llama, Mistral, Qwen2; Qwen3, Gemma 3, Phi-3 and Mixtral: one family's block
        for (kind, _) in crate::model::llama::Arch::ALL {
            r.register_with_keys::<LlamaKeys>(kind, |r, input| {
                Ok(Arc::new(FamilyModel::new(Llama::for_input(r, input)?)))
            });
        }
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
            .insert(kind.to_string(), (Box::new(builder), Keys::Unlisted));
    }

    /// `register` for a family whose own keys are serde struct `T` (with
    /// `#[serde(deny_unknown_fields)]`): they are read before the builder runs, by `kiln check`
    /// and by a sweep for every trial up front, and a key of `T` set for another family is an
    /// error naming this one.
    pub fn register_with_keys<T: serde::de::DeserializeOwned + 'static>(
        &mut self,
        kind: &str,
        builder: impl Fn(&Resolved, &[usize]) -> Result<SharedModel, ModelError> + Send + Sync + 'static,
    ) {
        self.builders.insert(
            kind.to_string(),
            (Box::new(builder), Keys::Listed(FamilyKeys::of::<T>())),
        );
    }

    /// Every family's listed keys of its own, `(kind, key)`.
    pub fn family_keys(&self) -> Vec<(&str, &str)> {
        self.builders
            .iter()
            .filter_map(|(kind, (_, keys))| match keys {
                Keys::Listed(k) => Some((kind.as_str(), &k.names)),
                _ => None,
            })
            .flat_map(|(kind, names)| names.iter().map(move |n| (kind, n.as_str())))
            .collect()
    }

    /// The registered names, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.builders.keys().map(String::as_str).collect()
    }

    /// The builder `model.kind` names. An unknown kind is an error about `model.kind` that
    /// names its source and the closest registered name.
    fn builder(&self, r: &Resolved) -> Result<&Builder, ModelError> {
        let kind = r.config.model.kind.as_str();
        if let Some((b, keys)) = self.builders.get(kind) {
            match keys {
                Keys::Shared => {
                    let owners = self.family_keys();
                    // (a key every llama-family kind reads is named as gpt's or llama's)
                    r.no_extra_model_keys_but(|k| {
                        owners
                            .iter()
                            .filter(|(_, n)| *n == k)
                            .min_by_key(|(kind, _)| !matches!(*kind, "gpt" | "llama"))
                            .map(|(kind, _)| kind.to_string())
                    })?
                }
                Keys::Listed(k) => (k.read)(r)?,
                Keys::Unlisted => {}
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
        let model = super::freeze::frozen(r, model)?;
        model.check()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration reference (docs/src/configuration.md) against the schema: `[model]`'s
    /// shared keys and the built-in families' own (gpt's `GptKeys`, llama's `LlamaKeys`).
    #[test]
    fn the_configuration_reference_is_the_schema() {
        let keys: Vec<String> = Registry::builtin()
            .family_keys()
            .into_iter()
            .map(|(_, k)| k.to_string())
            .collect();
        assert!(keys.contains(&"layers".to_string()), "{keys:?}");
        crate::config::reference::check(&keys);
    }
}
