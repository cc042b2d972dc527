//! Documents as training data (`data.kind = "jsonl"` or `"parquet"`): each record's text is a
//! document, tokenized as transformers does (`tokenizer(text)["input_ids"]`, then the EOS id)
//! when it is read, and packed into rows of `model.block_size + 1` tokens (`packing.rs`).
//! Here: how a document becomes tokens ([`Encoder`]), rows in memory ([`PackedRows`]), the
//! shards of a corpus, the sources of a run ([`DocumentSource`]: `data.path`, or `data.mix`)
//! and `load`. The training documents are a stream, never tokenized up front (`stream.rs`);
//! the evaluation documents are packed once, in file order, and held in memory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use super::packing::{PackedRow, Packer};
use super::records::{Content, Document, Documents, Format, Shape};
use super::tokenizer::Tokenizer;
use super::DataError;
use crate::checkpoint::DocumentsPosition;

/// Documents read and shuffled together (the shuffle buffer): a shard is read in chunks of this
/// many documents, each chunk in a seeded order.
pub const CHUNK: usize = 4096;

/// Rows open at once while packing: a document goes into the first of them with room.
pub const WINDOW: usize = 32;

/// The id that fills a row past its documents (it is never a target, and it attends only to
/// itself). A row holds it as `PAD | PADDING`.
pub const PAD: u32 = 0;

/// A row's position past its documents, marked from the packer to `Task::split`, which takes
/// the bit off the input id (the input is `PAD`, never a target) and tells the model where the
/// padding is (`Forward::padding`: a mixture of experts leaves those positions out of its
/// router's statistics, as transformers' `attention_mask` does). Ids stay below 2^30.
pub const PADDING: u32 = 1 << 30;

/// A token a document holds but the loss does not predict (a prompt's, a user's turn): its id
/// with this bit set, from the encoder through the stream, its checkpointed rows and the packed
/// rows to `Task::split`, which takes the bit off the input id and makes the target
/// `kernels::IGNORE` (transformers' label -100). Ids stay below 2^30 (`PADDING`).
pub const NO_LOSS: u32 = 1 << 31;

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
    /// `data.train_on_prompt`: the loss on a prompt's (a conversation's other turns') tokens
    /// too.
    pub train_on_prompt: bool,
    /// The chat template conversations are rendered with (`data.format = "messages"`).
    pub template: Option<Arc<super::chat::ChatTemplate>>,
    /// `data.truncation`: a prompt-completion or a conversation longer than a row.
    pub truncation: crate::config::Truncation,
}

/// What became of a record that is longer than a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// It fits, or it is a text (cut into pieces of a row when packed).
    Whole,
    /// A prompt-completion or a conversation: its first row of tokens kept.
    Truncated,
    /// A prompt-completion or a conversation left out (`data.truncation = "drop"`).
    Dropped,
}

impl Encoder {
    /// A record's ids as `encode` gives them, a prompt-completion or a conversation longer than
    /// a row truncated or dropped (no ids) as `data.truncation` says.
    pub fn fit(&self, content: &Content) -> Result<(Vec<u32>, Fit), String> {
        let mut ids = self.encode(content)?;
        if matches!(content, Content::Text(_)) || ids.len() <= self.width {
            return Ok((ids, Fit::Whole));
        }
        Ok(match self.truncation {
            crate::config::Truncation::Right => {
                ids.truncate(self.width);
                (ids, Fit::Truncated)
            }
            crate::config::Truncation::Drop => (Vec::new(), Fit::Dropped),
        })
    }

    /// A record's ids, the tokens without a loss marked `NO_LOSS`. A text: the tokenizer's ids
    /// (`tokenizer(text)["input_ids"]`), then the EOS id. A prompt and its completion:
    /// `tokenizer(prompt)` + `tokenizer(completion, add_special_tokens=False)` + EOS, the
    /// prompt's without a loss (unless `data.train_on_prompt`). A conversation: the chat
    /// template's ids (`apply_chat_template(messages, tokenize=True)`), the loss on the
    /// assistant's turns alone (`chat.rs`).
    pub fn encode(&self, content: &Content) -> Result<Vec<u32>, String> {
        let mut ids = match content {
            Content::Text(text) => self.tokenizer.encode_document(text)?,
            Content::PromptCompletion { prompt, completion } => {
                let mut ids = self.tokenizer.encode_document(prompt)?;
                if !self.train_on_prompt {
                    for t in &mut ids {
                        *t |= NO_LOSS;
                    }
                }
                ids.extend(self.tokenizer.encode(completion.as_bytes())?.0);
                ids
            }
            Content::Messages(messages) => {
                let Some(t) = &self.template else {
                    return Err("a conversation, but the tokenizer has no chat template: set `data.chat_template` to a Jinja file".into());
                };
                return t.encode(messages, &self.tokenizer, self.train_on_prompt);
            }
        };
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
    /// Each row's tokens that are not padding.
    pub used: Vec<usize>,
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
        self.used.push(used);
        for i in used..self.width {
            self.tokens.push(PAD | PADDING);
            self.starts.push(i as u32);
        }
    }

    /// Row `i`'s tokens and starts, appended to `tokens` and `starts`.
    pub fn read(&self, i: usize, tokens: &mut Vec<u32>, starts: &mut Vec<u32>) {
        let r = i * self.width..(i + 1) * self.width;
        tokens.extend_from_slice(&self.tokens[r.clone()]);
        starts.extend_from_slice(&self.starts[r]);
    }

    /// How many of row `i`'s tokens are targets (the next token is of its document and has a
    /// loss).
    pub fn targets(&self, i: usize) -> usize {
        let r = i * self.width..(i + 1) * self.width;
        let (starts, tokens) = (&self.starts[r.clone()], &self.tokens[r]);
        (1..self.width)
            .filter(|&j| starts[j] == starts[j - 1] && tokens[j] & NO_LOSS == 0)
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

    pub(super) fn unchanged(&self, key: &'static str) -> Result<(), DataError> {
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

/// The documents of a run (`data.path`): its shards, their format and what a record holds.
pub struct Corpus {
    pub shards: Vec<Shard>,
    pub format: Format,
    /// What each record holds: a text (its field, and the key that names it:
    /// `data.text_field`, or `data.mix` for a source that names its own), a prompt and its
    /// completion, or a conversation.
    pub shape: Shape,
    /// The config key that named the shards, for errors (`data.mix` for all of a mixture's).
    pub key: &'static str,
    /// The corpus in messages: its key, `data.mix[1]` for a mixture's second source.
    pub name: String,
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
            shape: Shape::Text {
                field: field.to_string(),
                key: "data.text_field",
            },
            key,
            name: key.to_string(),
        })
    }

    /// The documents of `shard` (one of this corpus's), read with its shape and keys.
    pub fn documents(&self, shard: &Shard) -> Result<Documents, DataError> {
        Documents::open_shape(&shard.path, self.format, &self.shape, self.key)
    }

    /// The shape `data.format` gives its records: `"auto"` tells it by its first shard's first
    /// record (a conversation in `data.messages_field`, else `prompt` and `completion`, else
    /// the text of its text shape).
    pub fn with_format(mut self, d: &crate::config::DataConfig) -> Result<Corpus, DataError> {
        use crate::config::RecordFormat;
        let messages = Shape::Messages {
            field: d.messages_field.clone(),
        };
        self.shape = match d.format {
            RecordFormat::Text => self.shape,
            RecordFormat::PromptCompletion => Shape::PromptCompletion,
            RecordFormat::Messages => messages,
            RecordFormat::Auto => {
                let fields =
                    super::records::first_fields(&self.shards[0].path, self.format, self.key)?;
                let has = |f: &str| fields.iter().any(|g| g == f);
                // (a `data.messages_field` of one's own says the records are conversations)
                if has(&d.messages_field) || d.messages_field != "messages" {
                    messages
                } else if has("prompt") && has("completion") {
                    Shape::PromptCompletion
                } else {
                    self.shape
                }
            }
        };
        Ok(self)
    }

    /// Each shard's first record: an empty shard, or one whose records are not JSON or lack
    /// the text field, is found before a run starts (records further in, when the stream
    /// reaches them).
    pub fn check_first_records(&self) -> Result<(), DataError> {
        for shard in &self.shards {
            if let Some(first) = self.documents(shard)?.next() {
                first?;
            }
        }
        Ok(())
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
            for doc in self.documents(shard)? {
                let doc = doc?;
                let (ids, _) = encode_at(enc, &doc, shard, &self.name)?;
                if ids.is_empty() {
                    continue;
                }
                let n = packer.next_doc();
                let len = ids.len();
                held.insert(n, ids);
                let closed = packer.push(len);
                put(&mut rows, closed, &held);
                // (documents no open row holds are dropped)
                let open = packer.open_docs();
                held.retain(|d, _| open.contains(d));
            }
        }
        let rest = packer.finish();
        put(&mut rows, rest, &held);
        Ok(rows)
    }
}

/// A document's ids (fitted to a row: `Encoder::fit`) and what became of it, or an error naming
/// its file and record (and the corpus, `name`).
pub fn encode_at(
    enc: &Encoder,
    doc: &Document,
    shard: &Shard,
    name: &str,
) -> Result<(Vec<u32>, Fit), DataError> {
    enc.fit(&doc.content).map_err(|e| {
        DataError::Invalid(format!(
            "{}: {}: {e} ({name})",
            shard.path.display(),
            doc.at
        ))
    })
}

/// What a source of the stream reads: records of documents, or the windows of a text or token
/// file (`data.mix` of `data.kind = "text"` or `"tokens"`: each window is a "document" that
/// fills a row, so the mixture's draw, its passes and its position are the documents' own).
pub enum Origin {
    Documents(Corpus),
    Windows(super::mixture::WindowFile),
}

/// Where documents come from: one corpus (`data.path`), or several mixed by weight
/// (`data.mix`).
pub struct Source {
    pub origin: Origin,
    /// The share of documents drawn from it, relative to the others' (1 alone).
    pub weight: f64,
}

impl Source {
    /// A source of documents.
    pub fn documents(corpus: Corpus, weight: f64) -> Source {
        Source {
            origin: Origin::Documents(corpus),
            weight,
        }
    }

    /// The source in messages: its key, `data.mix[1]` for a mixture's second source.
    pub fn name(&self) -> &str {
        match &self.origin {
            Origin::Documents(c) => &c.name,
            Origin::Windows(w) => &w.name,
        }
    }

    /// Its records of documents (`None` for the windows of a file).
    pub fn corpus(&self) -> Option<&Corpus> {
        match &self.origin {
            Origin::Documents(c) => Some(c),
            Origin::Windows(_) => None,
        }
    }

    /// Its files: their names and sizes (`DocumentsPosition::files`).
    fn files(&self) -> Vec<(String, u64)> {
        let name = |p: &std::path::Path| {
            p.file_name().map_or_else(
                || p.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
        };
        match &self.origin {
            Origin::Documents(c) => c.shards.iter().map(|sh| (name(&sh.path), sh.len)).collect(),
            Origin::Windows(w) => vec![(name(&w.path), w.bytes)],
        }
    }
}

/// Everything a rank needs to read the training documents.
pub struct DocumentSource {
    pub sources: Vec<Source>,
    /// `data.mix_stop = "first_exhausted"` (and a single source): a pass ends with the first
    /// source that runs out, and every source starts its next pass; otherwise a source that
    /// runs out starts its next pass alone.
    pub first_exhausted: bool,
    pub encoder: Encoder,
    /// `sampler.shuffle` and `sampler.seed`.
    pub shuffle: bool,
    pub seed: u64,
}

impl DocumentSource {
    /// One line for `kiln check` and the start of `kiln run`: the shards, the tokenizer and its
    /// EOS id (and where that was found), the rows and the order.
    pub fn describe(&self) -> String {
        if self.sources.iter().all(|s| s.corpus().is_none()) {
            return super::mixture::describe(self);
        }
        let e = &self.encoder;
        let eos = match e.tokenizer.eos() {
            Some((id, from)) => format!("EOS id {id} ({from})"),
            None => "no EOS id (bytes have none: documents are kept apart by packing alone)".into(),
        };
        let total: f64 = self.sources.iter().map(|s| s.weight).sum();
        let sources: Vec<String> = self
            .sources
            .iter()
            .filter_map(|s| Some((s, s.corpus()?)))
            .map(|(s, c)| {
                let share = if self.sources.len() > 1 {
                    format!(", {:.1}% of documents", 100.0 * s.weight / total)
                } else {
                    String::new()
                };
                let holds = match &c.shape {
                    Shape::Text { field, .. } => format!("field `{field}`"),
                    Shape::PromptCompletion => {
                        "prompt and completion (the loss on the completion)".to_string()
                    }
                    Shape::Messages { field } => format!(
                        "conversations in `{field}` (the loss on the assistant's turns), chat template {}",
                        e.template.as_ref().map_or("?".into(), |t| t.origin.clone())
                    ),
                };
                format!(
                    "{} shard{} of {} ({}), {holds}{share}",
                    c.shards.len(),
                    if c.shards.len() == 1 { "" } else { "s" },
                    c.format.name(),
                    c.name,
                )
            })
            .collect();
        format!(
            "documents: {}; tokenizer {}, {eos}; {} into rows of {} tokens; {}",
            sources.join("; "),
            e.tokenizer.name(),
            if e.packing {
                "packed"
            } else {
                "one document per row"
            },
            e.width,
            if self.shuffle {
                format!("shards in a seeded order, documents shuffled in chunks of {CHUNK}")
            } else {
                "in file order".into()
            }
        )
    }
}

impl DocumentSource {
    /// Each source's shards: their file names and sizes (`DocumentsPosition::files`).
    pub fn files(&self) -> Vec<Vec<(String, u64)>> {
        self.sources.iter().map(Source::files).collect()
    }

    /// A checkpoint's position can go on over these files: the same shards, of the same sizes
    /// (a checkpoint written before positions kept them is taken as it is).
    pub fn check_resume(&self, at: &DocumentsPosition) -> Result<(), DataError> {
        let now = self.files();
        if at.files.is_empty() || at.files == now {
            return Ok(());
        }
        for (i, (was, is)) in at.files.iter().zip(&now).enumerate() {
            if was != is {
                let name = self.sources[i].name();
                let show = |f: &[(String, u64)]| {
                    let v: Vec<String> = f
                        .iter()
                        .take(6)
                        .map(|(n, b)| format!("{n} ({b} bytes)"))
                        .collect();
                    format!("{}{}", v.join(", "), if f.len() > 6 { ", ..." } else { "" })
                };
                return Err(DataError::Invalid(format!(
                    "{name}: the shards are not those of the checkpoint, which stands at a place in them (it had {} shard(s): {}; now {}: {})\n  = help: resume over the files the run started with, or start a new run",
                    was.len(),
                    crate::ui::printable(&show(was)),
                    is.len(),
                    crate::ui::printable(&show(is))
                )));
            }
        }
        Err(DataError::Invalid(format!(
            "the checkpoint's documents have {} source(s), the config {}\n  = help: resume with the `data.mix` the run started with",
            at.files.len(),
            now.len()
        )))
    }
}

impl std::fmt::Debug for DocumentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DocumentSource({} sources)", self.sources.len())
    }
}

/// The documents the config names (`data.kind = "jsonl"` or `"parquet"`): the training
/// stream (`data.path`, or the sources of `data.mix`), and the evaluation documents packed.
pub fn load(r: &crate::config::Resolved) -> Result<super::Data, DataError> {
    let c = &r.config.data;
    let format = match c.kind {
        crate::config::DataKind::Parquet => Format::Parquet,
        _ => Format::Jsonl,
    };
    let sources = sources(r, format)?;
    let eval = match &c.eval_path {
        Some(p) => Some(
            Corpus::open(
                &r.path_of("data.eval_path", p),
                format,
                &c.text_field,
                "data.eval_path",
            )?
            .with_format(c)?,
        ),
        None => None,
    };
    let conversations = sources
        .iter()
        .filter_map(Source::corpus)
        .chain(eval.as_ref())
        .any(|c| matches!(c.shape, Shape::Messages { .. }));
    let encoder = encoder(r, conversations)?;
    let eval = match eval {
        Some(corpus) => {
            let rows = corpus.pack_all(&encoder)?;
            if rows.is_empty() {
                return Err(DataError::Invalid(format!(
                    "`data.eval_path` = {:?}: no evaluation document has any token",
                    c.eval_path.as_deref().unwrap_or_default()
                )));
            }
            Some(super::Dataset::packed(rows))
        }
        None => None,
    };
    let src = DocumentSource {
        sources,
        first_exhausted: c.mix_stop == crate::config::MixStop::FirstExhausted,
        encoder,
        shuffle: r.config.sampler.shuffle,
        seed: r.config.sampler.seed,
    };
    // each shard's first record is read now, and the first row: a file that is not what it
    // should be (empty, not JSON, without the field, a column that is not text) fails here,
    // before the run writes anything
    for c in src.sources.iter().filter_map(Source::corpus) {
        c.check_first_records()?;
    }
    let src = Arc::new(src);
    super::stream::Stream::new(src.clone(), None).next_row()?;
    Ok(super::Data {
        train: super::Dataset::stream(src),
        eval,
    })
}

/// The training sources: `data.path`, or each of `data.mix`, each of the shape `data.format`
/// gives (or its first record tells).
fn sources(r: &crate::config::Resolved, format: Format) -> Result<Vec<Source>, DataError> {
    let c = &r.config.data;
    match &c.path {
        Some(path) => Ok(vec![Source::documents(
            Corpus::open(
                &r.path_of("data.path", path),
                format,
                &c.text_field,
                "data.path",
            )?
            .with_format(c)?,
            1.0,
        )]),
        None if !c.mix.is_empty() => c
            .mix
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let field = m.text_field.as_deref().unwrap_or(&c.text_field);
                let mut corpus =
                    Corpus::open(&r.path_of("data.mix", &m.path), format, field, "data.mix")?;
                corpus.name = format!("data.mix[{i}]");
                if m.text_field.is_some() {
                    corpus.shape = Shape::Text {
                        field: field.to_string(),
                        key: "data.mix",
                    };
                }
                Ok(Source::documents(corpus.with_format(c)?, m.weight))
            })
            .collect(),
        None => Err(DataError::Invalid(format!(
            "`data.kind` = \"{}\" needs `data.path` (or `data.mix`)",
            format.name()
        ))),
    }
}

/// The encoder the config describes: its tokenizer and EOS id, rows, and (for
/// `conversations`) the chat template, which must then be found.
pub fn encoder(r: &crate::config::Resolved, conversations: bool) -> Result<Encoder, DataError> {
    let c = &r.config.data;
    let tokenizer = super::tokenizer::from_config(r)?;
    super::text::check_vocab(r, &tokenizer)?;
    let template = if conversations {
        let file = super::chat::template_file(r);
        let found = super::chat::ChatTemplate::find(file.as_deref(), &tokenizer)
            .map_err(DataError::Invalid)?;
        let Some(t) = found else {
            return Err(DataError::Invalid(format!(
                "the records are conversations (`{}`), but the tokenizer {} has no chat template (no chat_template.jinja beside it, no `chat_template` in its tokenizer_config.json)\n  = help: set `data.chat_template` to a Jinja file (the model's own, from its Hugging Face directory)",
                c.messages_field,
                crate::ui::printable(&tokenizer.name())
            )));
        };
        Some(Arc::new(t))
    } else {
        None
    };
    Ok(Encoder {
        eos: tokenizer.eos().map(|(id, _)| id),
        tokenizer: Arc::new(tokenizer),
        width: r.config.model.block_size.unwrap_or(128).max(1) + 1,
        packing: c.packing,
        train_on_prompt: c.train_on_prompt,
        template,
        truncation: c.truncation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_rows_pad_with_documents_of_one_token() {
        let mut r = PackedRows::new(6);
        r.push([&[7u32, 8][..], &[9][..]]);
        assert_eq!(
            r.tokens,
            [7, 8, 9, PAD | PADDING, PAD | PADDING, PAD | PADDING]
        );
        assert_eq!(r.starts, [0, 0, 2, 3, 4, 5]);
        assert_eq!(r.targets(0), 1);
    }
}
