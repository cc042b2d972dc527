//! `data.mix` of text or token files (`data.kind = "text"` or `"tokens"`): each source is one
//! file's windows of `model.block_size + 1` tokens every `data.stride` tokens, and the stream
//! (`stream.rs`) draws them as it draws documents: window n comes from source i with
//! probability `weight_i / sum`, drawn from (seed, n); each source's windows go in a seeded
//! order per pass (a keyed bijection computed window by window, so a token file's windows are
//! never listed in memory); a source that runs out starts its next pass, or with
//! `data.mix_stop = "first_exhausted"` every source does. A window fills its row, every token a
//! target but the first, as without a mixture; the run's position, its resume (under any world
//! size) and `kiln data preview` are the stream's.
//!
//! Each file trains whole; the evaluation data is `data.eval_path` (a file of the same kind).

use std::path::PathBuf;
use std::sync::Arc;

use super::documents::{DocumentSource, Encoder, Origin, Source};
use super::tokens::{TokenStore, Windows};
use super::{Data, DataError, Dataset};
use crate::config::{DataKind, Resolved};

/// A source of windows: a text or token file, and its windows.
pub struct WindowFile {
    pub windows: Windows,
    pub path: PathBuf,
    /// The source in messages: `data.mix[1]` for a mixture's second.
    pub name: String,
    /// The file's size when the run opened it (a resume over another file is refused).
    pub bytes: u64,
    /// What its tokens are: "u16 tokens", "tokens (bytes)".
    pub unit: String,
}

/// The windows of each file of `data.mix` as a stream, and the evaluation windows of
/// `data.eval_path`.
pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    let width = block + 1;
    let stride = c.stride.unwrap_or(block);
    let mut sources = Vec::with_capacity(c.mix.len());
    for (i, m) in c.mix.iter().enumerate() {
        let path = r.path_of("data.mix", &m.path);
        let name = format!("data.mix[{i}]");
        let (store, unit) = match c.kind {
            DataKind::Tokens => {
                let dtype = super::tokens::dtype(c);
                let store = TokenStore::open(&path, "data.mix", dtype, vocab)?;
                (store, format!("{} tokens", dtype.name()))
            }
            _ => {
                let (store, unit) = super::text::store(r, &path, "data.mix")?;
                (store, unit.to_string())
            }
        };
        let len = store.len();
        let windows = Windows::over(Arc::new(store), 0, len, width, stride, vocab);
        if windows.count == 0 {
            return Err(DataError::Invalid(format!(
                "{} ({name}) has {len} {unit}, shorter than one window of model.block_size + 1 = {width}; use a longer file, or a smaller `model.block_size`",
                crate::ui::printable(&path.display().to_string())
            )));
        }
        let bytes = std::fs::metadata(&path)
            .map_err(|source| DataError::Io {
                path: path.clone(),
                key: "data.mix",
                source,
            })?
            .len();
        sources.push(Source {
            origin: Origin::Windows(WindowFile {
                windows,
                path,
                name,
                bytes,
                unit,
            }),
            weight: m.weight,
        });
    }
    let tokenizer = super::tokenizer::from_config(r)?;
    let src = Arc::new(DocumentSource {
        sources,
        first_exhausted: c.mix_stop == crate::config::MixStop::FirstExhausted,
        encoder: Encoder {
            tokenizer: Arc::new(tokenizer),
            eos: None,
            width,
            packing: false,
            train_on_prompt: false,
            template: None,
            truncation: crate::config::Truncation::Right,
        },
        shuffle: r.config.sampler.shuffle,
        seed: r.config.sampler.seed,
    });
    Ok(Data {
        train: Dataset::stream(src),
        eval: super::text::eval_file(r)?,
    })
}

/// `DocumentSource::describe` for windows: each file, its windows and share, and the order.
pub fn describe(src: &DocumentSource) -> String {
    let total: f64 = src.sources.iter().map(|s| s.weight).sum();
    let files: Vec<String> = src
        .sources
        .iter()
        .filter_map(|s| match &s.origin {
            Origin::Windows(w) => Some(format!(
                "{} ({}, {} {}): {} windows every {} tokens, {:.1}% of rows",
                w.name,
                crate::ui::printable(&w.path.display().to_string()),
                w.windows.store.len(),
                w.unit,
                w.windows.count,
                w.windows.stride,
                100.0 * s.weight / total
            )),
            Origin::Documents(_) => None,
        })
        .collect();
    format!(
        "windows of {} tokens mixed: {}; {}",
        src.encoder.width,
        files.join("; "),
        if src.shuffle {
            "each source's windows in a seeded order per pass"
        } else {
            "each source's windows in file order"
        }
    )
}
