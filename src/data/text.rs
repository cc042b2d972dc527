//! `data.kind = "text"`: any file as byte-level tokens (vocabulary 256). Training samples are
//! windows of `model.block_size + 1` tokens starting every `data.stride` tokens (default
//! `block_size`); the last `data.eval_fraction` of the file is held out and cut into windows
//! every `block_size` tokens (consecutive windows share one token, so every held-out target is
//! scored once). A window is a sample like any other: the distributed sampler, the resume cursor and
//! exact evaluation work over windows. The bytes are held once; windows are read from them.
//! With another `data.tokenizer` (GPT-2's BPE, a `tokenizer.json`) the file is tokenized as it
//! loads and the windows are of its ids.

use std::sync::Arc;

use super::tokens::{TokenStore, Windows};
use super::{Data, DataError, Dataset};
use crate::config::Resolved;

pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    let Some(value) = &c.path else {
        return Err(DataError::Invalid(
            "`data.kind` = \"text\" needs `data.path`".into(),
        ));
    };
    let path = r.path_of("data.path", value);
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    let (store, unit) = store(r, &path, "data.path")?;
    let what = path.display().to_string();
    let stride = c.stride.unwrap_or(block);
    let eval = eval_file(r)?;
    let fraction = match eval {
        Some(_) => 0.0,
        None => c.eval_fraction.unwrap_or(0.1),
    };
    let mut data = split(Arc::new(store), &what, block, stride, fraction, vocab, unit)?;
    if eval.is_some() {
        data.eval = eval;
    }
    Ok(data)
}

/// A text file's tokens (`key` names it): its bytes (`data.tokenizer = "bytes"`), or the ids of
/// `data.tokenizer`, tokenized once as it loads; and what its tokens are called in messages.
pub(super) fn store(
    r: &Resolved,
    path: &std::path::Path,
    key: &'static str,
) -> Result<(TokenStore, &'static str), DataError> {
    let bytes = super::read_bounded(path, key, Some(super::MAX_TEXT_BYTES))?;
    if r.config.data.tokenizer == "bytes" {
        return Ok((TokenStore::Bytes(bytes), "tokens (bytes)"));
    }
    let t = super::tokenizer::from_config(r)?;
    check_vocab(r, &t)?;
    let (ids, _) = t
        .encode(&bytes)
        .map_err(|e| DataError::Invalid(format!("{}: {e}", path.display())))?;
    Ok((TokenStore::Ids(ids), "tokens"))
}

/// The evaluation windows of `data.eval_path` (a text file for `data.kind = "text"`, a token
/// file for `"tokens"`), every `block` tokens so that each held-out target is scored once;
/// `None` without it.
pub(super) fn eval_file(r: &Resolved) -> Result<Option<Dataset>, DataError> {
    let c = &r.config.data;
    let Some(value) = &c.eval_path else {
        return Ok(None);
    };
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    let path = r.path_of("data.eval_path", value);
    let store = match c.kind {
        crate::config::DataKind::Tokens => {
            TokenStore::open(&path, "data.eval_path", super::tokens::dtype(c), vocab)?
        }
        _ => store(r, &path, "data.eval_path")?.0,
    };
    let width = block + 1;
    if store.len() < width {
        return Err(DataError::Invalid(format!(
            "{} (data.eval_path) has {} tokens, shorter than one window of model.block_size + 1 = {width}",
            path.display(),
            store.len()
        )));
    }
    let len = store.len();
    Ok(Some(Dataset::windows(Windows::over(
        Arc::new(store),
        0,
        len,
        width,
        block,
        vocab,
    ))))
}

/// The tokenizer's ids are all below `model.vocab_size` (the vocabulary of pretrained weights
/// is theirs: no `model.vocab_size` can change it).
pub(super) fn check_vocab(r: &Resolved, t: &super::tokenizer::Tokenizer) -> Result<(), DataError> {
    let c = &r.config.data;
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    // the vocabulary of pretrained weights is theirs: no `model.vocab_size` can change it
    // (issue 58, defect 14: the advice named a value config.json then refused)
    let source = crate::config::describe_source(&r.figment, "model.vocab_size");
    if t.vocab_size() > vocab
        && r.config.model.init_from.is_some()
        && source.contains("config.json")
    {
        return Err(DataError::Invalid(format!(
            "`data.tokenizer` = \"{}\" has {} tokens, but the weights of `model.init_from` have {vocab} (`model.vocab_size`, from {source}): its ids past {} have no embedding\n  = help: use the tokenizer that came with the model (the tokenizer.json beside its weights: leave `data.tokenizer` unset), or one of at most {vocab} tokens",
            c.tokenizer,
            t.vocab_size(),
            vocab - 1
        )));
    }
    if t.vocab_size() > vocab {
        return Err(DataError::Invalid(format!(
            "`data.tokenizer` = \"{}\" has {} tokens, but `model.vocab_size` = {vocab}; set `model.vocab_size = {}` (or more, e.g. a multiple of 64)",
            c.tokenizer,
            t.vocab_size(),
            t.vocab_size()
        )));
    }
    Ok(())
}

/// Training windows (every `stride` tokens) over the head of `store` and evaluation windows
/// (every `block` tokens) over its last `fraction`, each `block + 1` tokens; `what` names the
/// file in errors, `unit` its tokens.
pub fn split(
    store: Arc<TokenStore>,
    what: &str,
    block: usize,
    stride: usize,
    fraction: f64,
    vocab: usize,
    unit: &str,
) -> Result<Data, DataError> {
    let width = block + 1;
    let len = store.len();
    let at = len - (len as f64 * fraction).round() as usize;
    let short = |part: &str, n: usize| {
        DataError::Invalid(format!(
            "{what}: the {part} has {n} {unit}, shorter than one window of model.block_size + 1 = {width}; use a longer file, a smaller `model.block_size`, or (for the held-out part) another `data.eval_fraction`"
        ))
    };
    if at < width {
        return Err(short("training part", at));
    }
    let eval = if fraction > 0.0 {
        if len - at < width {
            return Err(short(
                &format!("held-out part (data.eval_fraction = {fraction})"),
                len - at,
            ));
        }
        // evaluation windows every block tokens: each held-out target is scored once
        Some(Dataset::windows(Windows::over(
            store.clone(),
            at,
            len,
            width,
            block,
            vocab,
        )))
    } else {
        None
    };
    Ok(Data {
        train: Dataset::windows(Windows::over(store, 0, at, width, stride, vocab)),
        eval,
    })
}
