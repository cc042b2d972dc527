//! `data.kind = "idx"`: MNIST-style IDX files (images: magic 0x00000803, dims count, height,
//! width, then u8 pixels; labels: 0x00000801, count, then u8 labels), raw or gzipped (`.gz`).
//! Pixels are scaled to [0, 1], then `normalize = [mean, std]` applies. Every problem names the
//! file and what is wrong with it.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{Data, DataError, Dataset};
use crate::config::{DataConfig, Resolved};

const IMAGES: u32 = 0x0000_0803;
const LABELS: u32 = 0x0000_0801;

fn invalid(path: &Path, what: String) -> DataError {
    DataError::Invalid(format!("{}: {what}", path.display()))
}

/// The file's bytes, un-gzipped when it ends in `.gz`.
fn read(path: &Path, key: &'static str) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        key,
        source,
    })?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| invalid(path, format!("not a readable gzip file ({e})")))?;
        return Ok(out);
    }
    Ok(raw)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The header (magic, then `dims` big-endian sizes) and the payload after it.
fn parse(
    path: &Path,
    bytes: &[u8],
    magic: u32,
    dims: usize,
) -> Result<(Vec<usize>, usize), DataError> {
    let head = 4 * (1 + dims);
    if bytes.len() >= 4 && be32(bytes, 0) != magic {
        let what = if magic == IMAGES { "images" } else { "labels" };
        return Err(invalid(
            path,
            format!(
                "bad magic number 0x{:08x}: IDX {what} files start with 0x{magic:08x} (u8 data, {dims} dimension(s))",
                be32(bytes, 0)
            ),
        ));
    }
    if bytes.len() < head {
        return Err(invalid(
            path,
            format!(
                "truncated: {} bytes, shorter than the {head}-byte header",
                bytes.len()
            ),
        ));
    }
    let sizes: Vec<usize> = (0..dims)
        .map(|d| be32(bytes, 4 * (1 + d)) as usize)
        .collect();
    if sizes[0] == 0 {
        return Err(invalid(path, "holds no items (its count is 0)".into()));
    }
    if sizes.iter().skip(1).any(|&s| s == 0) {
        return Err(invalid(path, format!("a dimension is 0: {sizes:?}")));
    }
    let Some(want) = sizes.iter().try_fold(1usize, |a, &s| a.checked_mul(s)) else {
        return Err(invalid(path, format!("header sizes {sizes:?} overflow")));
    };
    let have = bytes.len() - head;
    if have != want {
        let what = if have < want { "truncated" } else { "too long" };
        return Err(invalid(
            path,
            format!(
                "{what}: the header says {sizes:?} ({want} bytes of data) but the file has {have}"
            ),
        ));
    }
    Ok((sizes, head))
}

/// One images file and its labels file.
fn read_pair(
    images: &Path,
    labels: &Path,
    c: &DataConfig,
    keys: [&'static str; 2],
) -> Result<Dataset, DataError> {
    let ib = read(images, keys[0])?;
    let (isz, ih) = parse(images, &ib, IMAGES, 3)?;
    let lb = read(labels, keys[1])?;
    let (lsz, lh) = parse(labels, &lb, LABELS, 1)?;
    if isz[0] != lsz[0] {
        return Err(invalid(
            labels,
            format!(
                "{} labels but {} has {} images; they must be counted alike",
                lsz[0],
                images.display(),
                isz[0]
            ),
        ));
    }
    let y: Vec<u32> = lb[lh..].iter().map(|&l| u32::from(l)).collect();
    if let Some((i, l)) = y.iter().enumerate().find(|(_, &l)| l as usize >= c.classes) {
        return Err(invalid(
            labels,
            format!(
                "label {l} (sample {i}) is not below data.classes = {}; raise `data.classes`",
                c.classes
            ),
        ));
    }
    let (mean, std) = match c.normalize.as_slice() {
        [m, s] => (*m as f32, *s as f32),
        _ => (0.0, 1.0),
    };
    let x = ib[ih..]
        .iter()
        .map(|&p| (f32::from(p) / 255.0 - mean) / std)
        .collect();
    Ok(Dataset::rows(vec![1, isz[1], isz[2]], x, y))
}

fn path(r: &Resolved, key: &str, value: &Option<String>) -> Result<PathBuf, DataError> {
    match value {
        Some(v) => Ok(r.path_of(key, v)),
        None => Err(DataError::Invalid(format!(
            "`data.kind` = \"idx\" needs `{key}`"
        ))),
    }
}

pub fn load(r: &Resolved) -> Result<Data, DataError> {
    let c = &r.config.data;
    let train = read_pair(
        &path(r, "data.path", &c.path)?,
        &path(r, "data.labels_path", &c.labels_path)?,
        c,
        ["data.path", "data.labels_path"],
    )?;
    let eval = match (&c.eval_path, &c.eval_labels_path) {
        (None, None) => None,
        _ => {
            let images = path(r, "data.eval_path", &c.eval_path)?;
            let e = read_pair(
                &images,
                &path(r, "data.eval_labels_path", &c.eval_labels_path)?,
                c,
                ["data.eval_path", "data.eval_labels_path"],
            )?;
            if e.shape != train.shape {
                return Err(invalid(
                    &images,
                    format!(
                        "images of shape {:?}, but the training images are {:?}",
                        e.shape, train.shape
                    ),
                ));
            }
            Some(e)
        }
    };
    Ok(Data { train, eval })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(n: u32, h: u32, w: u32, pixels: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [IMAGES, n, h, w] {
            b.extend(v.to_be_bytes());
        }
        b.extend(pixels);
        b
    }

    fn labels(l: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [LABELS, l.len() as u32] {
            b.extend(v.to_be_bytes());
        }
        b.extend(l);
        b
    }

    fn pair(img: Vec<u8>, lab: Vec<u8>, gz: bool) -> Result<Dataset, String> {
        let d = crate::testdir::tempdir().unwrap();
        let (ip, lp) = if gz {
            (d.path().join("i.gz"), d.path().join("l.gz"))
        } else {
            (d.path().join("i"), d.path().join("l"))
        };
        let write = |p: &Path, b: Vec<u8>| {
            let b = if gz {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                std::io::Write::write_all(&mut e, &b).unwrap();
                e.finish().unwrap()
            } else {
                b
            };
            std::fs::write(p, b).unwrap();
        };
        write(&ip, img);
        write(&lp, lab);
        let c = DataConfig {
            classes: 3,
            ..DataConfig::default()
        };
        read_pair(&ip, &lp, &c, ["data.path", "data.labels_path"]).map_err(|e| {
            e.to_string()
                .replace(&format!("{}/", d.path().display()), "")
        })
    }

    #[test]
    fn reads_raw_and_gzipped_files_scaling_pixels() {
        for gz in [false, true] {
            let ds = pair(images(2, 1, 2, &[0, 255, 51, 102]), labels(&[2, 0]), gz).unwrap();
            assert_eq!(ds.shape, [1, 1, 2]);
            assert_eq!(
                ds.rows_ref(),
                Some((&[0.0, 1.0, 0.2, 0.4][..], &[2, 0][..]))
            );
        }
    }

    #[test]
    fn every_bad_file_is_named_with_what_is_wrong() {
        let ok = || images(2, 1, 2, &[0; 4]);
        assert_eq!(
            pair(labels(&[0, 1]), labels(&[0, 1]), false).unwrap_err(),
            "i: bad magic number 0x00000801: IDX images files start with 0x00000803 (u8 data, 3 dimension(s))"
        );
        assert_eq!(
            pair(images(2, 1, 2, &[0; 3]), labels(&[0, 1]), false).unwrap_err(),
            "i: truncated: the header says [2, 1, 2] (4 bytes of data) but the file has 3"
        );
        assert_eq!(
            pair(ok()[..10].to_vec(), labels(&[0, 1]), false).unwrap_err(),
            "i: truncated: 10 bytes, shorter than the 16-byte header"
        );
        assert_eq!(
            pair(ok(), labels(&[0, 1, 2]), false).unwrap_err(),
            "l: 3 labels but i has 2 images; they must be counted alike"
        );
        assert_eq!(
            pair(ok(), labels(&[0, 3]), false).unwrap_err(),
            "l: label 3 (sample 1) is not below data.classes = 3; raise `data.classes`"
        );
        assert_eq!(
            pair(images(2, 0, 2, &[]), labels(&[0, 1]), false).unwrap_err(),
            "i: a dimension is 0: [2, 0, 2]"
        );
        assert_eq!(
            pair(images(0, 2, 2, &[]), labels(&[]), false).unwrap_err(),
            "i: holds no items (its count is 0)"
        );
        assert_eq!(
            pair(
                images(u32::MAX, u32::MAX, u32::MAX, &[]),
                labels(&[0]),
                false
            )
            .unwrap_err(),
            "i: header sizes [4294967295, 4294967295, 4294967295] overflow"
        );
    }
}
