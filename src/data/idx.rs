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

/// gzip members one after another, read as one stream (what `cat a.gz b.gz` makes), then
/// nothing, or zero bytes only: the padding a tape or a block device leaves, which `gzip -d`
/// takes too (issue 45: it was refused). Anything else after a member is an error.
struct Members<'a> {
    rest: &'a [u8],
    member: Option<flate2::bufread::GzDecoder<&'a [u8]>>,
}

impl<'a> Members<'a> {
    fn new(raw: &'a [u8]) -> Self {
        Members {
            rest: raw,
            member: None,
        }
    }
}

impl Read for Members<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(m) = &mut self.member {
                let n = m.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                // this member is done: what follows it
                if let Some(m) = self.member.take() {
                    self.rest = m.into_inner();
                }
            }
            if self.rest.iter().all(|b| *b == 0) {
                return Ok(0);
            }
            if !self.rest.starts_with(&[0x1f, 0x8b]) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "bytes after the last gzip member that are neither gzip nor zero padding",
                ));
            }
            self.member = Some(flate2::bufread::GzDecoder::new(self.rest));
        }
    }
}

/// The file's bytes, un-gzipped when they start with gzip's magic bytes (whatever the name:
/// `.gz`, `.GZ` or none). A gzip file is inflated only as far as its IDX header says (plus one
/// byte, to tell "too long"), so a small file that inflates to gigabytes is refused after a
/// few bytes; members one after another (what `cat a.gz b.gz` makes) are read as one stream,
/// and bytes after the last member that are not gzip are refused.
fn read(path: &Path, key: &'static str, magic: u32, dims: usize) -> Result<Vec<u8>, DataError> {
    let raw = super::read_bounded(path, key, None)?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok(raw);
    }
    let gz_error = |e: std::io::Error| {
        invalid(
            path,
            format!("not a readable gzip file ({e}); a gzip file holds gzip members only, with nothing after the last"),
        )
    };
    let mut z = Members::new(raw.as_slice());
    let head = 4 * (1 + dims);
    let mut out = Vec::with_capacity(head);
    (&mut z)
        .take(head as u64)
        .read_to_end(&mut out)
        .map_err(gz_error)?;
    if out.len() < head || be32(&out, 0) != magic {
        return Ok(out); // `parse` says it is truncated, or of another kind
    }
    let want = (0..dims)
        .map(|d| be32(&out, 4 * (1 + d)) as u64)
        .try_fold(1u64, |a, s| a.checked_mul(s));
    // DEFLATE inflates at most ~1032:1: a header that promises more than the file could hold
    // is truncated, whatever the inflated bytes are
    let most = (raw.len() as u64).saturating_mul(1032);
    let Some(want) = want.filter(|w| *w <= most) else {
        return Err(invalid(
            path,
            format!(
                "truncated: its header says {:?} but {} gzip bytes cannot hold that much",
                (0..dims)
                    .map(|d| be32(&out, 4 * (1 + d)))
                    .collect::<Vec<_>>(),
                raw.len()
            ),
        ));
    };
    // the payload and one byte more, at most
    (&mut z)
        .take(want + 1)
        .read_to_end(&mut out)
        .map_err(gz_error)?;
    if out.len() as u64 == head as u64 + want {
        // exactly the payload: the stream must end here (another member, or nothing)
        let mut probe = [0u8; 1];
        match z.read(&mut probe) {
            Ok(0) => {}
            Ok(_) => out.push(probe[0]), // too long: `parse` says so
            Err(e) => return Err(gz_error(e)),
        }
    }
    Ok(out)
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
    if have < want {
        return Err(invalid(
            path,
            format!(
                "truncated: the header says {sizes:?} ({want} bytes of data) but the file has {have}"
            ),
        ));
    }
    if have > want {
        // a gzip file is inflated one byte past the header's size at most: "more" is all it knows
        return Err(invalid(
            path,
            format!(
                "too long: the header says {sizes:?} ({want} bytes of data) but the file has more"
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
    let ib = read(images, keys[0], IMAGES, 3)?;
    let (isz, ih) = parse(images, &ib, IMAGES, 3)?;
    let lb = read(labels, keys[1], LABELS, 1)?;
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
            std::fs::write(p, if gz { gzip(&b) } else { b }).unwrap();
        };
        write(&ip, img);
        write(&lp, lab);
        read_in(d.path(), &ip, &lp)
    }

    /// `read_pair` of the files `ip` and `lp` in `dir` (3 classes), its error without `dir`.
    fn read_in(dir: &Path, ip: &Path, lp: &Path) -> Result<Dataset, String> {
        let c = DataConfig {
            classes: 3,
            ..DataConfig::default()
        };
        read_pair(ip, lp, &c, ["data.path", "data.labels_path"])
            .map_err(|e| e.to_string().replace(&format!("{}/", dir.display()), ""))
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

    fn gzip(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, b).unwrap();
        e.finish().unwrap()
    }

    fn read_bytes(name: &str, bytes: &[u8]) -> Result<Dataset, String> {
        let d = crate::testdir::tempdir().unwrap();
        let (ip, lp) = (d.path().join(name), d.path().join("l"));
        std::fs::write(&ip, bytes).unwrap();
        std::fs::write(&lp, labels(&[0, 1])).unwrap();
        read_in(d.path(), &ip, &lp)
    }

    /// Issue 30: gzip by its magic bytes under any name, members one after another read as
    /// one stream, garbage after the last refused, and a small file that inflates to far more
    /// than its header says refused without inflating it.
    #[test]
    fn gzip_is_read_by_content_in_members_and_bounded_by_the_header() {
        let img = images(2, 1, 2, &[0, 255, 51, 102]);
        let want = Some((&[0.0, 1.0, 0.2, 0.4][..], &[0, 1][..]));
        for name in ["i.GZ", "i", "i.gz"] {
            let ds = read_bytes(name, &gzip(&img)).unwrap();
            assert_eq!(ds.rows_ref(), want, "{name}");
        }
        // `cat a.gz b.gz`: two members
        let mut two = gzip(&img[..9]);
        two.extend(gzip(&img[9..]));
        assert_eq!(read_bytes("i.gz", &two).unwrap().rows_ref(), want);
        // bytes after the stream that are not a gzip member
        let mut trailing = gzip(&img);
        trailing.extend(b"garbage!");
        let e = read_bytes("i.gz", &trailing).unwrap_err();
        assert!(e.starts_with("i.gz: not a readable gzip file"), "{e}");
        // zero padding after the last member (a tape's, a block device's) is read, as by
        // `gzip -d` (issue 45: it was refused); a member after the padding is not
        let mut padded = two.clone();
        padded.extend(vec![0u8; 512]);
        assert_eq!(read_bytes("i.gz", &padded).unwrap().rows_ref(), want);
        padded.extend(gzip(&[1, 2]));
        assert!(read_bytes("i.gz", &padded).is_err());
        // 16 MB of zeros after a header for 2 images of 1x2: inflated 1 byte past the header
        let mut bomb = img.clone();
        bomb.extend(vec![0u8; 16 << 20]);
        let e = read_bytes("i.gz", &gzip(&bomb)).unwrap_err();
        assert_eq!(
            e,
            "i.gz: too long: the header says [2, 1, 2] (4 bytes of data) but the file has more"
        );
        // a header promising more than the gzip bytes could hold
        let e = read_bytes("i.gz", &gzip(&images(60000, 4000, 4000, &[]))).unwrap_err();
        assert!(
            e.contains("truncated: its header says [60000, 4000, 4000]"),
            "{e}"
        );
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
