//! Documents as training data (`data.kind = "jsonl"` or `"parquet"`): each record's text is a
//! document, tokenized as transformers does (`tokenizer(text)["input_ids"]`, then the EOS id)
//! when it is read, and packed into rows of `model.block_size + 1` tokens (`packing.rs`).
//!
//! The training documents are a stream, never tokenized up front: a pass (an epoch) reads the
//! shards in a seeded order, and each shard in chunks of [`CHUNK`] documents, each chunk in a
//! seeded order of its own (a shuffle of shards plus a bounded buffer: a compressed or parquet
//! shard has no cheap random access). Passes follow each other without end; a run of documents
//! is as long as `train.max_steps` says. Rows are numbered over all passes; a step takes the
//! next global rows in order, so a batch, and a run, is the same for any world size.
//!
//! Where the stream stands is small and exact ([`DocumentsPosition`]): the pass, the shard and
//! the documents of it read, and the tokens of rows packed but not yet taken. A checkpoint
//! keeps it, and a resumed run goes on with the bits of a straight one.
//!
//! The evaluation documents are packed once, in file order, and held in memory
//! ([`PackedRows`]).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::packing::{PackedRow, Packer, Piece};
use super::records::{Document, Documents, Format};
use super::tokenizer::Tokenizer;
use super::DataError;
use crate::checkpoint::DocumentsPosition;

/// Documents read and shuffled together (the shuffle buffer): a shard is read in chunks of this
/// many documents, each chunk in a seeded order.
pub const CHUNK: usize = 4096;

/// Rows open at once while packing: a document goes into the first of them with room.
pub const WINDOW: usize = 32;

/// The id that fills a row past its documents (it is never a target, and it attends only to
/// itself).
pub const PAD: u32 = 0;

/// How a document becomes tokens, and tokens rows.
pub struct Encoder {
    pub tokenizer: Arc<Tokenizer>,
    /// The id each document ends with (none for bytes, which have no such token).
    pub eos: Option<u32>,
    /// Tokens per row: `model.block_size + 1` (a row's inputs and its targets, shifted by
    /// one).
    pub width: usize,
    /// `data.packing`.
    pub packing: bool,
}

impl Encoder {
    /// A document's ids: the tokenizer's (with its own special tokens, such as a BOS), then
    /// the EOS id.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = self.tokenizer.encode_document(text)?;
        ids.extend(self.eos);
        Ok(ids)
    }

    /// A packer of rows of this width.
    pub fn packer(&self) -> Packer {
        if self.packing {
            Packer::new(self.width, WINDOW)
        } else {
            Packer::unpacked(self.width)
        }
    }
}

/// Rows of documents in memory: `width` tokens each, and where each token's document starts
/// in its row (a padding token is a document of its own).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PackedRows {
    pub width: usize,
    pub tokens: Vec<u32>,
    pub starts: Vec<u32>,
}

impl PackedRows {
    pub fn new(width: usize) -> Self {
        PackedRows {
            width,
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len() / self.width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Appends a row of `pieces` (each a document or a piece of one), padded to the width.
    pub fn push<'a>(&mut self, pieces: impl IntoIterator<Item = &'a [u32]>) {
        let from = self.tokens.len();
        for p in pieces {
            let start = (self.tokens.len() - from) as u32;
            self.tokens.extend_from_slice(p);
            self.starts.extend(std::iter::repeat_n(start, p.len()));
        }
        let used = self.tokens.len() - from;
        debug_assert!(
            used <= self.width,
            "a row of {used} tokens in {}",
            self.width
        );
        for i in used..self.width {
            self.tokens.push(PAD);
            self.starts.push(i as u32);
        }
    }

    /// Row `i`'s tokens and starts, appended to `tokens` and `starts`.
    pub fn read(&self, i: usize, tokens: &mut Vec<u32>, starts: &mut Vec<u32>) {
        let r = i * self.width..(i + 1) * self.width;
        tokens.extend_from_slice(&self.tokens[r.clone()]);
        starts.extend_from_slice(&self.starts[r]);
    }

    /// How many of row `i`'s tokens are targets (a token whose next one is of its document).
    pub fn targets(&self, i: usize) -> usize {
        self.starts[i * self.width..(i + 1) * self.width]
            .windows(2)
            .filter(|w| w[0] == w[1])
            .count()
    }
}

/// A shard, and its size and time of change when the run started (a shard that changes under
/// a running job is an error, as a token file is).
#[derive(Debug, Clone)]
pub struct Shard {
    pub path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
}

impl Shard {
    pub fn of(path: PathBuf, key: &'static str) -> Result<Shard, DataError> {
        let meta = std::fs::metadata(&path).map_err(|source| DataError::Io {
            path: path.clone(),
            key,
            source,
        })?;
        Ok(Shard {
            len: meta.len(),
            modified: meta.modified().ok(),
            path,
        })
    }

    fn unchanged(&self, key: &'static str) -> Result<(), DataError> {
        let now = Shard::of(self.path.clone(), key)?;
        if now.len != self.len || now.modified != self.modified {
            return Err(DataError::Invalid(format!(
                "{} ({key}) changed while the run was reading it (it had {} bytes, now {}): a run's documents must stay as they were when it started; restore the file, or start a new run",
                self.path.display(),
                self.len,
                now.len
            )));
        }
        Ok(())
    }
}

/// The documents of a run (`data.path`): its shards, their format and the text field.
pub struct Corpus {
    pub shards: Vec<Shard>,
    pub format: Format,
    pub field: String,
    /// The config key that named the shards, for errors.
    pub key: &'static str,
}

impl Corpus {
    /// The shards `spec` names (a file, a directory or a glob).
    pub fn open(
        spec: &std::path::Path,
        format: Format,
        field: &str,
        key: &'static str,
    ) -> Result<Corpus, DataError> {
        let shards = super::records::shards(spec, format, key)?
            .into_iter()
            .map(|p| Shard::of(p, key))
            .collect::<Result<_, _>>()?;
        Ok(Corpus {
            shards,
            format,
            field: field.to_string(),
            key,
        })
    }

    /// Every document, in file order, packed into rows (the evaluation data).
    pub fn pack_all(&self, enc: &Encoder) -> Result<PackedRows, DataError> {
        let mut rows = PackedRows::new(enc.width);
        let mut packer = enc.packer();
        let mut held: HashMap<usize, Vec<u32>> = HashMap::new();
        let put =
            |rows: &mut PackedRows, closed: Vec<PackedRow>, held: &HashMap<usize, Vec<u32>>| {
                for r in closed {
                    rows.push(r.pieces.iter().map(|p| &held[&p.doc][p.tokens.clone()]));
                }
            };
        for shard in &self.shards {
            for doc in Documents::open(
                &shard.path,
                self.format,
                &self.field,
                "data.text_field",
                self.key,
            )? {
                let doc = doc?;
                let ids = encode_at(enc, &doc, shard, self.key)?;
                let n = packer.next_doc();
                let len = ids.len();
                held.insert(n, ids);
                let closed = packer.push(len);
                put(&mut rows, closed, &held);
                // (documents no open row holds are dropped)
                let open: std::collections::HashSet<usize> = packer
                    .open_rows()
                    .flat_map(|r| r.pieces.iter().map(|p| p.doc))
                    .collect();
                held.retain(|d, _| open.contains(d));
            }
        }
        let rest = packer.finish();
        put(&mut rows, rest, &held);
        Ok(rows)
    }
}

/// A document's ids, or an error naming its file and record.
fn encode_at(
    enc: &Encoder,
    doc: &Document,
    shard: &Shard,
    key: &'static str,
) -> Result<Vec<u32>, DataError> {
    enc.encode(&doc.text).map_err(|e| {
        DataError::Invalid(format!("{}: {}: {e} ({key})", shard.path.display(), doc.at))
    })
}

/// Everything a rank needs to read the training documents.
pub struct DocumentSource {
    pub corpus: Corpus,
    pub encoder: Encoder,
    /// `sampler.shuffle` and `sampler.seed`.
    pub shuffle: bool,
    pub seed: u64,
}

impl DocumentSource {
    /// One line for `kiln check` and the start of `kiln run`: the shards, the tokenizer and its
    /// EOS id (and where that was found), the rows and the order.
    pub fn describe(&self) -> String {
        let e = &self.encoder;
        let eos = match e.tokenizer.eos() {
            Some((id, from)) => format!("EOS id {id} ({from})"),
            None => "no EOS id (bytes have none: documents are kept apart by packing alone)".into(),
        };
        format!(
            "documents: {} shard{} of {} ({}), field `{}`, tokenizer {}, {eos}; {} into rows of {} tokens; {}",
            self.corpus.shards.len(),
            if self.corpus.shards.len() == 1 { "" } else { "s" },
            self.corpus.format.name(),
            self.corpus.key,
            self.corpus.field,
            e.tokenizer.name(),
            if e.packing { "packed" } else { "one document per row" },
            e.width,
            if self.shuffle {
                format!("shards in a seeded order, documents shuffled in chunks of {CHUNK}")
            } else {
                "in file order".into()
            }
        )
    }
}

impl std::fmt::Debug for DocumentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DocumentSource({} shards of {})",
            self.corpus.shards.len(),
            self.corpus.format.name()
        )
    }
}

/// A row as the stream hands it out: its pieces' tokens.
pub type Row = Vec<Vec<u32>>;

/// The shard a pass is reading: its documents, and the current chunk in its shuffled order.
struct Reading {
    docs: Documents,
    /// The shard's index among the corpus's shards.
    index: usize,
    chunk: Vec<Document>,
    /// Documents of the shard read before `chunk`.
    chunk_start: usize,
}

/// The training documents as rows, in order, from a position on.
pub struct Stream {
    src: Arc<DocumentSource>,
    epoch: u64,
    /// The shard (by place in the pass's order) and its documents read.
    shard: usize,
    doc: usize,
    reading: Option<Reading>,
    packer: Packer,
    /// The tokens of the documents that open rows hold pieces of, by number.
    held: HashMap<usize, Vec<u32>>,
    ready: VecDeque<Row>,
    rows: u64,
    /// A pass ended without a single document (an empty corpus cannot be trained on).
    empty_passes: u32,
}

impl Stream {
    /// The stream from its start, or from `at` (a checkpoint's).
    pub fn new(src: Arc<DocumentSource>, at: Option<&DocumentsPosition>) -> Stream {
        let mut s = Stream {
            packer: src.encoder.packer(),
            src,
            epoch: 0,
            shard: 0,
            doc: 0,
            reading: None,
            held: HashMap::new(),
            ready: VecDeque::new(),
            rows: 0,
            empty_passes: 0,
        };
        if let Some(p) = at {
            s.epoch = p.epoch;
            s.shard = p.shard;
            s.doc = p.doc;
            s.rows = p.rows;
            s.ready = p.ready.iter().cloned().collect();
            // each piece of an open row is a document of its own to the packer: its place and
            // length are all packing looks at
            let mut open = Vec::with_capacity(p.open.len());
            for row in &p.open {
                let mut r = PackedRow::default();
                for piece in row {
                    let n = s.held.len();
                    s.held.insert(n, piece.clone());
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
            epoch: self.epoch,
            shard: self.shard,
            doc: self.doc,
            rows: self.rows,
            ready: self.ready.iter().cloned().collect(),
            open: self.packer.open_rows().map(|r| self.tokens_of(r)).collect(),
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

    /// The pass the stream is in (from 0).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn tokens_of(&self, r: &PackedRow) -> Row {
        r.pieces
            .iter()
            .map(|p| self.held[&p.doc][p.tokens.clone()].to_vec())
            .collect()
    }

    /// The next row.
    pub fn next_row(&mut self) -> Result<Row, DataError> {
        loop {
            if let Some(r) = self.ready.pop_front() {
                self.rows += 1;
                return Ok(r);
            }
            match self.next_document()? {
                Some(ids) => {
                    self.empty_passes = 0;
                    let n = self.packer.next_doc();
                    let len = ids.len();
                    self.held.insert(n, ids);
                    let closed = self.packer.push(len);
                    self.close(closed);
                }
                None => {
                    // the end of a pass: its open rows close, and the next pass begins
                    let closed = self.packer.finish();
                    let any = !closed.is_empty();
                    self.close(closed);
                    self.held.clear();
                    self.epoch += 1;
                    self.shard = 0;
                    self.doc = 0;
                    self.reading = None;
                    if !any && self.ready.is_empty() {
                        self.empty_passes += 1;
                        if self.empty_passes > 1 {
                            return Err(DataError::Invalid(format!(
                                "{}: no document has any token",
                                self.src.corpus.key
                            )));
                        }
                    }
                }
            }
        }
    }

    fn close(&mut self, closed: Vec<PackedRow>) {
        for r in &closed {
            let row = self.tokens_of(r);
            self.ready.push_back(row);
        }
        if !closed.is_empty() {
            let open: std::collections::HashSet<usize> = self
                .packer
                .open_rows()
                .flat_map(|r| r.pieces.iter().map(|p| p.doc))
                .collect();
            self.held.retain(|d, _| open.contains(d));
        }
    }

    /// The shards of pass `epoch`, in the order it reads them.
    fn shard_order(&self, epoch: u64) -> Vec<usize> {
        let n = self.src.corpus.shards.len();
        if self.src.shuffle {
            crate::rng::Rng::stream(self.src.seed, "document shards", &[epoch]).permutation(n)
        } else {
            (0..n).collect()
        }
    }

    /// The next document's ids in this pass, or `None` at its end (documents without a token
    /// are passed over).
    fn next_document(&mut self) -> Result<Option<Vec<u32>>, DataError> {
        let src = self.src.clone();
        let corpus = &src.corpus;
        loop {
            if self.reading.is_none() {
                let order = self.shard_order(self.epoch);
                let Some(&index) = order.get(self.shard) else {
                    return Ok(None);
                };
                let shard = &corpus.shards[index];
                shard.unchanged(corpus.key)?;
                let mut docs = Documents::open(
                    &shard.path,
                    corpus.format,
                    &corpus.field,
                    "data.text_field",
                    corpus.key,
                )?;
                // the chunk the position is in: the documents before it are read past
                let chunk_start = self.doc / CHUNK * CHUNK;
                for _ in 0..chunk_start {
                    match docs.next() {
                        Some(d) => {
                            d?;
                        }
                        None => break,
                    }
                }
                self.reading = Some(Reading {
                    docs,
                    index,
                    chunk: Vec::new(),
                    chunk_start,
                });
                self.fill_chunk()?;
            }
            let Some(r) = self.reading.as_mut() else {
                continue;
            };
            let k = self.doc - r.chunk_start;
            if k >= r.chunk.len() {
                if r.chunk.len() < CHUNK {
                    // the shard's end
                    self.reading = None;
                    self.shard += 1;
                    self.doc = 0;
                    continue;
                }
                r.chunk_start += r.chunk.len();
                self.fill_chunk()?;
                continue;
            }
            let doc = &r.chunk[k];
            let ids = encode_at(&src.encoder, doc, &corpus.shards[r.index], corpus.key)?;
            self.doc += 1;
            if !ids.is_empty() {
                return Ok(Some(ids));
            }
        }
    }

    /// Reads the next chunk of the shard being read, in its seeded order.
    fn fill_chunk(&mut self) -> Result<(), DataError> {
        let (shuffle, seed, epoch) = (self.src.shuffle, self.src.seed, self.epoch);
        let Some(r) = self.reading.as_mut() else {
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
                &[epoch, r.index as u64, (r.chunk_start / CHUNK) as u64],
            )
            .permutation(chunk.len());
            let mut slots: Vec<Option<Document>> = chunk.into_iter().map(Some).collect();
            chunk = perm.iter().filter_map(|&i| slots[i].take()).collect();
        }
        r.chunk = chunk;
        Ok(())
    }
}

/// The documents the config names (`data.kind = "jsonl"` or `"parquet"`): the training
/// stream, and the evaluation documents packed.
pub fn load(r: &crate::config::Resolved) -> Result<super::Data, DataError> {
    let c = &r.config.data;
    let format = match c.kind {
        crate::config::DataKind::Parquet => Format::Parquet,
        _ => Format::Jsonl,
    };
    let Some(path) = &c.path else {
        return Err(DataError::Invalid(format!(
            "`data.kind` = \"{}\" needs `data.path`",
            format.name()
        )));
    };
    let tokenizer = super::tokenizer::from_config(r)?;
    super::text::check_vocab(r, &tokenizer)?;
    let encoder = Encoder {
        eos: tokenizer.eos().map(|(id, _)| id),
        tokenizer: Arc::new(tokenizer),
        width: r.config.model.block_size.unwrap_or(128).max(1) + 1,
        packing: c.packing,
    };
    let eval = match &c.eval_path {
        Some(p) => {
            let corpus = Corpus::open(
                &r.path_of("data.eval_path", p),
                format,
                &c.text_field,
                "data.eval_path",
            )?;
            let rows = corpus.pack_all(&encoder)?;
            if rows.is_empty() {
                return Err(DataError::Invalid(format!(
                    "`data.eval_path` = {p:?}: no evaluation document has any token"
                )));
            }
            Some(super::Dataset::packed(rows))
        }
        None => None,
    };
    let corpus = Corpus::open(
        &r.path_of("data.path", path),
        format,
        &c.text_field,
        "data.path",
    )?;
    // the first document is read now: a file that is not what it should be fails here, before
    // the run writes anything
    let src = DocumentSource {
        corpus,
        encoder,
        shuffle: r.config.sampler.shuffle,
        seed: r.config.sampler.seed,
    };
    let src = Arc::new(src);
    Stream::new(src.clone(), None).next_row()?;
    Ok(super::Data {
        train: super::Dataset::stream(src),
        eval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn source(c: Corpus, width: usize, packing: bool, shuffle: bool) -> Arc<DocumentSource> {
        Arc::new(DocumentSource {
            corpus: c,
            encoder: Encoder {
                tokenizer: Arc::new(Tokenizer::Bytes),
                eos: Some(0),
                width,
                packing,
            },
            shuffle,
            seed: 5,
        })
    }

    fn rows(s: &mut Stream, n: usize) -> Vec<Row> {
        (0..n).map(|_| s.next_row().unwrap()).collect()
    }

    #[test]
    fn rows_hold_whole_documents_with_their_eos_and_passes_follow_each_other() {
        let dir = crate::testdir::tempdir().unwrap();
        let c = corpus(dir.path(), &[("a.jsonl", &["abc", "de", "fghij"])]);
        let mut s = Stream::new(source(c, 8, true, false), None);
        let got = rows(&mut s, 4);
        let b = |t: &str| {
            let mut v: Vec<u32> = t.bytes().map(u32::from).collect();
            v.push(0);
            v
        };
        // "abc"+EOS (4) and "de"+EOS (3) share a row; "fghij"+EOS (6) has its own; the pass
        // ends and the next one starts the same way
        assert_eq!(got[0], vec![b("abc"), b("de")]);
        assert_eq!(got[1], vec![b("fghij")]);
        assert_eq!(got[2], got[0]);
        // (the second pass's last row closed at its end)
        assert_eq!(s.epoch(), 2);
        assert_eq!(s.rows(), 4);
    }

    #[test]
    fn a_stream_resumed_from_its_position_gives_the_same_rows() {
        let dir = crate::testdir::tempdir().unwrap();
        let docs: Vec<String> = (0..300).map(|i| "x".repeat(1 + (i * 7) % 23)).collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let c = corpus(
            dir.path(),
            &[("a.jsonl", &refs[..200]), ("b.jsonl", &refs[200..])],
        );
        let src = source(c, 16, true, true);
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
    }

    #[test]
    fn shuffled_passes_differ_and_hold_the_same_documents() {
        let dir = crate::testdir::tempdir().unwrap();
        let docs: Vec<String> = (0..50).map(|i| format!("doc {i:03}")).collect();
        let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
        let c = corpus(dir.path(), &[("a.jsonl", &refs)]);
        // one document per row (7 + EOS = 8 tokens, the width)
        let mut s = Stream::new(source(c, 8, false, true), None);
        let first = rows(&mut s, 50);
        let second = rows(&mut s, 50);
        assert_ne!(first, second);
        let sorted = |mut v: Vec<Row>| {
            v.sort();
            v
        };
        assert_eq!(sorted(first), sorted(second));
    }

    #[test]
    fn packed_rows_pad_with_documents_of_one_token() {
        let mut r = PackedRows::new(6);
        r.push([&[7u32, 8][..], &[9][..]]);
        assert_eq!(r.tokens, [7, 8, 9, PAD, PAD, PAD]);
        assert_eq!(r.starts, [0, 0, 2, 3, 4, 5]);
        assert_eq!(r.targets(0), 1);
    }
}
