//! `[data]`: where the samples come from and how they are loaded.

use serde::{Deserialize, Serialize};

use super::error::ConfigError;
use super::load::Resolved;
use super::validate::*;
#[allow(unused_imports)]
use super::*;

/// Dataset source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    Synthetic,
    Csv,
    Idx,
    Text,
    /// nanoGPT's token files: little-endian `u16` (or `u32`) ids, mapped.
    Tokens,
    /// JSON Lines records (`.jsonl`, `.jsonl.gz`, `.jsonl.zst`), each a document.
    Jsonl,
    /// Apache Parquet records, each a document.
    Parquet,
}

impl DataConfig {
    /// The training rows are a stream read in order (documents, or a mixture's windows), not
    /// samples the sampler numbers and shuffles.
    pub fn streams(&self) -> bool {
        self.kind.documents() || (self.kind.tokens() && !self.mix.is_empty())
    }
}

impl DataKind {
    /// Records of documents (`jsonl`, `parquet`): tokenized as they stream, packed into rows.
    pub fn documents(self) -> bool {
        matches!(self, DataKind::Jsonl | DataKind::Parquet)
    }

    /// Data of token ids for a language model (text, token files, documents).
    pub fn tokens(self) -> bool {
        matches!(self, DataKind::Text | DataKind::Tokens) || self.documents()
    }
}

/// A source of a mixture (`data.mix`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MixSource {
    /// A file, a directory of shards or a glob, relative to the file that sets `data.mix`.
    pub path: String,
    /// Its documents' share, relative to the other sources' weights.
    #[serde(default = "one")]
    pub weight: f64,
    /// The field of its records that holds the text (else `data.text_field`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_field: Option<String>,
}

fn one() -> f64 {
    1.0
}

/// `data.mix_stop`: what a mixture does when a source runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MixStop {
    /// The source starts its next pass; the others go on.
    #[default]
    Restart,
    /// The pass ends for every source (`datasets.interleave_datasets`'s default).
    FirstExhausted,
}

/// `data.format`: what each record of jsonl or parquet holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RecordFormat {
    /// Told by the first record's fields: `data.messages_field` is a conversation, `prompt`
    /// and `completion` a prompt and its completion, anything else a text.
    #[default]
    Auto,
    /// A document in `data.text_field`.
    Text,
    /// String fields `prompt` and `completion` (TRL's prompt-completion datasets).
    PromptCompletion,
    /// A list of messages in `data.messages_field` (TRL's conversational datasets).
    Messages,
}

/// `data.truncation`: what becomes of a prompt-completion or a conversation longer than a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Truncation {
    /// Its first `model.block_size + 1` tokens are kept.
    #[default]
    Right,
    /// It is left out.
    Drop,
}

fn is_auto(f: &RecordFormat) -> bool {
    *f == RecordFormat::Auto
}

fn is_right(t: &Truncation) -> bool {
    *t == Truncation::Right
}

fn is_messages(s: &String) -> bool {
    s == "messages"
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_restart(m: &MixStop) -> bool {
    *m == MixStop::Restart
}

fn is_text(s: &String) -> bool {
    s == "text"
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_bytes(s: &String) -> bool {
    s == "bytes"
}

/// `data.dtype`: the element type of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenFileDtype {
    U16,
    U32,
}

/// `[data]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `"synthetic"` (a learnable classification task from a fixed random teacher), `"csv"`,
    /// `"idx"` (MNIST-style IDX image and label files, raw or `.gz`), `"text"` (any file as
    /// byte-level tokens, for `model.kind = "gpt"`), `"tokens"` (nanoGPT's token files,
    /// memory-mapped, for `model.kind = "gpt"`), or `"jsonl"` / `"parquet"` (records of
    /// documents, tokenized as they stream and packed into rows, for a language model; runs
    /// for `train.max_steps`). Default: `"synthetic"`.
    pub kind: DataKind,
    /// tokens: the file's element type, `"u16"` (nanoGPT's `prepare.py`) or `"u32"` (for
    /// vocabularies over 65,535). Default: `"u16"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TokenFileDtype>,
    /// text, tokens, jsonl, parquet: `"bytes"` (each byte a token), `"gpt2"` (GPT-2's BPE) or
    /// the path of a Hugging Face `tokenizer.json` (or of the directory that holds it); text
    /// files and documents are tokenized with it as they load, and
    /// `kiln sample` encodes the prompt and decodes the output with it (a token file's ids must
    /// come from it: `kiln tokenize`). Default: `"bytes"`.
    #[serde(skip_serializing_if = "is_bytes")]
    pub tokenizer: String,
    /// synthetic: training samples. Default: `1000`.
    pub samples: usize,
    /// synthetic: evaluation samples (drawn from the same teacher). Default: `200`.
    pub eval_samples: usize,
    /// synthetic: features per sample. Default: `1000`.
    pub features: usize,
    /// synthetic: make every sample an image of shape `[C, H, W]` (its C*H*W values replace
    /// `features`). Default: `[]` (flat samples of `features` values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image: Vec<usize>,
    /// synthetic: make every sample a window of `model.block_size + 1` random token ids below
    /// `vocab` (for gpt benchmarks). Called `tokens` before issue 44 (it read like
    /// `data.kind = "tokens"`, the token files): that name is still accepted. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none", alias = "tokens")]
    pub vocab: Option<usize>,
    /// Number of classes (csv: labels must be integers in 0..classes). Default: `10`.
    pub classes: usize,
    /// synthetic: seed of the teacher and the samples. Default: `0`.
    pub seed: u64,
    /// csv: the training file; idx: the training images; text: the text file; tokens: the
    /// token file; jsonl, parquet: a file, a directory (its `*.jsonl`, `*.jsonl.gz`,
    /// `*.jsonl.zst`, `*.ndjson` or `*.parquet` shards, in name order) or a glob of shards.
    /// Relative to the file that sets it. Default: unset (every kind but synthetic needs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// csv: the evaluation file; idx: the evaluation images; text, tokens: the held-out text or
    /// token file (windows every `model.block_size` tokens); jsonl, parquet: the evaluation
    /// documents (a file, a directory or a glob), packed once in file order. Relative to the
    /// file that sets it. Default: unset (no evaluation data; text and tokens without `data.mix`
    /// hold out `eval_fraction` of `path` instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_path: Option<String>,
    /// idx: the training labels (IDX1, raw or `.gz`). Relative to the file that sets it.
    /// Default: unset (idx needs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels_path: Option<String>,
    /// idx: the evaluation labels (IDX1, raw or `.gz`), with `eval_path`. Relative to the file
    /// that sets it. Default: unset (idx with an `eval_path` needs it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_labels_path: Option<String>,
    /// idx: `[mean, std]` applied to pixels after scaling them to [0, 1]. Default: `[]` (none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub normalize: Vec<f64>,
    /// text, tokens: tokens between the starts of consecutive training windows (each window is
    /// `model.block_size + 1` tokens). Default: `model.block_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stride: Option<usize>,
    /// text, tokens: the fraction at the end of the file held out for evaluation, in [0, 1)
    /// (without `data.eval_path` or `data.mix`). Default: `0.1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_fraction: Option<f64>,
    /// jsonl, parquet: the field (column) of each record that holds its text; other fields are
    /// not read. Default: `"text"`.
    #[serde(skip_serializing_if = "is_text")]
    pub text_field: String,
    /// jsonl, parquet: what each record holds: `"text"` (a document in `data.text_field`),
    /// `"prompt_completion"` (string fields `prompt` and `completion`: the ids are
    /// `tokenizer(prompt)` + `tokenizer(completion, add_special_tokens=False)` + EOS, the loss
    /// on the completion and the EOS) or `"messages"` (a conversation in
    /// `data.messages_field`, rendered with the chat template, the loss on the assistant's
    /// turns); `"auto"` tells them by the first record's fields. Default: `"auto"`.
    #[serde(skip_serializing_if = "is_auto")]
    pub format: RecordFormat,
    /// jsonl, parquet: the field of each record that holds its conversation, a list of
    /// `{"role": ..., "content": ...}` messages. Default: `"messages"`.
    #[serde(skip_serializing_if = "is_messages")]
    pub messages_field: String,
    /// jsonl, parquet: the Jinja chat template conversations are rendered with, a file
    /// relative to the file that sets it. Default: unset (the tokenizer's:
    /// `chat_template.jinja` beside its tokenizer.json, else the `chat_template` of its
    /// tokenizer_config.json).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// jsonl, parquet: the loss on every token of a prompt-completion or a conversation, the
    /// prompt's and the user's too. Default: `false` (the completion's, the assistant's).
    #[serde(skip_serializing_if = "is_false")]
    pub train_on_prompt: bool,
    /// jsonl, parquet: a prompt-completion or a conversation longer than a row
    /// (`model.block_size + 1` tokens): `"right"` keeps its first tokens, `"drop"` leaves it
    /// out; the run log and `kiln data stats` count them. (A text longer than a row is cut into
    /// pieces instead.) Default: `"right"`.
    #[serde(skip_serializing_if = "is_right")]
    pub truncation: Truncation,
    /// jsonl, parquet: pack documents side by side into rows of `model.block_size + 1`
    /// tokens (first fit among 32 open rows; a longer document is cut into pieces of a row
    /// each); attention, positions and targets stay inside each document. `false`: one
    /// document (or piece) per row, padded. Either way a token's loss is the one it has in its
    /// document alone. Default: `true`.
    #[serde(skip_serializing_if = "is_true")]
    pub packing: bool,
    /// jsonl, parquet, text, tokens: sources mixed by weight instead of `data.path`, each an
    /// inline table `{ path = "...", weight = 3.0, text_field = "..." }` (weight default 1;
    /// text_field, for records, default `data.text_field`): each document (text, tokens: each
    /// window of `model.block_size + 1` tokens of one file) comes from source i with
    /// probability weight_i / sum (as `datasets.interleave_datasets`' probabilities), drawn
    /// from `sampler.seed` and its number. Jsonl, parquet: a source is a file, a directory or a
    /// glob; text, tokens: one file, trained whole. A mixture is a stream: the run needs
    /// `train.max_steps`. Default: `[]` (no mixture).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mix: Vec<MixSource>,
    /// With `data.mix`: `"restart"` (a source that runs out starts its next
    /// pass, which the run log says) or `"first_exhausted"` (the first source that runs out
    /// ends the pass for all). Default: `"restart"`.
    #[serde(skip_serializing_if = "is_restart")]
    pub mix_stop: MixStop,
    /// csv: the label column, by header name or 0-based index (a string or an integer).
    /// Default: `"label"`.
    #[serde(deserialize_with = "name_or_index")]
    pub label_column: String,
    /// csv: whether the first line is a header. Default: `true`.
    pub header: bool,
    /// Loader threads of each rank that assemble the next micro-batches while the rank computes
    /// (torch `DataLoader(num_workers=N)`); 0 assembles them on the rank's own thread, between
    /// steps. They come out of the rank's share of the cores. The samples and every loss are the
    /// same for any value. Default: `0`.
    pub workers: usize,
    /// With `workers` > 0: micro-batches each rank has assembled or in assembly ahead of the one
    /// it computes on (torch `prefetch_factor`, but per rank rather than per worker). Default:
    /// `2`.
    pub prefetch: usize,
    /// `[data.augment]`: random transformations of training images (samples of shape
    /// `[C, H, W]`), drawn by (experiment seed, epoch, sample index), so the same under any
    /// number of workers or ranks and across a resume. Evaluation data is never augmented.
    /// Default: unset (none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augment: Option<AugmentConfig>,
}

/// `[data.augment]`, torchvision's `RandomCrop(size, padding)` then `RandomHorizontalFlip()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AugmentConfig {
    /// Pads each side of the image by this many pixels (with the value of a black pixel, after
    /// `data.normalize`) and crops a window of the original size at a random offset; 0 off.
    /// Default: `0`.
    pub random_crop: usize,
    /// Mirrors the image left to right with probability 1/2. Default: `false`.
    pub hflip: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            kind: DataKind::Synthetic,
            dtype: None,
            tokenizer: "bytes".into(),
            samples: 1000,
            eval_samples: 200,
            features: 1000,
            image: Vec::new(),
            vocab: None,
            classes: 10,
            seed: 0,
            path: None,
            eval_path: None,
            labels_path: None,
            eval_labels_path: None,
            normalize: Vec::new(),
            stride: None,
            eval_fraction: None,
            text_field: "text".into(),
            format: RecordFormat::Auto,
            messages_field: "messages".into(),
            chat_template: None,
            train_on_prompt: false,
            truncation: Truncation::Right,
            packing: true,
            mix: Vec::new(),
            mix_stop: MixStop::Restart,
            label_column: "label".into(),
            header: true,
            workers: 0,
            prefetch: 2,
            augment: None,
        }
    }
}

/// A column given by name (`"label"`) or 0-based index (`0` or `"0"`).
fn name_or_index<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        Name(String),
        Index(u64),
    }
    V::deserialize(d)
        .map(|v| match v {
            V::Name(s) => s,
            V::Index(i) => i.to_string(),
        })
        .map_err(|_| {
            serde::de::Error::custom("expected a column name (string) or a 0-based index (integer)")
        })
}

impl DataConfig {
    /// The source: its files exist, its keys go with its kind, its shapes are sizes.
    pub(super) fn check(&self, r: &Resolved) -> Result<(), ConfigError> {
        at_least(r, "data.classes", self.classes, 2)?;
        match self.normalize.as_slice() {
            [] => {}
            [mean, std] if *std > 0.0 && std.is_finite() && mean.is_finite() => {}
            other => {
                return Err(r.key_error(
                    "data.normalize",
                    format!(
                        "`data.normalize` = {other:?} is not [mean, std] with std > 0, both finite"
                    ),
                    Some("e.g. normalize = [0.1307, 0.3081], or leave it out".into()),
                ))
            }
        }
        if self.tokenizer != "bytes" && !self.kind.tokens() {
            return Err(r.key_error(
                "data.tokenizer",
                format!(
                    "`data.tokenizer` tokenizes text for a language model, but `data.kind` = \"{}\"",
                    choice_name(&self.kind)
                ),
                Some("remove it, or use `data.kind = \"text\"` (or \"tokens\", \"jsonl\", \"parquet\")".into()),
            ));
        }
        let tok = self.tokenizer.as_str();
        let file = |p: std::path::PathBuf| {
            if p.is_dir() {
                p.join("tokenizer.json")
            } else {
                p
            }
        };
        if !matches!(tok, "bytes" | "gpt2") && !file(r.path_of("data.tokenizer", tok)).is_file() {
            let near = closest(tok, &["bytes", "gpt2"])
                .map(|k| format!("did you mean \"{k}\"? "))
                .unwrap_or_default();
            return Err(r.key_error(
                "data.tokenizer",
                format!(
                    "`data.tokenizer` = \"{tok}\" is neither \"bytes\", \"gpt2\" nor a tokenizer.json file (`{}` not found)",
                    file(r.path_of("data.tokenizer", tok)).display()
                ),
                Some(format!(
                    "{near}a tokenizer.json path is relative to the experiment file that sets it"
                )),
            ));
        }
        if !self.mix.is_empty() && !self.kind.tokens() {
            return Err(r.key_error(
                "data.mix",
                format!(
                    "`data.mix` mixes sources of a language model's data, but `data.kind` = \"{}\"",
                    choice_name(&self.kind)
                ),
                Some("use `data.kind = \"jsonl\"`, \"parquet\", \"text\" or \"tokens\", or remove `data.mix`".into()),
            ));
        }
        if self.mix_stop != MixStop::Restart && self.mix.is_empty() {
            return Err(r.key_error(
                "data.mix_stop",
                "`data.mix_stop` says what a mixture does when a source runs out, but `data.mix` is not set".into(),
                Some("remove it, or mix sources with `data.mix`".into()),
            ));
        }
        if self.dtype.is_some() && self.kind != DataKind::Tokens {
            return Err(r.key_error(
                "data.dtype",
                "`data.dtype` is the element type of a token file (`data.kind = \"tokens\"`)"
                    .into(),
                Some("remove it, or set `data.kind = \"tokens\"`".into()),
            ));
        }
        self.check_kind(r)?;
        Ok(())
    }
}

impl DataConfig {
    /// What `data.kind` needs: its files (existing), its keys and its shapes.
    fn check_kind(&self, r: &Resolved) -> Result<(), ConfigError> {
        match self.kind {
            DataKind::Synthetic => {
                at_least(r, "data.samples", self.samples, 1)?;
                at_least(r, "data.features", self.features, 1)?;
                // the synthetic data is drawn in memory: at most 2^32 values (16 GiB)
                let values =
                    (self.samples as u128 + self.eval_samples as u128) * self.features as u128;
                if values > 1u128 << 32 {
                    return Err(r.key_error(
                        "data.samples",
                        format!(
                            "(data.samples {} + data.eval_samples {}) x data.features {} = {values} values ({} bytes) is more synthetic data than kiln draws (at most 2^32 values)",
                            self.samples, self.eval_samples, self.features, values * 4
                        ),
                        Some("use fewer samples or features".into()),
                    ));
                }
                if let Some(t) = self.vocab {
                    at_least(r, "data.vocab", t, 1)?;
                } else if !self.image.is_empty()
                    && (self.image.len() != 3 || self.image.contains(&0))
                {
                    return Err(r.key_error(
                        "data.image",
                        format!("`data.image` = {:?} is not an image shape", self.image),
                        Some("give [channels, height, width], each at least 1".into()),
                    ));
                }
            }
            DataKind::Csv => {
                if self.path.is_none() {
                    return Err(r.key_error(
                        "data.kind",
                        "`data.kind` = \"csv\" needs `data.path`".into(),
                        Some(
                            "add `path = \"train.csv\"` to [data] (relative to the experiment file)"
                                .into(),
                        ),
                    ));
                }
                files_exist(
                    r,
                    &[
                        ("data.path", &self.path),
                        ("data.eval_path", &self.eval_path),
                    ],
                )?;
            }
            DataKind::Text | DataKind::Tokens => self.check_text(r)?,
            DataKind::Idx => self.check_idx(r)?,
            DataKind::Jsonl | DataKind::Parquet => self.check_documents(r)?,
        }
        Ok(())
    }

    /// Records of documents: `data.path` (a file, a directory or a glob), a field name, a run
    /// length in steps (a stream's passes have no length before they are read).
    fn check_documents(&self, r: &Resolved) -> Result<(), ConfigError> {
        let kind = choice_name(&self.kind);
        if !self.mix.is_empty() {
            self.check_mix(r)?;
        } else if self.path.is_none() {
            return Err(r.key_error(
                "data.kind",
                format!("`data.kind` = \"{kind}\" needs `data.path` (or `data.mix`)"),
                Some(format!(
                    "add `path = \"train.{kind}\"` to [data] (a file, a directory of shards or a glob, relative to the experiment file)"
                )),
            ));
        }
        for (key, value) in [
            ("data.path", &self.path),
            ("data.eval_path", &self.eval_path),
        ] {
            let Some(value) = value else { continue };
            let p = r.path_of(key, value);
            let glob = value.contains(['*', '?', '[']);
            if !glob && !p.exists() {
                return Err(r.key_error(
                    key,
                    format!("`{key}` = \"{value}\": `{}` not found", p.display()),
                    Some("give a file, a directory of shards or a glob (relative to the experiment file)".into()),
                ));
            }
        }
        for (key, set) in [
            ("data.eval_fraction", self.eval_fraction.is_some()),
            ("data.stride", self.stride.is_some()),
        ] {
            if set {
                return Err(r.key_error(
                    key,
                    format!("`{key}` applies to text and token files, not to `data.kind` = \"{kind}\" (each record is a document)"),
                    Some("remove it; evaluation documents are `data.eval_path`".into()),
                ));
            }
        }
        if self.messages_field.is_empty() {
            return Err(r.key_error(
                "data.messages_field",
                "`data.messages_field` is empty".into(),
                Some(
                    "name the field of each record that holds its conversation, e.g. \"messages\""
                        .into(),
                ),
            ));
        }
        files_exist(r, &[("data.chat_template", &self.chat_template)])?;
        if self.text_field.is_empty() {
            return Err(r.key_error(
                "data.text_field",
                "`data.text_field` is empty".into(),
                Some("name the field of each record that holds its text, e.g. \"text\"".into()),
            ));
        }
        self.check_stream(
            r,
            "data.kind",
            format!("`data.kind` = \"{kind}\" streams its documents, tokenized as they are read, so a pass over them has no length before it is read"),
        )
    }

    /// A stream of rows (documents, or a mixture's windows): passes have no length before they
    /// are read, so the run is counted in steps. `key` and `why` say what makes it a stream.
    fn check_stream(&self, r: &Resolved, key: &str, why: String) -> Result<(), ConfigError> {
        if r.config.checkpoint.every_epochs > 0 {
            return Err(r.key_error(
                "checkpoint.every_epochs",
                format!("`checkpoint.every_epochs` counts epochs of samples, but {why}"),
                Some("use `checkpoint.every_steps`".into()),
            ));
        }
        if r.config.train.max_steps.is_none() {
            return Err(r.key_error(
                key,
                format!("{why}: the run needs `train.max_steps` (as transformers' Trainer does for an iterable dataset)"),
                Some("set `train.max_steps` (passes follow each other until then)".into()),
            ));
        }
        Ok(())
    }

    /// A text or token file: `data.path`, and how the evaluation data is held out.
    fn check_text(&self, r: &Resolved) -> Result<(), ConfigError> {
        let (kind, example) = match self.kind {
            DataKind::Text => ("text", "corpus.txt"),
            _ => ("tokens", "train.bin"),
        };
        if !self.mix.is_empty() {
            self.check_mix(r)?;
            self.check_window_mix(r, kind)?;
        } else if self.path.is_none() {
            return Err(r.key_error(
                "data.kind",
                format!("`data.kind` = \"{kind}\" needs `data.path` (or `data.mix`)"),
                Some(format!(
                    "add `path = \"{example}\"` to [data] (relative to the experiment file)"
                )),
            ));
        }
        files_exist(
            r,
            &[
                ("data.path", &self.path),
                ("data.eval_path", &self.eval_path),
            ],
        )?;
        if self.eval_path.is_some() && self.eval_fraction.is_some() {
            return Err(r.key_error(
                "data.eval_fraction",
                "`data.eval_fraction` holds out the end of `data.path`, but `data.eval_path` is set too".into(),
                Some("keep one of them".into()),
            ));
        }
        if let Some(f) = self.eval_fraction {
            if !(0.0..1.0).contains(&f) {
                return Err(r.range_error(
                    "data.eval_fraction",
                    format!("`data.eval_fraction` = {f} is out of range: must be in [0, 1)"),
                    None,
                ));
            }
        }
        if self.stride == Some(0) {
            return Err(r.range_error(
                "data.stride",
                "`data.stride` = 0 is out of range: must be at least 1".into(),
                None,
            ));
        }
        Ok(())
    }

    /// A mixture: instead of `data.path`, sources that exist, weights that are positive.
    fn check_mix(&self, r: &Resolved) -> Result<(), ConfigError> {
        if self.path.is_some() {
            return Err(r.key_error(
                "data.mix",
                "`data.mix` names the training documents, but `data.path` is set too".into(),
                Some("keep one: `data.path` for one source, `data.mix` for several".into()),
            ));
        }
        for (i, m) in self.mix.iter().enumerate() {
            if !(m.weight > 0.0 && m.weight.is_finite()) {
                return Err(r.range_error(
                    "data.mix",
                    format!(
                        "`data.mix[{i}].weight` = {} is out of range: must be a finite number above 0",
                        m.weight
                    ),
                    None,
                ));
            }
            let p = r.path_of("data.mix", &m.path);
            if !m.path.contains(['*', '?', '[']) && !p.exists() {
                let give = if self.kind.documents() {
                    "a file, a directory of shards or a glob"
                } else {
                    "a file"
                };
                return Err(r.key_error(
                    "data.mix",
                    format!(
                        "`data.mix[{i}].path` = \"{}\": `{}` not found",
                        m.path,
                        p.display()
                    ),
                    Some(format!("give {give} (relative to the experiment file)")),
                ));
            }
            if m.text_field.as_ref().is_some_and(|f| f.is_empty()) {
                return Err(r.key_error(
                    "data.mix",
                    format!("`data.mix[{i}].text_field` is empty"),
                    Some("name the field of each record that holds its text, or leave it out (`data.text_field`)".into()),
                ));
            }
        }
        Ok(())
    }

    /// A mixture of text or token files: each source one file, trained whole (evaluation is
    /// `data.eval_path`), drawn as a stream.
    fn check_window_mix(&self, r: &Resolved, kind: &str) -> Result<(), ConfigError> {
        for (i, m) in self.mix.iter().enumerate() {
            let p = r.path_of("data.mix", &m.path);
            if !std::fs::metadata(&p).is_ok_and(|m| m.is_file()) {
                return Err(r.key_error(
                    "data.mix",
                    format!("`data.mix[{i}].path` = \"{}\" is not a file (`{}`): a source of `data.kind` = \"{kind}\" is one file", m.path, p.display()),
                    Some("give each file its own entry in `data.mix` (shards of documents are `data.kind = \"jsonl\"` or \"parquet\")".into()),
                ));
            }
            if m.text_field.is_some() {
                return Err(r.key_error(
                    "data.mix",
                    format!("`data.mix[{i}].text_field` names a field of records, but `data.kind` = \"{kind}\" has none"),
                    Some("remove it".into()),
                ));
            }
        }
        if self.eval_fraction.is_some() {
            return Err(r.key_error(
                "data.eval_fraction",
                "`data.eval_fraction` holds out the end of `data.path`, but `data.mix` trains on the whole of each of its files".into(),
                Some(format!("hold out a file of its own as `data.eval_path` (a {kind} file)")),
            ));
        }
        self.check_stream(
            r,
            "data.mix",
            "`data.mix` draws windows from its files as a stream (a file that runs out starts its next pass), so a run has no epochs".into(),
        )
    }

    /// IDX files: images and labels, and both evaluation files or neither.
    fn check_idx(&self, r: &Resolved) -> Result<(), ConfigError> {
        for (key, value, what) in [
            (
                "data.path",
                &self.path,
                "path = \"train-images-idx3-ubyte.gz\"",
            ),
            (
                "data.labels_path",
                &self.labels_path,
                "labels_path = \"train-labels-idx1-ubyte.gz\"",
            ),
        ] {
            if value.is_none() {
                return Err(r.key_error(
                    "data.kind",
                    format!("`data.kind` = \"idx\" needs `{key}`"),
                    Some(format!(
                        "add `{what}` to [data] (relative to the experiment file)"
                    )),
                ));
            }
        }
        if self.eval_path.is_some() != self.eval_labels_path.is_some() {
            let (key, missing) = if self.eval_path.is_some() {
                ("data.eval_path", "data.eval_labels_path")
            } else {
                ("data.eval_labels_path", "data.eval_path")
            };
            return Err(r.key_error(
                key,
                format!("`{key}` needs `{missing}` too"),
                Some("give both evaluation files, or neither".into()),
            ));
        }
        files_exist(
            r,
            &[
                ("data.path", &self.path),
                ("data.labels_path", &self.labels_path),
                ("data.eval_path", &self.eval_path),
                ("data.eval_labels_path", &self.eval_labels_path),
            ],
        )?;
        Ok(())
    }

    /// Loader threads, prefetch depth and image augmentation.
    pub(super) fn check_loader(&self, r: &Resolved) -> Result<(), ConfigError> {
        let d = self;
        if d.workers > 64 {
            return Err(r.range_error(
                "data.workers",
                format!(
                    "`data.workers` = {} is out of range: at most 64 loader threads per rank",
                    d.workers
                ),
                None,
            ));
        }
        if d.workers > 0 {
            at_least(r, "data.prefetch", d.prefetch, 1)?;
        }
        if d.prefetch > 1024 {
            return Err(r.range_error(
                "data.prefetch",
                format!(
                    "`data.prefetch` = {} is out of range: at most 1024 micro-batches ahead",
                    d.prefetch
                ),
                None,
            ));
        }
        if let Some(a) = &d.augment {
            if a.random_crop > 4096 {
                return Err(r.range_error(
                    "data.augment.random_crop",
                    format!(
                        "`data.augment.random_crop` = {} is out of range: at most 4096 pixels of padding",
                        a.random_crop
                    ),
                    None,
                ));
            }
            let images = match d.kind {
                DataKind::Idx => true,
                DataKind::Synthetic => d.image.len() == 3 && d.vocab.is_none(),
                DataKind::Csv | DataKind::Text | DataKind::Tokens => false,
                DataKind::Jsonl | DataKind::Parquet => false,
            };
            if !images {
                return Err(r.key_error(
                    "data.augment",
                    format!(
                        "`data.augment` transforms images, but `data.kind` = \"{}\" gives {}",
                        crate::config::choice_name(&d.kind),
                        if d.kind.tokens() || d.vocab.is_some() {
                            "token windows"
                        } else {
                            "flat feature rows"
                        }
                    ),
                    Some("remove [data.augment], or use images (`data.kind = \"idx\"`, or synthetic `data.image = [C, H, W]`)".into()),
                ));
            }
        }
        Ok(())
    }
}
