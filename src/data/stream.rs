//! The training documents as a stream of rows (`documents.rs` says what they are).
//!
//! Each source (`data.path`, or each of `data.mix`) is read by a cursor: a pass over its
//! shards in a seeded order, each shard in chunks of [`CHUNK`] documents in a seeded order of
//! their own (a shuffle of shards plus a bounded buffer: a compressed or parquet shard has no
//! cheap random access). A source of windows (`data.mix` of text or token files,
//! `mixture.rs`) has one "shard", its file, whose windows are its documents, each in a keyed
//! order per pass computed window by window (`sampler::feistel`). Document number n of the stream comes from source i with probability
//! `weight_i / sum` (as `datasets.interleave_datasets`' probabilities), drawn from (seed, n)
//! alone. A source that runs out starts its next pass (the run log says so), unless
//! `data.mix_stop = "first_exhausted"` (or there is one source): then the stream's pass ends,
//! its open rows close, and every source starts its next pass. Passes follow each other
//! until `train.max_steps`.
//!
//! Rows are numbered over all passes; a step takes the next global rows in order, so a batch,
//! and a run, is the same for any world size. Where the stream stands is small and exact
//! ([`DocumentsPosition`]): each source's pass, shard and documents read, the documents drawn,
//! and the tokens of the rows packed but not yet taken. A checkpoint keeps it, and a resumed
//! run goes on with the bits of a straight one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use super::documents::{encode_at, Corpus, DocumentSource, Fit, Origin, CHUNK};
use super::packing::{PackedRow, Packer, Piece};
use super::records::{Document, Documents};
use super::DataError;
use crate::checkpoint::{DocumentsPosition, SourcePosition};

/// A row as the stream hands it out: its pieces, each the index of its source and its tokens.
pub type Row = Vec<(u32, Vec<u32>)>;

/// The shard a cursor is reading: its documents, and the current chunk in its shuffled order.
struct Reading {
    docs: Documents,
    /// The shard's index among its corpus's shards.
    index: usize,
    chunk: Vec<Document>,
    /// Documents of the shard read before `chunk`.
    chunk_start: usize,
}

/// Where a source's reading stands: its pass, the shard (by place in the pass's order) and its
/// documents read.
struct Cursor {
    at: SourcePosition,
    reading: Option<Reading>,
}

/// The training documents as rows, in order, from a position on.
pub struct Stream {
    src: Arc<DocumentSource>,
    /// The stream's passes (which end only with `first_exhausted`), and documents drawn.
    pass: u64,
    drawn: u64,
    cursors: Vec<Cursor>,
    packer: Packer,
    /// The source and tokens of the documents that open rows hold pieces of, by number.
    held: HashMap<usize, (u32, Vec<u32>)>,
    ready: VecDeque<Row>,
    rows: u64,
    /// What the run log should say (a source starting its next pass), not yet taken.
    notes: Vec<String>,
    /// Records longer than a row truncated, and dropped, since the stream was opened.
    truncated: u64,
    dropped: u64,
}

impl Stream {
    /// The stream from its start, or from `at` (a checkpoint's).
    pub fn new(src: Arc<DocumentSource>, at: Option<&DocumentsPosition>) -> Stream {
        let n = src.sources.len();
        let mut s = Stream {
            packer: src.encoder.packer(),
            cursors: (0..n)
                .map(|i| Cursor {
                    at: at
                        .and_then(|p| p.sources.get(i).copied())
                        .unwrap_or_default(),
                    reading: None,
                })
                .collect(),
            src,
            pass: 0,
            drawn: 0,
            held: HashMap::new(),
            ready: VecDeque::new(),
            rows: 0,
            notes: Vec::new(),
            truncated: 0,
            dropped: 0,
        };
        if let Some(p) = at {
            s.pass = p.pass;
            s.drawn = p.drawn;
            s.rows = p.rows;
            s.ready = p.ready.iter().cloned().collect();
            // each piece of an open row is a document of its own to the packer: its place and
            // length are all packing looks at
            let mut open = Vec::with_capacity(p.open.len());
            for row in &p.open {
                let mut r = PackedRow::default();
                for (source, piece) in row {
                    let n = s.held.len();
                    s.held.insert(n, (*source, piece.clone()));
                    r.len += piece.len();
                    r.pieces.push(Piece {
                        doc: n,
                        tokens: 0..piece.len(),
                    });
                }
                open.push(r);
            }
            let next = s.held.len();
            s.packer = s.packer.resume(open, next);
        }
        s
    }

    /// Where the stream stands now.
    pub fn position(&self) -> DocumentsPosition {
        DocumentsPosition {
            pass: self.pass,
            drawn: self.drawn,
            sources: self.cursors.iter().map(|c| c.at).collect(),
            rows: self.rows,
            ready: self.ready.iter().cloned().collect(),
            open: self.packer.open_rows().map(|r| self.row_of(r)).collect(),
            files: self.src.files(),
        }
    }

    /// Rows handed out so far (the global number of the next one).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Tokens per row.
    pub fn width(&self) -> usize {
        self.src.encoder.width
    }

    /// The stream's pass (from 0; passes end only with `first_exhausted` or a single source).
    pub fn pass(&self) -> u64 {
        self.pass
    }

    /// What the run log should say since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notes)
    }

    fn row_of(&self, r: &PackedRow) -> Row {
        r.pieces
            .iter()
            .map(|p| {
                let (source, tokens) = &self.held[&p.doc];
                (*source, tokens[p.tokens.clone()].to_vec())
            })
            .collect()
    }

    /// The next row.
    pub fn next_row(&mut self) -> Result<Row, DataError> {
        // a source that ends twice in a row without a document has none with a token
        let mut empty = vec![0u8; self.cursors.len()];
        loop {
            if let Some(r) = self.ready.pop_front() {
                self.rows += 1;
                return Ok(r);
            }
            let i = self.pick();
            match self.next_document(i)? {
                Some(ids) => {
                    self.drawn += 1;
                    empty[i] = 0;
                    let n = self.packer.next_doc();
                    let len = ids.len();
                    self.held.insert(n, (i as u32, ids));
                    let closed = self.packer.push(len);
                    self.close(closed);
                }
                None => {
                    empty[i] += 1;
                    if empty[i] > 1 {
                        return Err(DataError::Invalid(format!(
                            "{}: no document has any token",
                            self.src.sources[i].name()
                        )));
                    }
                    if self.src.first_exhausted || self.cursors.len() == 1 {
                        // the stream's pass ends: its open rows close, every source starts over
                        let closed = self.packer.finish();
                        self.close(closed);
                        self.held.clear();
                        self.pass += 1;
                        for c in &mut self.cursors {
                            c.at = SourcePosition {
                                epoch: self.pass,
                                ..Default::default()
                            };
                            c.reading = None;
                        }
                        if self.cursors.len() > 1 {
                            self.notes.push(format!(
                                "{}: {} ran out (data.mix_stop = \"first_exhausted\"): every source starts pass {}",
                                self.what(i),
                                self.src.sources[i].name(),
                                self.pass + 1
                            ));
                        }
                    } else {
                        let what = self.what(i);
                        let c = &mut self.cursors[i];
                        c.at = SourcePosition {
                            epoch: c.at.epoch + 1,
                            ..Default::default()
                        };
                        c.reading = None;
                        self.notes.push(format!(
                            "{what}: {} ran out and starts its pass {}",
                            self.src.sources[i].name(),
                            c.at.epoch + 1
                        ));
                    }
                }
            }
        }
    }

    /// The source of the next document: drawn by weight from (seed, documents drawn).
    fn pick(&self) -> usize {
        let sources = &self.src.sources;
        if sources.len() == 1 {
            return 0;
        }
        let total: f64 = sources.iter().map(|s| s.weight).sum();
        let mut u = crate::rng::Rng::stream(self.src.seed, "document mix", &[self.drawn])
            .next_f64()
            * total;
        for (i, s) in sources.iter().enumerate() {
            if u < s.weight {
                return i;
            }
            u -= s.weight;
        }
        sources.len() - 1
    }

    fn close(&mut self, closed: Vec<PackedRow>) {
        for r in &closed {
            let row = self.row_of(r);
            self.ready.push_back(row);
        }
        if !closed.is_empty() {
            let open = self.packer.open_docs();
            self.held.retain(|d, _| open.contains(d));
        }
    }

    /// Source `i`'s shards in its pass `epoch`, in the order it reads them.
    fn shard_order(&self, i: usize, n: usize, epoch: u64) -> Vec<usize> {
        if self.src.shuffle {
            crate::rng::Rng::stream(self.src.seed, "document shards", &[i as u64, epoch])
                .permutation(n)
        } else {
            (0..n).collect()
        }
    }

    /// What source `i` draws, in the run log: documents, or windows.
    fn what(&self, i: usize) -> &'static str {
        match self.src.sources[i].origin {
            Origin::Documents(_) => "documents",
            Origin::Windows(_) => "windows",
        }
    }

    /// Source `i`'s next document's ids in its pass, or `None` at its end (documents without
    /// a token are passed over).
    fn next_document(&mut self, i: usize) -> Result<Option<Vec<u32>>, DataError> {
        let src = self.src.clone();
        match &src.sources[i].origin {
            Origin::Documents(corpus) => self.next_record(i, corpus),
            Origin::Windows(w) => {
                // the pass's windows in a keyed order, computed window by window
                let at = &mut self.cursors[i].at;
                let count = w.windows.count;
                if at.doc >= count {
                    return Ok(None);
                }
                let j = if src.shuffle {
                    let key = crate::rng::derive(src.seed, "window order", &[i as u64, at.epoch]);
                    super::sampler::feistel(key, count, at.doc)
                } else {
                    at.doc
                };
                let mut ids = Vec::with_capacity(w.windows.width);
                w.windows.read(j, &mut ids)?;
                at.doc += 1;
                Ok(Some(ids))
            }
        }
    }

    /// Source `i`'s next record's ids in its pass over `corpus`, or `None` at its end.
    fn next_record(&mut self, i: usize, corpus: &Corpus) -> Result<Option<Vec<u32>>, DataError> {
        loop {
            if self.cursors[i].reading.is_none() {
                let at = self.cursors[i].at;
                let order = self.shard_order(i, corpus.shards.len(), at.epoch);
                let Some(&index) = order.get(at.shard) else {
                    return Ok(None);
                };
                let shard = &corpus.shards[index];
                shard.unchanged(corpus.key)?;
                let mut docs = corpus.documents(shard)?;
                // the chunk the position is in: the documents before it are read past
                let chunk_start = at.doc / CHUNK * CHUNK;
                for d in docs.by_ref().take(chunk_start) {
                    d?;
                }
                self.cursors[i].reading = Some(Reading {
                    docs,
                    index,
                    chunk: Vec::new(),
                    chunk_start,
                });
                self.fill_chunk(i)?;
            }
            let c = &mut self.cursors[i];
            let Some(r) = c.reading.as_mut() else {
                continue;
            };
            let k = c.at.doc - r.chunk_start;
            if k >= r.chunk.len() {
                if r.chunk.len() < CHUNK {
                    // the shard's end
                    c.reading = None;
                    c.at.shard += 1;
                    c.at.doc = 0;
                    continue;
                }
                r.chunk_start += r.chunk.len();
                self.fill_chunk(i)?;
                continue;
            }
            let (ids, fit) = encode_at(
                &self.src.encoder,
                &r.chunk[k],
                &corpus.shards[r.index],
                &corpus.name,
            )?;
            let at = format!(
                "{}: {}",
                corpus.shards[r.index].path.display(),
                r.chunk[k].at
            );
            c.at.doc += 1;
            self.count(fit, &at);
            if !ids.is_empty() {
                return Ok(Some(ids));
            }
        }
    }

    /// Counts a record longer than a row, truncated or dropped: the run log says so at the
    /// first (naming it), and at the 10th, 100th, ... since the stream was opened.
    fn count(&mut self, fit: Fit, at: &str) {
        let (n, what) = match fit {
            Fit::Whole => return,
            Fit::Truncated => {
                self.truncated += 1;
                (
                    self.truncated,
                    "truncated to a row (data.truncation = \"right\")",
                )
            }
            Fit::Dropped => {
                self.dropped += 1;
                (self.dropped, "left out (data.truncation = \"drop\")")
            }
        };
        if n == 1 {
            self.notes.push(format!(
                "documents: {} is longer than a row of {} tokens: {what}",
                crate::ui::printable(at),
                self.src.encoder.width
            ));
        } else if format!("{n}")
            .strip_prefix('1')
            .is_some_and(|r| r.bytes().all(|b| b == b'0'))
        {
            // (10, 100, 1000, ...)
            self.notes.push(format!(
                "documents: {n} records longer than a row so far {what}"
            ));
        }
    }

    /// Reads the next chunk of the shard source `i` is reading, in its seeded order.
    fn fill_chunk(&mut self, i: usize) -> Result<(), DataError> {
        let (shuffle, seed) = (self.src.shuffle, self.src.seed);
        let c = &mut self.cursors[i];
        let epoch = c.at.epoch;
        let Some(r) = c.reading.as_mut() else {
            return Ok(());
        };
        let mut chunk = Vec::with_capacity(CHUNK);
        for d in r.docs.by_ref().take(CHUNK) {
            chunk.push(d?);
        }
        if shuffle {
            let perm = crate::rng::Rng::stream(
                seed,
                "document chunk",
                &[
                    i as u64,
                    epoch,
                    r.index as u64,
                    (r.chunk_start / CHUNK) as u64,
                ],
            )
            .permutation(chunk.len());
            let mut slots: Vec<Option<Document>> = chunk.into_iter().map(Some).collect();
            chunk = perm.iter().filter_map(|&j| slots[j].take()).collect();
        }
        r.chunk = chunk;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::documents::{Corpus, Encoder, Source};
    use crate::data::records::Format;
    use crate::data::tokenizer::Tokenizer;

    fn corpus(dir: &std::path::Path, files: &[(&str, &[&str])]) -> Corpus {
        for (name, docs) in files {
            let text: String = docs
                .iter()
                .map(|d| format!("{}\n", serde_json::json!({ "text": d })))
                .collect();
            std::fs::write(dir.join(name), text).unwrap();
        }
        Corpus::open(dir, Format::Jsonl, "text", "data.path").unwrap()
    }

    fn source(
        sources: Vec<Source>,
        width: usize,
        packing: bool,
        shuffle: bool,
    ) -> Arc<DocumentSource> {
        Arc::new(DocumentSource {
            sources,
            first_exhausted: false,
            encoder: Encoder {
                tokenizer: Arc::new(Tokenizer::Bytes),
                eos: Some(0),
                width,
                packing,
                train_on_prompt: false,
                template: None,
                truncation: crate::config::Truncation::Right,
            },
            shuffle,
            seed: 5,
        })
    }

    fn one(c: Corpus) -> Vec<Source> {
        vec![Source::documents(c, 1.0)]
    }

    fn rows(s: &mut Stream, n: usize) -> Vec<Row> {
        (0..n).map(|_| s.next_row().unwrap()).collect()
    }

    fn b(t: &str) -> (u32, Vec<u32>) {
        let mut v: Vec<u32> = t.bytes().map(u32::from).collect();
        v.push(0);
        (0, v)
    }

    #[test]
    fn rows_hold_whole_documents_with_their_eos_and_passes_follow_each_other() {
        let dir = crate::testdir::tempdir().unwrap();
        let c = corpus(dir.path(), &[("a.jsonl", &["abc", "de", "fghij"])]);
        let mut s = Stream::new(source(one(c), 8, true, false), None);
        let got = rows(&mut s, 4);
        // "abc"+EOS (4) and "de"+EOS (3) share a row; "fghij"+EOS (6) has its own; the pass
        // ends and the next one starts the same way
        assert_eq!(got[0], vec![b("abc"), b("de")]);
        assert_eq!(got[1], vec![b("fghij")]);
        assert_eq!(got[2], got[0]);
        // (the second pass's last row closed at its end)
        assert_eq!(s.pass(), 2);
        assert_eq!(s.rows(), 4);
    }

    #[test]
    fn a_stream_resumed_from_its_position_gives_the_same_rows() {
        let dir = crate::testdir::tempdir().unwrap();
        let docs: Vec<String> = (0..300).map(|i| "x".repeat(1 + (i * 7) % 23)).collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let a = crate::testdir::tempdir().unwrap();
        let mixed = vec![
            Source::documents(
                corpus(
                    dir.path(),
                    &[("a.jsonl", &refs[..200]), ("b.jsonl", &refs[200..])],
                ),
                3.0,
            ),
            Source::documents(corpus(a.path(), &[("c.jsonl", &refs[..40])]), 1.0),
        ];
        let src = source(mixed, 16, true, true);
        let mut straight = Stream::new(src.clone(), None);
        let all = rows(&mut straight, 700);
        for cut in [0, 1, 37, 250, 433] {
            let mut s = Stream::new(src.clone(), None);
            let mut got = rows(&mut s, cut);
            let at = s.position();
            // through JSON, as a checkpoint keeps it
            let at: DocumentsPosition =
                serde_json::from_str(&serde_json::to_string(&at).unwrap()).unwrap();
            let mut again = Stream::new(src.clone(), Some(&at));
            got.extend(rows(&mut again, 700 - cut));
            assert_eq!(got, all, "resumed after {cut} rows");
        }
        // the small source ran out and started again, and said so
        let notes = straight.take_notes();
        assert!(notes.iter().any(|n| n.contains("ran out")), "{notes:?}");
    }

    #[test]
    fn a_mixture_draws_documents_by_weight() {
        let dir = crate::testdir::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let docs: Vec<String> = (0..100).map(|i| format!("d{i}")).collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let mixed = vec![
            Source::documents(corpus(&a, &[("a.jsonl", &refs)]), 3.0),
            Source::documents(corpus(&b, &[("b.jsonl", &refs)]), 1.0),
        ];
        let mut s = Stream::new(source(mixed, 8, false, true), None);
        let got = rows(&mut s, 2000);
        let second = got.iter().filter(|r| r[0].0 == 1).count() as f64 / 2000.0;
        assert!((second - 0.25).abs() < 0.03, "{second}");
    }

    #[test]
    fn a_shard_changed_under_a_running_stream_is_an_error_naming_it() {
        let dir = crate::testdir::tempdir().unwrap();
        let c = corpus(dir.path(), &[("a.jsonl", &["abc"]), ("b.jsonl", &["de"])]);
        let mut s = Stream::new(source(one(c), 8, false, false), None);
        s.next_row().unwrap();
        // b.jsonl is opened after a.jsonl: rewritten in between
        std::fs::write(dir.path().join("b.jsonl"), "{\"text\": \"longer now\"}\n").unwrap();
        let e = (0..3).find_map(|_| s.next_row().err()).unwrap().to_string();
        assert!(
            e.contains("b.jsonl") && e.contains("changed while the run was reading it"),
            "{e}"
        );
    }

    #[test]
    fn shuffled_passes_differ_and_hold_the_same_documents() {
        let dir = crate::testdir::tempdir().unwrap();
        let docs: Vec<String> = (0..50).map(|i| format!("doc {i:03}")).collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let c = corpus(dir.path(), &[("a.jsonl", &refs)]);
        // one document per row (7 + EOS = 8 tokens, the width)
        let mut s = Stream::new(source(one(c), 8, false, true), None);
        let first = rows(&mut s, 50);
        let second = rows(&mut s, 50);
        assert_ne!(first, second);
        let sorted = |mut v: Vec<Row>| {
            v.sort();
            v
        };
        assert_eq!(sorted(first), sorted(second));
    }
}
