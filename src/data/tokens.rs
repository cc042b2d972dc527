//! Token data for language models: a token store (bytes of a text file, generated ids, or a
//! file of little-endian `u16`/`u32` ids, nanoGPT's `prepare.py` format) and the windows a
//! dataset numbers over it. Token ids stay integers from the file to the model.
//!
//! `data.kind = "tokens"` reads each window from the file when it is asked for (a positional
//! read of its bytes; the file stays in the page cache), never the whole file: memory does not
//! grow with the file. The first chunk of `CHECK_CHUNK` tokens is checked when the file is
//! opened (a file of the wrong dtype or vocabulary is bad input before anything is written),
//! and every window's ids when it is read: a file changed or truncated under a running job is
//! an error naming it, never ids past the vocabulary (the embedding would panic) nor a SIGBUS
//! (what a memory map of a truncated file gives).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::DataError;

/// Tokens checked against the vocabulary at a time (64 MiB of `u32`s).
pub const CHECK_CHUNK: usize = 1 << 24;

/// The element type of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenDType {
    U16,
    U32,
}

impl TokenDType {
    pub fn size(self) -> usize {
        match self {
            TokenDType::U16 => 2,
            TokenDType::U32 => 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            TokenDType::U16 => "u16",
            TokenDType::U32 => "u32",
        }
    }
}

/// A token file, read a window at a time.
#[derive(Debug)]
pub struct TokenFile {
    file: std::fs::File,
    dtype: TokenDType,
    path: PathBuf,
    /// Its length in tokens when it was opened.
    tokens: usize,
}

/// Where a dataset's tokens are.
#[derive(Debug)]
pub enum TokenStore {
    /// Bytes (byte-level text, vocabulary 256).
    Bytes(Vec<u8>),
    /// Ids in memory (generated data).
    Ids(Vec<u32>),
    /// A token file, read a window at a time.
    File(TokenFile),
}

impl TokenStore {
    pub fn len(&self) -> usize {
        match self {
            TokenStore::Bytes(b) => b.len(),
            TokenStore::Ids(v) => v.len(),
            TokenStore::File(m) => m.tokens,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opens the token file `path` of `dtype` (named by config key `key`), checking its length,
    /// its first chunk of ids against `vocab`, and (u16) that it is not u32 ids.
    pub fn open(
        path: &Path,
        key: &'static str,
        dtype: TokenDType,
        vocab: usize,
    ) -> Result<Self, DataError> {
        let io = |source| DataError::Io {
            path: path.to_path_buf(),
            key,
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len % dtype.size() as u64 != 0 {
            return Err(DataError::Invalid(format!(
                "{} ({key}): {len} bytes is not a whole number of {} tokens ({} bytes each); is `data.dtype` right? (nanoGPT's files are u16)",
                path.display(),
                dtype.name(),
                dtype.size()
            )));
        }
        let m = TokenFile {
            file,
            dtype,
            path: path.to_path_buf(),
            tokens: usize::try_from(len).unwrap_or(usize::MAX) / dtype.size(),
        };
        // the first chunk, a piece at a time (a 16 Mi-token buffer would be 96-128 MiB)
        let piece = 1 << 20;
        let mut ids = Vec::with_capacity(piece);
        for at in (0..m.tokens.min(CHECK_CHUNK)).step_by(piece) {
            ids.clear();
            m.ids(at, piece.min(m.tokens - at), &mut ids)?;
            m.check(at, &ids, vocab)?;
            if at == 0 {
                m.not_u32(&ids)?;
            }
        }
        Ok(TokenStore::File(m))
    }

    /// Appends tokens `start..start + len` to `out`, checked (files) against `vocab`.
    pub fn read(
        &self,
        start: usize,
        len: usize,
        vocab: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        let end = start + len;
        match self {
            TokenStore::Bytes(b) => out.extend(b[start..end].iter().map(|&t| u32::from(t))),
            TokenStore::Ids(v) => out.extend_from_slice(&v[start..end]),
            TokenStore::File(m) => {
                let at = out.len();
                m.ids(start, len, out)?;
                m.check(start, &out[at..], vocab)?;
            }
        }
        Ok(())
    }
}

impl TokenFile {
    /// Appends tokens `start..start + len` of the file to `out`, read from it now: a file that
    /// is shorter than when it was opened is an error naming it.
    fn ids(&self, start: usize, len: usize, out: &mut Vec<u32>) -> Result<(), DataError> {
        let size = self.dtype.size();
        let mut bytes = vec![0u8; len * size];
        if let Err(e) = self.file.read_exact_at(&mut bytes, (start * size) as u64) {
            let now = std::fs::metadata(&self.path).map(|m| m.len()).ok();
            return Err(DataError::Invalid(format!(
                "{}: tokens {start}..{} could not be read ({e}); the file {} since the run opened it ({} tokens then): a token file must not change under a run; restore it, or start a new run",
                self.path.display(),
                start + len,
                match now {
                    Some(n) => format!("has {} tokens now", n / size as u64),
                    None => "is gone".into(),
                },
                self.tokens
            )));
        }
        out.reserve(len);
        match self.dtype {
            TokenDType::U16 => out.extend(
                bytes
                    .chunks_exact(2)
                    .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]]))),
            ),
            TokenDType::U32 => out.extend(
                bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
        Ok(())
    }

    /// The ids `ids` (tokens `start..`) against `vocab`: the first one out of range is an
    /// error naming the file, the token and its byte offset.
    fn check(&self, start: usize, ids: &[u32], vocab: usize) -> Result<(), DataError> {
        let Some(i) = ids.iter().position(|&t| t as usize >= vocab) else {
            return Ok(());
        };
        let at = start + i;
        Err(DataError::Invalid(format!(
            "{}: token {at} (byte offset {}) is id {}, not below `model.vocab_size` = {vocab}; set `model.vocab_size` above the largest id (`kiln tokenize` prints it), or check `data.dtype` (= \"{}\"); a file changed under a running job shows here too",
            self.path.display(),
            at * self.dtype.size(),
            ids[i],
            self.dtype.name()
        )))
    }

    /// A file of u32 ids read as u16 (the default) has the ids' high halves at every odd
    /// position: small numbers (below 16 for any vocabulary under a million), mostly 0, while
    /// the low halves at the even positions are mostly not. With at least 128 tokens like that
    /// the file is refused as u32 (real u16 text has ids of every size at every position).
    fn not_u32(&self, first: &[u32]) -> Result<(), DataError> {
        if self.dtype != TokenDType::U16 || first.len() < 128 {
            return Ok(());
        }
        let n = first.len() / 2;
        let high = || first.iter().skip(1).step_by(2).take(n);
        let low = || first.iter().step_by(2).take(n);
        let small = high().all(|&t| t < 16);
        let high_zero = high().filter(|&&t| t == 0).count();
        let low_zero = low().filter(|&&t| t == 0).count();
        if small && 2 * high_zero >= n && 2 * low_zero < n {
            return Err(DataError::Invalid(format!(
                "{}: every second u16 of its first {} is below 16 and most are 0, as the high halves of u32 ids read as u16; set `data.dtype = \"u32\"` (`kiln tokenize` prints the dtype it wrote)",
                self.path.display(),
                first.len()
            )));
        }
        Ok(())
    }
}

/// `count` windows of `width` tokens, window `i` starting at token `offset + i * stride` of a
/// store; ids below `vocab`.
#[derive(Debug, Clone)]
pub struct Windows {
    pub store: std::sync::Arc<TokenStore>,
    pub offset: usize,
    pub count: usize,
    pub width: usize,
    pub stride: usize,
    pub vocab: usize,
}

impl Windows {
    /// The windows of `width` tokens every `stride` tokens in tokens `from..to` of `store`.
    pub fn over(
        store: std::sync::Arc<TokenStore>,
        from: usize,
        to: usize,
        width: usize,
        stride: usize,
        vocab: usize,
    ) -> Self {
        let stride = stride.max(1);
        let count = if to >= from + width {
            (to - from - width) / stride + 1
        } else {
            0
        };
        Windows {
            store,
            offset: from,
            count,
            width,
            stride,
            vocab,
        }
    }

    /// Appends window `i`'s tokens to `out`.
    pub fn read(&self, i: usize, out: &mut Vec<u32>) -> Result<(), DataError> {
        self.store
            .read(self.offset + i * self.stride, self.width, self.vocab, out)
    }
}

/// `data.kind = "tokens"`: nanoGPT's token files, `data.path` for training and `data.eval_path`
/// for evaluation (or the last `data.eval_fraction` of `data.path`), read a window at a time.
pub fn load(r: &crate::config::Resolved) -> Result<super::Data, DataError> {
    let c = &r.config.data;
    let Some(value) = &c.path else {
        return Err(DataError::Invalid(
            "`data.kind` = \"tokens\" needs `data.path`: a token file (nanoGPT's `train.bin`, or `kiln tokenize`'s output)".into(),
        ));
    };
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let stride = c.stride.unwrap_or(block);
    let path = r.path_of("data.path", value);
    let store = std::sync::Arc::new(TokenStore::open(&path, "data.path", dtype(c), vocab)?);
    let what = path.display().to_string();
    let eval = super::text::eval_file(r)?;
    let fraction = match eval {
        Some(_) => 0.0,
        None => c.eval_fraction.unwrap_or(0.1),
    };
    let mut data = super::text::split(store, &what, block, stride, fraction, vocab, "tokens")?;
    if eval.is_some() {
        data.eval = eval;
    }
    Ok(data)
}

/// `data.dtype`: the element type of the token files (default u16, nanoGPT's).
pub fn dtype(c: &crate::config::DataConfig) -> TokenDType {
    match c.dtype.unwrap_or(crate::config::TokenFileDtype::U16) {
        crate::config::TokenFileDtype::U16 => TokenDType::U16,
        crate::config::TokenFileDtype::U32 => TokenDType::U32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_start_every_stride_and_stay_inside() {
        let store = std::sync::Arc::new(TokenStore::Bytes((0..10).collect()));
        let w = Windows::over(store.clone(), 0, 10, 4, 3, 256);
        assert_eq!(w.count, 3);
        let mut out = Vec::new();
        w.read(1, &mut out).unwrap();
        assert_eq!(out, [3, 4, 5, 6]);
        assert_eq!(Windows::over(store, 0, 10, 11, 1, 256).count, 0);
    }

    #[test]
    fn a_token_file_is_checked_when_opened_and_by_window_naming_the_offset() {
        let d = crate::testdir::tempdir().unwrap();
        let p = d.path().join("t.bin");
        // u16: two chunks, the bad id in the second
        let mut ids: Vec<u16> = (0..(CHECK_CHUNK + 100) as u32)
            .map(|i| (i % 50) as u16)
            .collect();
        ids[CHECK_CHUNK + 7] = 300;
        let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&p, &bytes).unwrap();
        let store = TokenStore::open(&p, "data.path", TokenDType::U16, 256).unwrap();
        assert_eq!(store.len(), CHECK_CHUNK + 100);
        let mut out = Vec::new();
        store.read(5, 3, 256, &mut out).unwrap();
        assert_eq!(out, [5, 6, 7]);
        // (a window that ends before it is fine)
        store.read(CHECK_CHUNK, 4, 256, &mut out).unwrap();
        let e = store
            .read(CHECK_CHUNK + 5, 4, 256, &mut out)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "token {} (byte offset {}) is id 300",
                CHECK_CHUNK + 7,
                2 * (CHECK_CHUNK + 7)
            )),
            "{e}"
        );
        // a bad id in the first chunk is found when the file is opened
        let e = TokenStore::open(&p, "data.path", TokenDType::U16, 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token 40 (byte offset 80) is id 40"), "{e}");
        // a length that is not whole tokens
        std::fs::write(&p, [1u8, 0, 2]).unwrap();
        let e = TokenStore::open(&p, "data.path", TokenDType::U16, 256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("3 bytes is not a whole number of u16 tokens"),
            "{e}"
        );
        // u32
        let v: Vec<u8> = [7u32, 70_000]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        std::fs::write(&p, &v).unwrap();
        let s = TokenStore::open(&p, "data.path", TokenDType::U32, 100_000).unwrap();
        out.clear();
        s.read(0, 2, 100_000, &mut out).unwrap();
        assert_eq!(out, [7, 70_000]);
    }

    /// Issue 45, defects 4-6: a file truncated or rewritten under a run, and u32 ids read as
    /// u16, are errors naming the file (they were a SIGBUS, an embedding panic, and silent
    /// training on ids interleaved with zeros).
    #[test]
    fn a_token_file_changed_under_a_run_or_of_u32_read_as_u16_is_named() {
        let d = crate::testdir::tempdir().unwrap();
        let p = d.path().join("t.bin");
        let ids: Vec<u8> = (0..1000u16).flat_map(|i| (i % 200).to_le_bytes()).collect();
        std::fs::write(&p, &ids).unwrap();
        let store = TokenStore::open(&p, "data.path", TokenDType::U16, 256).unwrap();
        let mut out = Vec::new();
        store.read(900, 50, 256, &mut out).unwrap();
        // truncated under the run
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(1000)
            .unwrap();
        let e = store.read(900, 50, 256, &mut out).unwrap_err().to_string();
        assert!(
            e.contains("t.bin: tokens 900..950 could not be read")
                && e.contains("has 500 tokens now")
                && e.contains("(1000 tokens then)"),
            "{e}"
        );
        // rewritten in place with ids past the vocabulary
        let big: Vec<u8> = (0..1000u16).flat_map(|_| 65535u16.to_le_bytes()).collect();
        std::fs::write(&p, &big).unwrap();
        let e = store.read(10, 5, 256, &mut out).unwrap_err().to_string();
        assert!(e.contains("token 10 (byte offset 20) is id 65535"), "{e}");
        // u32 ids, read as u16
        let wide: Vec<u8> = (0..1000u32)
            .flat_map(|i| (i % 200 + 1).to_le_bytes())
            .collect();
        std::fs::write(&p, &wide).unwrap();
        let e = TokenStore::open(&p, "data.path", TokenDType::U16, 256)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("every second u16 of its first 2000 is below 16")
                && e.contains("data.dtype = \"u32\""),
            "{e}"
        );
        assert!(TokenStore::open(&p, "data.path", TokenDType::U32, 256).is_ok());
        // (a vocabulary past 65,535: the high halves are 0 or 1, still told apart)
        let big: Vec<u8> = (0..1000u32)
            .flat_map(|i| (i * 7919 % 100_000).to_le_bytes())
            .collect();
        std::fs::write(&p, &big).unwrap();
        let e = TokenStore::open(&p, "data.path", TokenDType::U16, 1 << 16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("data.dtype = \"u32\""), "{e}");
    }
}
