//! LoRA (issue 62): low-rank adapters beside a family's Linear layers, as PEFT's `LoraConfig`
//! makes them. An adapter is two bias-free Linears, A (`in -> rank`) and B (`rank -> out`),
//! and the adapted layer computes `W x + b + (alpha / rank) B A dropout(x)`. The adapters are
//! parameters of the module like any other (kiln's llama keeps each block's in the block, after
//! its own parameters, so the block's initial values are the unadapted model's); every other
//! parameter is frozen (`freeze::frozen`), so only the adapters get gradients and optimizer
//! state.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::api::{Forward, Model, ModelError};
use super::portable::{FamilyFormat, WeightFormat};
use crate::config::Resolved;

/// PEFT's adapter directory (`PeftModel.save_pretrained`): `adapter_model.safetensors` with the
/// adapters under the Hugging Face names of the base model prefixed `base_model.model.`, and
/// `adapter_config.json` (`adapter_config`). A format of a model with adapters only.
pub const PEFT: WeightFormat = WeightFormat::Family(FamilyFormat {
    name: "peft",
    dir: true,
    renames: &[("base_model.model.", "")],
});

/// The `adapter_config.json` of `model`'s adapters (`spec`), as PEFT writes it for a causal
/// language model; `base` is the model the adapters go on (`model.init_from`), when known.
/// With `language_model` (a vision-language base: its language model's modules, as
/// `hf_json::language_model_modules` says), `target_modules` is the pattern of the adapted
/// modules under it (PEFT matches a string in full), so the vision tower's modules of the
/// same names get none.
pub fn adapter_config(
    model: &dyn Model,
    spec: &LoraSpec,
    base: Option<&str>,
    language_model: Option<&str>,
) -> String {
    let targets = match language_model {
        Some(prefix) => serde_json::json!(modules_pattern(prefix, &spec.targets)),
        None => serde_json::json!(spec.targets),
    };
    let v = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": targets,
        "bias": "none",
        // GPT-2's Conv1D weights are [in, out]
        "fan_in_fan_out": model.kind() == "gpt",
        "modules_to_save": null,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "layers_to_transform": null,
        "layers_pattern": null,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": true,
        "revision": null
    });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// PEFT's `target_modules` pattern of the modules `targets` under `prefix` (a vision-language
/// base's language model): `model\.language_model\..*\.(q_proj|v_proj)`, matched in full.
pub fn modules_pattern(prefix: &str, targets: &[String]) -> String {
    format!("{}.*\\.({})", prefix.replace('.', "\\."), targets.join("|"))
}

/// One adapter: `lora_a` (Burn's Linear, weight `[in, rank]`: PEFT's `lora_A.weight`
/// `[rank, in]` transposed) and `lora_b` (`[rank, out]`: PEFT's `lora_B.weight` `[out, rank]`).
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    pub lora_a: Linear<B>,
    pub lora_b: Linear<B>,
}

/// The adapters a family builds and runs with (`[model.lora]` with `rank` > 0, its targets
/// resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSpec {
    pub rank: usize,
    pub alpha: f64,
    pub dropout: f64,
    /// The module names adapted, each a name of the family's.
    pub targets: Vec<String>,
}

/// Whether kiln path `name` is an adapter's parameter.
pub fn is_adapter(name: &str) -> bool {
    name.split('.').any(|p| p == "lora_a" || p == "lora_b")
}

impl LoraSpec {
    /// `[model.lora]` of `r` for a family whose adaptable modules are `names`, PEFT's default
    /// targets for it being `default`: `None` without the table or with `rank = 0`. A target
    /// the family does not have is an error naming the key and the family's names.
    pub fn of(
        r: &Resolved,
        names: &[&str],
        default: &[&str],
    ) -> Result<Option<LoraSpec>, ModelError> {
        let Some(c) = &r.config.model.lora else {
            return Ok(None);
        };
        let asked: Vec<String> = match &c.targets {
            Some(t) => t.clone(),
            None => default.iter().map(|s| s.to_string()).collect(),
        };
        if asked.is_empty() {
            return Err(r
                .key_error(
                    "model.lora.targets",
                    "`model.lora.targets` is empty: no layer would be adapted".into(),
                    Some(format!(
                        "name modules of this model: {}, or \"all-linear\"",
                        names.join(", ")
                    )),
                )
                .into());
        }
        let mut targets = Vec::new();
        for (i, t) in asked.iter().enumerate() {
            if t == "all-linear" {
                targets.extend(names.iter().map(|s| s.to_string()));
                continue;
            }
            if !names.contains(&t.as_str()) {
                let hint = crate::config::closest(t, names)
                    .map(|n| format!("did you mean \"{n}\"? "))
                    .unwrap_or_default();
                return Err(r
                    .key_error(
                        "model.lora.targets",
                        format!(
                            "`model.lora.targets[{i}]` = {:?} is no module of this {} model",
                            crate::ui::printable(t),
                            r.config.model.kind
                        ),
                        Some(format!(
                            "{hint}its layers' modules: {}, or \"all-linear\" for all of them",
                            names.join(", ")
                        )),
                    )
                    .into());
            }
            targets.push(t.clone());
        }
        targets.sort_by_key(|t| names.iter().position(|n| n == t));
        targets.dedup();
        if c.rank == 0 {
            // (off: its targets were still checked, and an adapter to start from is an error)
            if c.init_from.is_some() {
                return Err(r
                    .key_error(
                        "model.lora.init_from",
                        "`model.lora.init_from` is set but `model.lora.rank` = 0 turns LoRA off"
                            .into(),
                        Some(
                            "set `model.lora.rank` to the adapter's `r`, or leave init_from out"
                                .into(),
                        ),
                    )
                    .into());
            }
            return Ok(None);
        }
        Ok(Some(LoraSpec {
            rank: c.rank,
            alpha: c.alpha,
            dropout: c.dropout,
            targets,
        }))
    }

    /// The adapter's scale, `alpha / rank` (PEFT's `scaling` without rsLoRA).
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    pub fn targets(&self, name: &str) -> bool {
        self.targets.iter().any(|t| t == name)
    }

    /// The adapters' parameters over `layers` (`(name, in, out)` of one block's adaptable
    /// modules): `rank * (in + out)` for each targeted one.
    pub fn params_per_block(&self, layers: &[(&str, usize, usize)]) -> u128 {
        layers
            .iter()
            .filter(|(n, _, _)| self.targets(n))
            .map(|&(_, i, o)| (self.rank * (i + o)) as u128)
            .sum()
    }

    /// That `rank` fits every adapted layer (`(name, in, out)` of each): at most its smaller
    /// dimension.
    pub fn check(&self, r: &Resolved, layers: &[(&str, usize, usize)]) -> Result<(), ModelError> {
        let targeted = || layers.iter().filter(|(n, _, _)| self.targets(n));
        let most = targeted().map(|&(_, i, o)| i.min(o)).min().unwrap_or(0);
        for &(name, d_in, d_out) in targeted() {
            if self.rank > d_in.min(d_out) {
                return Err(r
                    .range_error(
                        "model.lora.rank",
                        format!(
                            "`model.lora.rank` = {} is larger than {name}'s dimensions ({d_in} -> {d_out})",
                            self.rank
                        ),
                        Some(format!(
                            "a rank of at most {most} for these targets (the smallest dimension of a targeted layer)"
                        )),
                    )
                    .into());
            }
        }
        Ok(())
    }

    /// An adapter for the Linear `d_in -> d_out` named `name`, when it is a target.
    pub fn build<B: Backend>(
        &self,
        name: &str,
        d_in: usize,
        d_out: usize,
        device: &B::Device,
    ) -> Option<Lora<B>> {
        self.targets(name).then(|| Lora {
            lora_a: LinearConfig::new(d_in, self.rank)
                .with_bias(false)
                .init(device),
            lora_b: LinearConfig::new(self.rank, d_out)
                .with_bias(false)
                .init(device),
        })
    }
}

/// PEFT's initial values of an adapter parameter `name` of `shape` (Burn's) into `out`, or
/// false when `name` is none: A Kaiming-uniform with a = sqrt(5) (torch's Linear default:
/// U(-1/sqrt(in), 1/sqrt(in))) from a stream of its own (keyed by `seed` and its name: the
/// adapters' values never depend on the base's: a base from `model.init_from` gets them
/// without a second initialisation of the whole model), B zero.
pub fn init(name: &str, shape: &[usize], out: &mut [f32], seed: u64) -> bool {
    let module = name.rsplit('.').nth(1).unwrap_or("");
    match module {
        "lora_a" => {
            let fan_in = shape.first().copied().unwrap_or(1).max(1);
            let mut rng = super::init::named_stream(seed, &format!("lora/{name}"));
            super::init::uniform(&mut rng, out, 1.0 / (fan_in as f64).sqrt());
            true
        }
        "lora_b" => {
            out.fill(0.0);
            true
        }
        _ => false,
    }
}

/// `l(x)` plus `residual`, plus the adapter's `scale * B A dropout(x)` when `lora` is there
/// (the adapter's product enters the base gemm as its residual input).
pub fn adapted<B: Backend, const D: usize>(
    l: &Linear<B>,
    lora: Option<(&Lora<B>, &LoraSpec)>,
    x: Tensor<B, D>,
    residual: Option<Tensor<B, D>>,
    fused: bool,
    ctx: &mut Forward,
) -> Tensor<B, D> {
    let residual = match lora {
        None => residual,
        Some((ad, spec)) => {
            let h = ctx.dropout(x.clone(), spec.dropout);
            let h = super::gpt::dense(&ad.lora_a, h, None, fused);
            let z = super::gpt::dense(&ad.lora_b, h, None, fused).mul_scalar(spec.scale());
            Some(match residual {
                Some(r) => r + z,
                None => z,
            })
        }
    };
    super::gpt::dense(l, x, residual, fused)
}
