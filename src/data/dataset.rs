//! The in-memory dataset, data loading and its errors.

use super::documents::{DocumentSource, PackedRows};
use super::tokens::Windows;
use super::{csv, idx, synthetic, text, tokens, Augment};
use std::path::{Path, PathBuf};

use crate::config::{DataKind, Resolved};

/// The input values of a batch: feature values, or token ids (integers from the file to the
/// model: a language model's inputs never pass through f32).
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    Tokens(Vec<u32>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::F32(v) => v.len(),
            Values::Tokens(v) => v.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Samples gathered into a batch: `shape[0]` samples' values, their labels and (rows of
/// documents) where each token's document starts in its row.
#[derive(Debug, Clone, PartialEq)]
pub struct Gathered {
    pub x: Values,
    pub shape: Vec<usize>,
    pub y: Vec<u32>,
    pub starts: Option<Vec<u32>>,
}

/// A dataset's samples.
#[derive(Debug, Clone)]
pub enum Samples {
    /// Rows of feature values held in memory, row-major (sample i is `x[i * features..]`), with
    /// a label each.
    Rows { x: Vec<f32>, y: Vec<u32> },
    /// Token windows (a language model's samples; no labels: the targets are the window
    /// shifted by one).
    Windows(Windows),
    /// Rows of documents held in memory (evaluation documents, packed once).
    Packed(PackedRows),
    /// Rows of documents as a stream (training documents): a rank's loader reads them in
    /// order (`documents::Stream`); they have no index of their own.
    Stream(std::sync::Arc<DocumentSource>),
}

/// The rows a stream of documents counts as having: endless to the sampler (passes over the
/// documents follow each other inside the stream), small enough that no count overflows.
pub const STREAM_ROWS: usize = 1 << 48;

/// A dataset: samples of one shape.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Values per sample (the product of `shape`).
    pub features: usize,
    /// The shape of one sample: `[features]`, `[C, H, W]` for images, `[block + 1]` for token
    /// windows.
    pub shape: Vec<usize>,
    pub samples: Samples,
}

impl PartialEq for Dataset {
    /// The same shape and the same values (token windows: the same windows of the same store).
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && match (&self.samples, &other.samples) {
                (Samples::Rows { x: a, y: b }, Samples::Rows { x: c, y: d }) => a == c && b == d,
                (Samples::Windows(a), Samples::Windows(b)) => {
                    std::sync::Arc::ptr_eq(&a.store, &b.store)
                        && (a.offset, a.count, a.width, a.stride)
                            == (b.offset, b.count, b.width, b.stride)
                }
                (Samples::Packed(a), Samples::Packed(b)) => a == b,
                (Samples::Stream(a), Samples::Stream(b)) => std::sync::Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Dataset {
    /// Feature rows `x` of `shape` with labels `y`.
    pub fn rows(shape: Vec<usize>, x: Vec<f32>, y: Vec<u32>) -> Self {
        Dataset {
            features: shape.iter().product(),
            shape,
            samples: Samples::Rows { x, y },
        }
    }

    /// Token windows.
    pub fn windows(w: Windows) -> Self {
        Dataset {
            features: w.width,
            shape: vec![w.width],
            samples: Samples::Windows(w),
        }
    }

    /// Rows of documents: packed in memory, or a stream.
    pub fn packed(rows: PackedRows) -> Self {
        Dataset {
            features: rows.width,
            shape: vec![rows.width],
            samples: Samples::Packed(rows),
        }
    }

    pub fn stream(src: std::sync::Arc<DocumentSource>) -> Self {
        let width = src.encoder.width;
        Dataset {
            features: width,
            shape: vec![width],
            samples: Samples::Stream(src),
        }
    }

    pub fn len(&self) -> usize {
        match &self.samples {
            Samples::Rows { y, .. } => y.len(),
            Samples::Windows(w) => w.count,
            Samples::Packed(p) => p.len(),
            Samples::Stream(_) => STREAM_ROWS,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows of documents held in memory (evaluation documents: their loss is a mean over
    /// tokens).
    pub fn is_packed(&self) -> bool {
        matches!(self.samples, Samples::Packed(_))
    }

    /// Rows of documents read as a stream (training documents).
    pub fn is_stream(&self) -> bool {
        matches!(self.samples, Samples::Stream(_))
    }

    /// The feature rows and labels (in-memory row datasets; `None` for token windows).
    pub fn rows_ref(&self) -> Option<(&[f32], &[u32])> {
        match &self.samples {
            Samples::Rows { x, y } => Some((x, y)),
            _ => None,
        }
    }

    /// Gathers the samples at `idx` into a contiguous batch, with their labels (zeros for
    /// token windows). Errors only for a token file whose ids are checked as they are read.
    pub fn gather(&self, idx: &[usize]) -> Result<(Values, Vec<u32>), DataError> {
        match &self.samples {
            Samples::Rows { x: data, y: labels } => {
                let mut x = Vec::with_capacity(idx.len() * self.features);
                let mut y = Vec::with_capacity(idx.len());
                for &i in idx {
                    x.extend_from_slice(&data[i * self.features..(i + 1) * self.features]);
                    y.push(labels[i]);
                }
                Ok((Values::F32(x), y))
            }
            Samples::Windows(w) => {
                let mut x = Vec::with_capacity(idx.len() * w.width);
                for &i in idx {
                    w.read(i, &mut x)?;
                }
                Ok((Values::Tokens(x), vec![0; idx.len()]))
            }
            Samples::Packed(p) => {
                let (mut x, mut starts) = (Vec::new(), Vec::new());
                for &i in idx {
                    p.read(i, &mut x, &mut starts);
                }
                Ok((Values::Tokens(x), vec![0; idx.len()]))
            }
            Samples::Stream(_) => Err(DataError::Invalid(
                "a stream of documents is read in order by the data loader, not by index".into(),
            )),
        }
    }

    /// The samples at `idx` as a batch: their values, labels and (rows of documents) where
    /// each token's document starts.
    pub fn batch(&self, idx: &[usize]) -> Result<Gathered, DataError> {
        let mut shape = Vec::with_capacity(1 + self.shape.len());
        shape.push(idx.len());
        shape.extend(&self.shape);
        if let Samples::Packed(p) = &self.samples {
            let (mut x, mut starts) = (Vec::new(), Vec::new());
            for &i in idx {
                p.read(i, &mut x, &mut starts);
            }
            return Ok(Gathered {
                x: Values::Tokens(x),
                shape,
                y: vec![0; idx.len()],
                starts: Some(starts),
            });
        }
        let (x, y) = self.gather(idx)?;
        Ok(Gathered {
            x,
            shape,
            y,
            starts: None,
        })
    }

    /// `gather`, then each image transformed as `augment` draws it for its sample index in
    /// `epoch` (training batches).
    pub fn gather_augmented(
        &self,
        idx: &[usize],
        epoch: u64,
        augment: Option<&Augment>,
    ) -> Result<(Values, Vec<u32>), DataError> {
        let (mut x, y) = self.gather(idx)?;
        if let (Some(a), Values::F32(x)) = (augment, &mut x) {
            let mut scratch = Vec::with_capacity(self.features);
            for (&i, sample) in idx.iter().zip(x.chunks_mut(self.features.max(1))) {
                a.apply(epoch, i, &self.shape, sample, &mut scratch);
            }
        }
        Ok((x, y))
    }
}

/// Training and (optional) evaluation data.
#[derive(Debug, Clone)]
pub struct Data {
    pub train: Dataset,
    pub eval: Option<Dataset>,
}

impl Data {
    /// The shape of one input sample (what a model is built for).
    pub fn input_shape(&self) -> Vec<usize> {
        self.train.shape.clone()
    }

    /// What a run reads, where a line says more than the plan (documents: their shards,
    /// tokenizer and EOS id, their evaluation rows).
    pub fn describe(&self) -> Option<String> {
        let Samples::Stream(src) = &self.train.samples else {
            return None;
        };
        let eval = match &self.eval {
            Some(e) => format!("; {} evaluation rows", e.len()),
            None => String::new(),
        };
        Some(format!("{}{eval}", src.describe()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read data file `{path}` ({key}): {source}")]
    Io {
        path: PathBuf,
        /// The config key that named the file, e.g. `data.eval_path`.
        key: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A bad value at a line and (1-based, in characters) column.
    #[error("{path}:{line}:{col}: {message}")]
    ParseAt {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The most bytes of a text file read whole into memory: 2 GiB. A larger corpus is `kiln
/// tokenize`d into a token file (`data.kind = "tokens"`, memory-mapped).
pub const MAX_TEXT_BYTES: u64 = 2 << 30;

/// The most bytes read from a file whose size the file system does not say (0 bytes).
pub const MAX_UNSIZED_BYTES: u64 = 64 << 20;

/// A data file's bytes, read whole: refused past `cap` (text: `MAX_TEXT_BYTES`; others: the
/// file's own size bounds them), and past `MAX_UNSIZED_BYTES` for a file whose size the file
/// system does not know (such as `/proc/self/pagemap`), before they are all read.
pub fn read_bounded(
    path: &Path,
    key: &'static str,
    cap: Option<u64>,
) -> Result<Vec<u8>, DataError> {
    use std::io::Read as _;
    let io = |source| DataError::Io {
        path: path.to_path_buf(),
        key,
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    // a file that says it is empty but is not (/proc, sysfs) is read up to 64 MiB
    let text = cap.is_some();
    let cap = if size > 0 {
        cap.unwrap_or(u64::MAX)
    } else {
        MAX_UNSIZED_BYTES
    };
    let too_big = || {
        DataError::Invalid(format!(
            "{} ({key}) holds more than {} MiB, which kiln reads whole into memory{}{}",
            path.display(),
            cap >> 20,
            if size > 0 {
                ""
            } else {
                " (its size is unknown: the file system says 0 bytes)"
            },
            if text {
                "; for a large text corpus, `kiln tokenize` it and train with data.kind = \"tokens\" (memory-mapped)"
            } else {
                ""
            }
        ))
    };
    if size > cap {
        return Err(too_big());
    }
    let mut out = Vec::with_capacity(size.min(cap) as usize);
    // in aligned chunks of 1 MiB (pseudo-files such as /proc/self/pagemap refuse reads of
    // other sizes), until the end or past the bound
    let mut f = f;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = match f.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
        if out.len() as u64 > cap {
            return Err(too_big());
        }
    }
    Ok(out)
}

/// Loads the data the config describes.
pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    match c.kind {
        DataKind::Synthetic => match c.vocab {
            Some(vocab) => Ok(synthetic::tokens(
                c,
                vocab,
                r.config.model.block_size.unwrap_or(128).max(1) + 1,
            )),
            None => Ok(synthetic::generate(c)),
        },
        DataKind::Csv => {
            let Some(path) = &c.path else {
                return Err(DataError::Invalid("data.path is required for csv".into()));
            };
            let train = csv::read(&r.path_of("data.path", path), c, "data.path")?;
            let eval = match &c.eval_path {
                Some(p) => Some(csv::read(
                    &r.path_of("data.eval_path", p),
                    c,
                    "data.eval_path",
                )?),
                None => None,
            };
            if let Some(e) = &eval {
                if e.features != train.features {
                    return Err(DataError::Invalid(format!(
                        "data.eval_path has {} feature columns but data.path has {}",
                        e.features, train.features
                    )));
                }
            }
            if train.features != r.config.model.input_size {
                return Err(DataError::Invalid(format!(
                    "data.path has {} feature columns but model.input_size = {}; set model.input_size = {}",
                    train.features, r.config.model.input_size, train.features
                )));
            }
            Ok(Data { train, eval })
        }
        DataKind::Idx => idx::load(r),
        DataKind::Text | DataKind::Tokens if !c.mix.is_empty() => super::mixture::load(r),
        DataKind::Text => text::load(r),
        DataKind::Tokens => tokens::load(r),
        DataKind::Jsonl | DataKind::Parquet => super::documents::load(r),
    }
}
