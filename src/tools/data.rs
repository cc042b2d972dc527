//! `kiln data preview` and `kiln data stats`: what a run trains on, before it runs.
//!
//! The preview is the rows a run reads, in its order (the global rows: any world size takes
//! them in this order), each with its tokens, which of them are targets, where documents
//! start and which source each came from. As JSON, a row is what transformers would train on
//! to the same loss: `input_ids`, `labels` (`-100` where a token is no target: a document's
//! first token, padding), `position_ids` (restarting at each document) and `source` (per
//! token: the index into `data.mix`, 0 without one, -1 for padding).

use crate::config::Resolved;
use crate::data::documents::PackedRows;
use crate::data::stream::{Row, Stream};
use crate::data::tokenizer::Tokenizer;
use crate::data::{DataError, Samples};
use crate::error::Result;

/// A row as the preview shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewRow {
    pub tokens: Vec<u32>,
    /// Where each token's document starts in the row (a padding token: itself).
    pub starts: Vec<u32>,
    /// Each token's source (`-1`: padding).
    pub sources: Vec<i64>,
    /// Whether a token has a loss where it is a target (a prompt's and a user's turns have
    /// none).
    pub loss: Vec<bool>,
}

impl PreviewRow {
    fn of_pieces(width: usize, pieces: &Row) -> PreviewRow {
        let mut r = PreviewRow {
            tokens: Vec::with_capacity(width),
            starts: Vec::with_capacity(width),
            sources: Vec::with_capacity(width),
            loss: Vec::with_capacity(width),
        };
        for (source, t) in pieces {
            let start = r.tokens.len() as u32;
            r.push_ids(t);
            r.starts.extend(std::iter::repeat_n(start, t.len()));
            r.sources
                .extend(std::iter::repeat_n(i64::from(*source), t.len()));
        }
        r.pad(width);
        r
    }

    fn of_packed(rows: &PackedRows, i: usize) -> PreviewRow {
        let mut r = PreviewRow {
            tokens: Vec::new(),
            starts: Vec::new(),
            sources: Vec::new(),
            loss: Vec::new(),
        };
        let mut ids = Vec::new();
        rows.read(i, &mut ids, &mut r.starts);
        r.push_ids(&ids);
        let used = rows.used[i];
        r.sources = (0..r.tokens.len())
            .map(|j| if j < used { 0 } else { -1 })
            .collect();
        r
    }

    /// Ids as a row holds them: the id, and whether it has a loss (`NO_LOSS`).
    fn push_ids(&mut self, ids: &[u32]) {
        use crate::data::documents::{NO_LOSS, PADDING};
        self.tokens
            .extend(ids.iter().map(|&t| t & !(NO_LOSS | PADDING)));
        self.loss.extend(ids.iter().map(|&t| t & NO_LOSS == 0));
    }

    fn pad(&mut self, width: usize) {
        for i in self.tokens.len()..width {
            self.tokens.push(crate::data::documents::PAD);
            self.starts.push(i as u32);
            self.sources.push(-1);
            self.loss.push(false);
        }
    }

    /// transformers' labels: the token where it is a target of the one before it and has a
    /// loss, else -100.
    pub fn labels(&self) -> Vec<i64> {
        (0..self.tokens.len())
            .map(|i| {
                let target = i > 0
                    && self.starts[i] == self.starts[i - 1]
                    && self.sources[i] >= 0
                    && self.loss[i];
                if target {
                    i64::from(self.tokens[i])
                } else {
                    -100
                }
            })
            .collect()
    }

    /// Each token's place in its document (0 for padding).
    pub fn positions(&self) -> Vec<u32> {
        (0..self.tokens.len())
            .map(|i| {
                if self.sources[i] < 0 {
                    0
                } else {
                    i as u32 - self.starts[i]
                }
            })
            .collect()
    }

    /// The row's documents (or pieces): their token ranges and sources.
    fn documents(&self) -> Vec<(std::ops::Range<usize>, i64)> {
        let mut out: Vec<(std::ops::Range<usize>, i64)> = Vec::new();
        for i in 0..self.tokens.len() {
            if self.sources[i] < 0 {
                break;
            }
            match out.last_mut() {
                Some((r, _)) if self.starts[i] as usize == r.start => r.end = i + 1,
                _ => out.push((i..i + 1, self.sources[i])),
            }
        }
        out
    }
}

/// The first `n` rows a run of `r` trains on (or, with `eval`, evaluates on), in order, and
/// the tokenizer that decodes them.
pub fn preview_rows(r: &Resolved, n: usize, eval: bool) -> Result<(Vec<PreviewRow>, Tokenizer)> {
    let data = crate::data::load(r)?;
    let tokenizer = crate::data::tokenizer::from_config(r)?;
    let ds = if eval {
        data.eval.as_ref().ok_or_else(|| {
            DataError::Invalid(
                "the experiment has no evaluation data (`data.eval_path`, or `data.eval_fraction` of a text or token file without `data.mix`)".into(),
            )
        })?
    } else {
        &data.train
    };
    let rows = match &ds.samples {
        Samples::Stream(src) => {
            let mut s = Stream::new(src.clone(), None);
            (0..n)
                .map(|_| Ok(PreviewRow::of_pieces(src.encoder.width, &s.next_row()?)))
                .collect::<std::result::Result<Vec<_>, DataError>>()?
        }
        Samples::Packed(p) => (0..n.min(p.len()))
            .map(|i| PreviewRow::of_packed(p, i))
            .collect(),
        Samples::Windows(_) => {
            // token windows: the global order of the first epoch (every token a target but the
            // first)
            let plan = crate::plan::Plan::new(&r.config, ds.len(), 0);
            let seg = plan.sampler.segment_of(0, 0);
            let order: Vec<usize> = if eval {
                (0..n.min(ds.len())).collect()
            } else {
                (0..n.min(seg.total)).map(|q| seg.global(q)).collect()
            };
            let mut rows = Vec::with_capacity(order.len());
            for i in order {
                let (x, _) = ds.gather(&[i])?;
                let tokens = match x {
                    crate::data::Values::Tokens(t) => t,
                    crate::data::Values::F32(v) => v.into_iter().map(|t| t as u32).collect(),
                };
                let len = tokens.len();
                rows.push(PreviewRow {
                    tokens,
                    starts: vec![0; len],
                    sources: vec![0; len],
                    loss: vec![true; len],
                });
            }
            rows
        }
        Samples::Rows { .. } => {
            return Err(DataError::Invalid(format!(
                "`data.kind` = \"{}\" is not token data: `kiln data preview` shows what a language model trains on (text, tokens, jsonl, parquet)",
                crate::config::choice_name(&r.config.data.kind)
            ))
            .into())
        }
    };
    Ok((rows, tokenizer))
}

/// One row as a JSON object (`--json`).
pub fn row_json(i: usize, row: &PreviewRow) -> serde_json::Value {
    serde_json::json!({
        "row": i,
        "input_ids": row.tokens,
        "labels": row.labels(),
        "position_ids": row.positions(),
        "source": row.sources,
    })
}

/// One row as text: a header, then each document (or piece) on a line of its own (with its
/// source when `mixed`), its first token (no target) dim on a terminal (`colour`) and in `⟦ ⟧`
/// otherwise; newlines and control characters escaped.
pub fn row_text(i: usize, row: &PreviewRow, t: &Tokenizer, colour: bool, mixed: bool) -> String {
    let docs = row.documents();
    let used: usize = docs.iter().map(|(r, _)| r.len()).sum();
    let targets = row.labels().iter().filter(|&&l| l >= 0).count();
    let mut out = format!(
        "row {i}: {} document{}, {used} of {} tokens, {targets} trained, {} padding\n",
        docs.len(),
        if docs.len() == 1 { "" } else { "s" },
        row.tokens.len(),
        row.tokens.len() - used,
    );
    let show = |ids: &[u32]| -> String {
        let bytes = t.decode(ids).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes).replace('\n', "\\n");
        crate::ui::printable(&text).into_owned()
    };
    let labels = row.labels();
    for (r, source) in docs {
        let tag = if mixed {
            format!("[source {source}] ")
        } else {
            String::new()
        };
        out.push_str(&format!("  | {tag}"));
        // runs of tokens with a loss and without (a document's first token, a prompt), the
        // latter dim or in ⟦ ⟧
        let mut at = r.start;
        while at < r.end {
            let trained = labels[at] >= 0;
            let end = (at..r.end)
                .find(|&j| (labels[j] >= 0) != trained)
                .unwrap_or(r.end);
            let text = show(&row.tokens[at..end]);
            out.push_str(&match (trained, colour) {
                (true, _) => text,
                (false, true) => format!("\x1b[2m{text}\x1b[0m"),
                (false, false) => format!("⟦{text}⟧"),
            });
            at = end;
        }
        out.push('\n');
    }
    out
}

/// What `kiln data stats` reports of one corpus (training or evaluation documents).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub documents: usize,
    pub tokens: usize,
    /// Documents by length: the counts of lengths in [2^k, 2^(k+1)) tokens, k from 0.
    pub lengths: Vec<usize>,
    /// Per source: documents and tokens.
    pub per_source: Vec<(usize, usize)>,
    /// Rows after packing (in file order), and their padding tokens.
    pub rows: usize,
    pub padding: usize,
    /// Whether documents end with an EOS id, and are packed (`data.packing`).
    pub eos: bool,
    pub packing: bool,
    /// Each source's share of the documents a run draws (`data.mix`'s weights).
    pub drawn: Vec<f64>,
    /// Target tokens with a loss (a prompt's and a user's turns have none), and the records
    /// longer than a row truncated or dropped (`data.truncation`).
    pub trained: usize,
    pub truncated: usize,
    pub dropped: usize,
}

/// The documents of every source of `r` (or its evaluation documents), tokenized once in file
/// order: counts, a length histogram, and the rows packing makes of them.
pub fn stats(r: &Resolved, eval: bool) -> Result<Stats> {
    use crate::data::documents::{Corpus, DocumentSource, Source};
    let not_documents = || {
        DataError::Invalid(format!(
            "`kiln data stats` counts documents (`data.kind` = \"jsonl\" or \"parquet\"), not `data.kind` = \"{}\"; `kiln data preview` shows the rows of any token data",
            crate::config::choice_name(&r.config.data.kind)
        ))
    };
    if !r.config.data.kind.documents() {
        return Err(not_documents().into());
    }
    let data = crate::data::load(r)?;
    let Samples::Stream(src) = &data.train.samples else {
        return Err(not_documents().into());
    };
    let src: &DocumentSource = src;
    let Some(sources) = src
        .sources
        .iter()
        .map(Source::corpus)
        .collect::<Option<Vec<&Corpus>>>()
    else {
        return Err(not_documents().into());
    };
    let eval_corpus;
    let corpora: Vec<&Corpus> = if eval {
        let p = r.config.data.eval_path.as_ref().ok_or_else(|| {
            DataError::Invalid(
                "the experiment has no evaluation documents (`data.eval_path`)".into(),
            )
        })?;
        let format = sources[0].format;
        eval_corpus = Corpus::open(
            &r.path_of("data.eval_path", p),
            format,
            &r.config.data.text_field,
            "data.eval_path",
        )?
        .with_format(&r.config.data)?;
        vec![&eval_corpus]
    } else {
        sources
    };
    let enc = &src.encoder;
    let total: f64 = src.sources.iter().map(|s| s.weight).sum();
    let mut st = Stats {
        per_source: vec![(0, 0); corpora.len()],
        // (a conversation ends as its template ends it, with no EOS id added)
        eos: enc.eos.is_some()
            && corpora
                .iter()
                .all(|c| !matches!(c.shape, crate::data::records::Shape::Messages { .. })),
        packing: enc.packing,
        drawn: src.sources.iter().map(|s| s.weight / total).collect(),
        ..Default::default()
    };
    let mut packer = enc.packer();
    let mut rows = 0usize;
    for (i, c) in corpora.iter().enumerate() {
        for shard in &c.shards {
            for doc in c.documents(shard)? {
                let doc = doc?;
                let (ids, fit) = crate::data::documents::encode_at(enc, &doc, shard, &c.name)?;
                match fit {
                    crate::data::documents::Fit::Truncated => st.truncated += 1,
                    crate::data::documents::Fit::Dropped => st.dropped += 1,
                    crate::data::documents::Fit::Whole => {}
                }
                let n = ids.len();
                if n == 0 {
                    continue;
                }
                // (a document's first token is no target; nor is one marked without a loss)
                st.trained += ids[1..]
                    .iter()
                    .filter(|&&t| t & crate::data::documents::NO_LOSS == 0)
                    .count();
                st.documents += 1;
                st.tokens += n;
                st.per_source[i].0 += 1;
                st.per_source[i].1 += n;
                let k = (usize::BITS - 1 - n.leading_zeros()) as usize;
                if st.lengths.len() <= k {
                    st.lengths.resize(k + 1, 0);
                }
                st.lengths[k] += 1;
                rows += packer.push(n).len();
            }
        }
    }
    rows += packer.finish().len();
    st.rows = rows;
    st.padding = rows * enc.width - st.tokens;
    Ok(st)
}

/// The report of `stats` as lines.
pub fn stats_text(st: &Stats, names: &[String], width: usize) -> Vec<String> {
    let mut out = vec![format!(
        "{} documents, {} tokens (mean {:.1} per document)",
        st.documents,
        st.tokens,
        st.tokens as f64 / st.documents.max(1) as f64
    )];
    let targets = st.tokens - st.documents;
    if st.trained < targets {
        out.push(format!(
            "{} of the {targets} target tokens have a loss ({:.1}%: a prompt's and a user's turns have none)",
            st.trained,
            100.0 * st.trained as f64 / targets.max(1) as f64
        ));
    }
    if st.truncated + st.dropped > 0 {
        out.push(format!(
            "{} record{} longer than a row of {width} tokens: {} truncated, {} left out (data.truncation)",
            st.truncated + st.dropped,
            if st.truncated + st.dropped == 1 { "" } else { "s" },
            st.truncated,
            st.dropped
        ));
    }
    out.push(
        if st.eos {
            "document lengths (tokens, with the EOS id):"
        } else {
            "document lengths (tokens):"
        }
        .into(),
    );
    let top = st.lengths.iter().copied().max().unwrap_or(0).max(1);
    for (k, &n) in st.lengths.iter().enumerate() {
        let (lo, hi) = (1usize << k, (1usize << (k + 1)) - 1);
        let bar = "#".repeat((n * 40).div_ceil(top));
        out.push(format!("  {lo:>7}-{hi:<7} {n:>9}  {bar}"));
    }
    if st.per_source.len() > 1 {
        for (i, (d, t)) in st.per_source.iter().enumerate() {
            let drawn = st.drawn.get(i).map_or(String::new(), |w| {
                format!("; a run draws {:.1}% of its documents from it", 100.0 * w)
            });
            out.push(format!(
                "{}: {d} documents ({:.1}% of the files'), {t} tokens ({:.1}%){drawn}",
                names.get(i).map_or("?", String::as_str),
                100.0 * *d as f64 / st.documents.max(1) as f64,
                100.0 * *t as f64 / st.tokens.max(1) as f64
            ));
        }
    }
    out.push(format!(
        "{} rows of {width} tokens{} (file order), {:.2}% padding",
        st.rows,
        if st.packing {
            " after packing"
        } else {
            ", one document or piece each"
        },
        100.0 * st.padding as f64 / (st.rows * width).max(1) as f64
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_says_what_transformers_would_train_on() {
        let row = PreviewRow::of_pieces(8, &vec![(0, vec![5, 6, 7]), (1, vec![8, 9])]);
        assert_eq!(row.tokens, [5, 6, 7, 8, 9, 0, 0, 0]);
        assert_eq!(row.labels(), [-100, 6, 7, -100, 9, -100, -100, -100]);
        assert_eq!(row.positions(), [0, 1, 2, 0, 1, 0, 0, 0]);
        assert_eq!(row.sources, [0, 0, 0, 1, 1, -1, -1, -1]);
        assert_eq!(row.documents(), [(0..3, 0), (3..5, 1)]);
        let text = row_text(0, &row, &Tokenizer::Bytes, false, true);
        assert!(
            text.starts_with("row 0: 2 documents, 5 of 8 tokens, 3 trained, 3 padding"),
            "{text}"
        );
        assert!(text.contains("[source 1] ⟦\\u{8}⟧\t"), "{text}");
    }
}
