//! A model family's own `[model]` keys (`ModelConfig::extra`): read into the family's serde
//! struct with every value's source, listed, and refused for a family that has none.

use figment::value::{Dict, Value};
use figment::{Figment, Metadata};

use super::error::{closest, ConfigError, KeyError, KeyErrorKind};
use super::load::{describe_source, key_error, nest, Layer, Resolved, DEFAULT_SOURCE};

impl Resolved {
    /// The `[model]` keys kiln does not know (`ModelConfig::extra`), deserialized into a model
    /// family's own serde struct `T` (use `#[serde(deny_unknown_fields)]`): an unknown key, a
    /// wrong type or a missing key is an error naming `model.<key>` and the file (and line),
    /// variable or flag that set it, as for kiln's own keys.
    pub fn model_keys<T: serde::de::DeserializeOwned>(&self) -> Result<T, ConfigError> {
        let mut figment = Figment::new().merge(Layer {
            meta: Metadata::named(DEFAULT_SOURCE),
            dict: nest(&["model".into()], Value::from(Dict::new())),
        });
        for (k, v) in &self.config.model.extra {
            let key = format!("model.{k}");
            let meta = self
                .figment
                .find_metadata(&key)
                .cloned()
                .unwrap_or_else(|| Metadata::named(DEFAULT_SOURCE));
            let value = Value::serialize(v).unwrap_or_else(|_| Value::from(v.to_string()));
            figment = figment.merge(Layer {
                meta,
                dict: nest(&["model".into(), k.clone()], value),
            });
        }
        #[derive(serde::Deserialize)]
        struct Section<T> {
            model: T,
        }
        figment
            .extract::<Section<T>>()
            .map(|s| s.model)
            .map_err(|e| {
                let unknown = matches!(e.kind, figment::error::Kind::UnknownField(..));
                let mut ke = key_error(&figment, e);
                if unknown {
                    // the closest of every key [model] takes: the shared ones and `T`'s
                    let mut names = super::ModelConfig::known_keys();
                    names.extend(struct_keys::<T>());
                    let field = ke.key.trim_start_matches("model.");
                    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                    ke.help = Some(match closest(field, &refs) {
                        Some(c) => format!("did you mean `model.{c}`?"),
                        None => format!("valid keys in [model]: {}", names.join(", ")),
                    });
                }
                ConfigError::Key(ke)
            })
    }

    /// For a family that has no keys of its own: the first unknown `[model]` key is an error
    /// naming its source and the closest of kiln's keys; `owner` names the family a key
    /// belongs to, if one does (`model.layers` in an mlp: gpt's).
    pub fn no_extra_model_keys_but(
        &self,
        owner: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        match self.config.model.extra.keys().next() {
            Some(k) if owner(k).is_some() => {
                let key = format!("model.{k}");
                let kind = &self.config.model.kind;
                Err(ConfigError::Key(KeyError {
                    kind: KeyErrorKind::Other,
                    key: key.clone(),
                    message: format!(
                        "`{key}` is a key of model.kind = \"{}\", not of \"{kind}\"",
                        owner(k).unwrap_or_default()
                    ),
                    source: describe_source(&self.figment, &key),
                    help: Some(format!(
                        "remove it, or set `model.kind = \"{}\"`",
                        owner(k).unwrap_or_default()
                    )),
                }))
            }
            _ => self.no_extra_model_keys(),
        }
    }

    /// For a family that has no keys of its own: the first unknown `[model]` key is an error
    /// naming its source and the closest of kiln's keys.
    pub fn no_extra_model_keys(&self) -> Result<(), ConfigError> {
        match self.config.model.extra.keys().next() {
            None => Ok(()),
            Some(k) => {
                let key = format!("model.{k}");
                let known = super::ModelConfig::known_keys();
                let names: Vec<&str> = known.iter().map(String::as_str).collect();
                let help = match closest(k, &names) {
                    Some(c) => format!("did you mean `model.{c}`?"),
                    None => format!("valid keys in [model]: {}", names.join(", ")),
                };
                Err(ConfigError::Key(KeyError {
                    kind: KeyErrorKind::Other,
                    key: key.clone(),
                    message: format!("unknown key `{key}`"),
                    source: describe_source(&self.figment, &key),
                    help: Some(help),
                }))
            }
        }
    }
}

/// The keys serde struct `T` reads (one with `#[serde(deny_unknown_fields)]`: the names its
/// "unknown field" error lists; none for a struct that takes any key).
pub fn struct_keys<T: serde::de::DeserializeOwned>() -> Vec<String> {
    let probe = Figment::new().merge(Layer {
        meta: Metadata::named(DEFAULT_SOURCE),
        dict: nest(&["__kiln_probe__".into()], Value::from(1)),
    });
    match probe.extract::<T>() {
        Err(e) => e
            .into_iter()
            .find_map(|e| match e.kind {
                figment::error::Kind::UnknownField(_, expected) => {
                    Some(expected.iter().map(|k| k.to_string()).collect())
                }
                _ => None,
            })
            .unwrap_or_default(),
        Ok(_) => Vec::new(),
    }
}
