//! What a language model's sizes cost and the data it reads, checked before anything is built.

use super::api::ModelError;
use crate::config::{DataKind, Resolved};

/// Issue 45, defect 3: a language model no machine here could hold is bad input naming its
/// sizes, said before anything is built (`model.layers = 10000000` aborted out of memory inside
/// the build, and a million layers ran for minutes first): at most `MAX_LAYERS` blocks, and one
/// f32 copy of its `params` parameters (a run starts from one whole copy) within the memory
/// available. `sizes`: (key, value, default), `model.layers` first; the one furthest past its
/// default names the error.
pub(in crate::model) fn sized_for_this_machine(
    r: &Resolved,
    kind: &str,
    params: u128,
    sizes: &[(&str, usize, usize)],
) -> Result<(), ModelError> {
    const MAX_LAYERS: usize = 4096;
    if let Some((key, layers, _)) = sizes
        .iter()
        .find(|s| s.0 == "model.layers" && s.1 > MAX_LAYERS)
    {
        return Err(r
            .range_error(
                key,
                format!("`{key}` = {layers} is out of range: at most {MAX_LAYERS}"),
                None,
            )
            .into());
    }
    // (a device run's parameters live on the device: `launch::check::fits` does not measure
    // those either)
    if !r.config.backend.device.on_host() {
        return Ok(());
    }
    let bytes = params.saturating_mul(4);
    let Some(have) = crate::memory::available() else {
        return Ok(());
    };
    if bytes <= u128::from(have) {
        return Ok(());
    }
    let key = sizes
        .iter()
        .map(|(k, v, d)| (*k, *v as f64 / *d as f64))
        .fold(("model.layers", 0.0), |a, b| if b.1 > a.1 { b } else { a })
        .0;
    let listed: Vec<String> = sizes.iter().map(|(k, v, _)| format!("{k} = {v}")).collect();
    let keys: Vec<&str> = sizes.iter().map(|s| s.0).collect();
    Err(r
        .key_error(
            key,
            format!(
                "this {kind} ({}) has {params} parameters: one f32 copy of them is {}, but the machine has {} available",
                listed.join(", "),
                crate::ui::bytes(bytes.min(u128::from(u64::MAX)) as u64),
                crate::ui::bytes(have)
            ),
            Some(format!("make the model smaller ({})", keys.join(", "))),
        )
        .into())
}

/// The data fits language model `kind` of `vocab` tokens and `block` positions: byte-level text
/// needs 256 token values, `data.vocab` ids below the vocabulary, samples windows of `block + 1`
/// tokens.
pub(in crate::model) fn check_token_data(
    r: &Resolved,
    kind: &str,
    vocab: usize,
    block: usize,
    input: &[usize],
) -> Result<(), ModelError> {
    let err = |key: &str, message: String, help: &str| -> ModelError {
        r.key_error(key, message, Some(help.to_string())).into()
    };
    if matches!(
        r.config.data.kind,
        DataKind::Text | DataKind::Jsonl | DataKind::Parquet
    ) && r.config.data.tokenizer == "bytes"
        && vocab < 256
    {
        return Err(err(
            "model.vocab_size",
            format!(
                "`model.vocab_size` = {} is below 256, but byte-level text has 256 token values",
                vocab
            ),
            "set `model.vocab_size = 256` (or more)",
        ));
    }
    if let Some(t) = r.config.data.vocab.filter(|&t| t > vocab) {
        return Err(err(
            "data.vocab",
            format!("`data.vocab` = {t} is above `model.vocab_size` = {}", vocab),
            "tokens must be ids below the vocabulary size",
        ));
    }
    let tokens = r.config.data.kind.tokens() || r.config.data.vocab.is_some();
    if !tokens || input != [block + 1] {
        return Err(err(
                "model.kind",
                format!(
                    "`model.kind` = \"{kind}\" needs token windows of model.block_size + 1 = {} tokens, but the data ({:?}) has samples of shape {input:?}",
                    block + 1,
                    r.config.data.kind
                ),
                "use `data.kind = \"text\"`, `\"tokens\"`, `\"jsonl\"` or `\"parquet\"` (or synthetic `data.vocab = 256`)",
            ));
    }
    Ok(())
}
