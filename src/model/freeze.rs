//! `model.freeze`: the parameters that do not train, picked by globs over their names as a
//! user of Hugging Face knows them (the names `kiln export --format hf-*` writes for the gpt and
//! llama families; PyTorch's names, kiln's own, for the others).

use super::api::{Model, ModelError, SharedModel};
use super::lora::is_adapter;
use super::portable::{externals, WeightFormat};
use crate::config::{FsdpUnit, Resolved, Sharding, StrategyKind};

/// The names `model.freeze` matches, per parameter of `model`'s layout: its tensors in the
/// family's Hugging Face format (the first `hf-*` of `WeightAdapter::formats`), else in
/// PyTorch's names. A parameter stored in several tensors has each name.
pub fn freeze_names(model: &dyn Model) -> Vec<Vec<String>> {
    let format = hf_or_torch(model);
    let mut names = vec![Vec::new(); model.layout().params.len()];
    for e in externals(model, format) {
        if !e.alias {
            if let Some(n) = names.get_mut(e.param) {
                n.push(e.name);
            }
        }
    }
    names
}

/// The format whose names `model.freeze` matches: the family's Hugging Face one, else PyTorch's.
fn hf_or_torch(model: &dyn Model) -> WeightFormat {
    model
        .weights()
        .formats()
        .into_iter()
        .find(|f| f.name().starts_with("hf-"))
        .unwrap_or(WeightFormat::PyTorch)
}

/// `model` with the parameters `model.freeze` names frozen (`Model::with_frozen`), and with
/// LoRA (`[model.lora]` with a rank) every parameter but the adapters' (PEFT freezes the base
/// model); `model` itself when nothing is. A glob that is not one, or that matches no
/// parameter, and a list that freezes everything are errors naming `model.freeze`.
pub fn frozen(r: &Resolved, model: SharedModel) -> Result<SharedModel, ModelError> {
    let globs = &r.config.model.freeze;
    let lora = r.config.model.lora.as_ref().is_some_and(|l| l.rank > 0);
    if globs.is_empty() && !lora {
        return Ok(model);
    }
    let names = freeze_names(model.as_ref());
    let mut marks = vec![false; names.len()];
    if lora {
        let params = &model.layout().params;
        if !params.iter().any(|p| is_adapter(&p.name)) {
            return Err(r
                .key_error(
                    "model.lora",
                    format!(
                        "`[model.lora]`: kiln's {} family has no LoRA adapters",
                        model.kind()
                    ),
                    Some("LoRA adapts kiln's llama and gpt; for another model, `model.freeze` trains a part of it".into()),
                )
                .into());
        }
        for (m, p) in marks.iter_mut().zip(params) {
            *m = !is_adapter(&p.name);
        }
    }
    for (i, g) in globs.iter().enumerate() {
        let key = format!("model.freeze[{i}]");
        let pattern = glob::Pattern::new(g).map_err(|e| {
            r.key_error(
                "model.freeze",
                format!("`{key}` = {g:?} is not a glob: {}", e.msg),
                Some(
                    "`*` matches any run of characters (dots too), `?` one, `[abc]` one of a set"
                        .into(),
                ),
            )
        })?;
        let mut hit = false;
        for (mark, ns) in marks.iter_mut().zip(&names) {
            if ns.iter().any(|n| pattern.matches(n)) {
                *mark = true;
                hit = true;
            }
        }
        if !hit {
            // a tied copy (a gpt's `lm_head.weight`) is the tensor it copies
            if let Some(e) = externals(model.as_ref(), hf_or_torch(model.as_ref()))
                .into_iter()
                .find(|e| e.alias && pattern.matches(&e.name))
            {
                let source = names
                    .get(e.param)
                    .and_then(|n| n.first())
                    .cloned()
                    .unwrap_or_default();
                return Err(r
                    .key_error(
                        "model.freeze",
                        format!(
                            "`{key}` = {g:?} names `{}`, a tied copy of `{source}`",
                            e.name
                        ),
                        Some(format!(
                            "freeze `{source}` (the one tensor both names hold)"
                        )),
                    )
                    .into());
            }
            let some: Vec<&str> = names.iter().flatten().map(String::as_str).take(4).collect();
            let naming = match hf_or_torch(model.as_ref()) {
                WeightFormat::PyTorch => "as in PyTorch's state_dict",
                _ => "as in Hugging Face's checkpoints",
            };
            return Err(r
                .key_error(
                    "model.freeze",
                    format!(
                        "`{key}` = {g:?} matches no parameter of this {} model",
                        model.kind()
                    ),
                    Some(format!(
                        "its parameters are named {naming}, e.g. {} ... (`kiln check` lists them)",
                        some.join(", ")
                    )),
                )
                .into());
        }
    }
    if marks.iter().all(|&m| m) {
        return Err(r
            .key_error(
                "model.freeze",
                "`model.freeze` freezes every parameter: nothing would train".into(),
                Some("leave out the parameters to train (or adapt some with [model.lora])".into()),
            )
            .into());
    }
    let s = &r.config.strategy;
    if s.kind == StrategyKind::Fsdp && s.unit == FsdpUnit::Model && s.sharding != Sharding::None {
        return Err(r
            .key_error(
                "strategy.unit",
                "fsdp's `strategy.unit = \"model\"` shards the whole model as one unit, which cannot leave its frozen parameters out of the reduce-scatter and the update".into(),
                Some("use `strategy.unit = \"layer\"` (each block its own unit, as torchtitan wraps them) with model.freeze or [model.lora]".into()),
            )
            .into());
    }
    model.with_frozen(&marks).ok_or_else(|| ModelError::Build {
        kind: model.kind().to_string(),
        reason: "this family's model cannot freeze parameters (`Model::with_frozen`)".into(),
    })
}
