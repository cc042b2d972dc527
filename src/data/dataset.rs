//! The in-memory dataset, data loading and its errors.

use super::{csv, idx, synthetic, text, Augment};
use std::path::PathBuf;

use crate::config::{DataKind, Resolved};

/// A classification dataset held in memory, row-major: sample i is `x[i * features..]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Values per sample (the product of `shape`).
    pub features: usize,
    /// The shape of one sample: `[features]`, or `[C, H, W]` for images.
    pub shape: Vec<usize>,
    pub x: Vec<f32>,
    pub y: Vec<u32>,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.y.len()
    }

    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// Gathers the rows at `idx` into a contiguous batch.
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Vec<u32>) {
        let mut x = Vec::with_capacity(idx.len() * self.features);
        let mut y = Vec::with_capacity(idx.len());
        for &i in idx {
            x.extend_from_slice(&self.x[i * self.features..(i + 1) * self.features]);
            y.push(self.y[i]);
        }
        (x, y)
    }

    /// `gather`, then each image transformed as `augment` draws it for its sample index in
    /// `epoch` (training batches).
    pub fn gather_augmented(
        &self,
        idx: &[usize],
        epoch: u64,
        augment: Option<&Augment>,
    ) -> (Vec<f32>, Vec<u32>) {
        let (mut x, y) = self.gather(idx);
        if let Some(a) = augment {
            let mut scratch = Vec::with_capacity(self.features);
            for (&i, sample) in idx.iter().zip(x.chunks_mut(self.features.max(1))) {
                a.apply(epoch, i, &self.shape, sample, &mut scratch);
            }
        }
        (x, y)
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

/// Loads the data the config describes.
pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    match c.kind {
        DataKind::Synthetic => match c.tokens {
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
        DataKind::Text => text::load(r),
    }
}
