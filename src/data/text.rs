//! `data.kind = "text"`: any file as byte-level tokens (vocabulary 256). Training samples are
//! windows of `model.block_size + 1` tokens starting every `data.stride` tokens (default
//! `block_size`); the last `data.eval_fraction` of the file is held out and cut into windows
//! every `block_size` tokens (consecutive windows share one token, so every held-out target is
//! scored once). A window is a sample like any other: the distributed sampler, the resume cursor and
//! exact evaluation work over windows.

use super::{Data, DataError, Dataset};
use crate::config::Resolved;

/// Windows of `width` tokens every `stride` tokens of `tokens`.
fn windows(tokens: &[u8], width: usize, stride: usize) -> Dataset {
    let starts: Vec<usize> = (0..)
        .map(|i| i * stride)
        .take_while(|s| s + width <= tokens.len())
        .collect();
    let mut x = Vec::with_capacity(starts.len() * width);
    for &s in &starts {
        x.extend(tokens[s..s + width].iter().map(|&t| f32::from(t)));
    }
    Dataset {
        features: width,
        shape: vec![width],
        x,
        y: vec![0; starts.len()],
    }
}

pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    let Some(value) = &c.path else {
        return Err(DataError::Invalid(
            "`data.kind` = \"text\" needs `data.path`".into(),
        ));
    };
    let path = r.path_of("data.path", value);
    let bytes = std::fs::read(&path).map_err(|source| DataError::Io {
        path: path.clone(),
        key: "data.path",
        source,
    })?;
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let width = block + 1;
    let stride = c.stride.unwrap_or(block).max(1);
    let fraction = c.eval_fraction.unwrap_or(0.1);
    let split = bytes.len() - (bytes.len() as f64 * fraction).round() as usize;
    let (train, eval) = bytes.split_at(split);
    let short = |part: &str, len: usize| {
        DataError::Invalid(format!(
            "{}: the {part} has {len} tokens (bytes), shorter than one window of model.block_size + 1 = {width}; use a longer file, a smaller `model.block_size`, or (for the held-out part) another `data.eval_fraction`",
            path.display()
        ))
    };
    if train.len() < width {
        return Err(short("training part", train.len()));
    }
    let eval = if fraction > 0.0 {
        if eval.len() < width {
            return Err(short(
                &format!("held-out part (data.eval_fraction = {fraction})"),
                eval.len(),
            ));
        }
        // evaluation windows every block tokens: each held-out target is scored once
        Some(windows(eval, width, block))
    } else {
        None
    };
    Ok(Data {
        train: windows(train, width, stride),
        eval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_every_stride_and_stay_inside() {
        let t: Vec<u8> = (0..10).collect();
        let w = windows(&t, 4, 3);
        assert_eq!(w.len(), 3);
        assert_eq!(w.x[4..8], [3.0, 4.0, 5.0, 6.0]);
        assert_eq!(w.shape, [4]);
        assert_eq!(windows(&t, 11, 1).len(), 0);
    }
}
