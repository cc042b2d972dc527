//! Token data for language models: a token store (bytes of a text file, generated ids, or a
//! memory-mapped file of little-endian `u16`/`u32` ids, nanoGPT's `prepare.py` format) and the
//! windows a dataset numbers over it. Token ids stay integers from the file to the model.
//!
//! `data.kind = "tokens"` maps the file (`memmap2`) instead of reading it: memory does not grow
//! with the file. Ids are checked against the vocabulary in chunks of `CHECK_CHUNK` tokens, the
//! first chunk of each file when it is opened (a file of the wrong dtype or vocabulary is bad
//! input before anything is written) and every other chunk the first time a window reaches it,
//! never the whole file up front. Pages read are handed back to the kernel (`MADV_DONTNEED`;
//! the file stays in the page cache), so the process's resident set stays small however much
//! of a large file an epoch visits.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

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

/// A memory-mapped token file.
#[derive(Debug)]
pub struct Mapped {
    map: memmap2::Mmap,
    dtype: TokenDType,
    path: PathBuf,
    /// Per chunk of `CHECK_CHUNK` tokens: 0 unchecked, 1 checked.
    checked: Vec<AtomicU8>,
}

/// Where a dataset's tokens are.
#[derive(Debug)]
pub enum TokenStore {
    /// Bytes (byte-level text, vocabulary 256).
    Bytes(Vec<u8>),
    /// Ids in memory (generated data).
    Ids(Vec<u32>),
    /// A token file, mapped.
    Mapped(Mapped),
}

impl TokenStore {
    pub fn len(&self) -> usize {
        match self {
            TokenStore::Bytes(b) => b.len(),
            TokenStore::Ids(v) => v.len(),
            TokenStore::Mapped(m) => m.map.len() / m.dtype.size(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Maps the token file `path` of `dtype` (named by config key `key`), checking its length and
    /// its first chunk of ids against `vocab`.
    pub fn map(
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
        // SAFETY: the map is read-only; kiln never writes the file, and a file changed under a
        // running job is outside what it can protect against (as for any reader of it).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let tokens = map.len() / dtype.size();
        let chunks = tokens.div_ceil(CHECK_CHUNK);
        let store = TokenStore::Mapped(Mapped {
            map,
            dtype,
            path: path.to_path_buf(),
            checked: (0..chunks).map(|_| AtomicU8::new(0)).collect(),
        });
        if tokens > 0 {
            store.check_chunk(0, vocab)?;
        }
        Ok(store)
    }

    /// Checks chunk `c` (of `CHECK_CHUNK` tokens) of a mapped file against `vocab`, once.
    fn check_chunk(&self, c: usize, vocab: usize) -> Result<(), DataError> {
        let TokenStore::Mapped(m) = self else {
            return Ok(());
        };
        if m.checked[c].load(Ordering::Acquire) == 1 {
            return Ok(());
        }
        let start = c * CHECK_CHUNK;
        let end = (start + CHECK_CHUNK).min(self.len());
        let bad = match m.dtype {
            TokenDType::U16 => m.map[start * 2..end * 2]
                .chunks_exact(2)
                .position(|b| usize::from(u16::from_le_bytes([b[0], b[1]])) >= vocab),
            TokenDType::U32 => m.map[start * 4..end * 4]
                .chunks_exact(4)
                .position(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize >= vocab),
        };
        m.release(start, end);
        if let Some(i) = bad {
            let at = start + i;
            return Err(DataError::Invalid(format!(
                "{}: token {at} (byte offset {}) is id {}, not below `model.vocab_size` = {vocab}; set `model.vocab_size` above the largest id (`kiln tokenize` prints it), or check `data.dtype` (= \"{}\")",
                m.path.display(),
                at * m.dtype.size(),
                self.get(at),
                m.dtype.name()
            )));
        }
        m.checked[c].store(1, Ordering::Release);
        Ok(())
    }

    /// Token `i` (in range).
    fn get(&self, i: usize) -> u32 {
        match self {
            TokenStore::Bytes(b) => u32::from(b[i]),
            TokenStore::Ids(v) => v[i],
            TokenStore::Mapped(m) => match m.dtype {
                TokenDType::U16 => u32::from(u16::from_le_bytes([m.map[2 * i], m.map[2 * i + 1]])),
                TokenDType::U32 => u32::from_le_bytes([
                    m.map[4 * i],
                    m.map[4 * i + 1],
                    m.map[4 * i + 2],
                    m.map[4 * i + 3],
                ]),
            },
        }
    }

    /// Appends tokens `start..start + len` to `out`, checking the chunks they are in first
    /// (mapped files) against `vocab`.
    pub fn read(
        &self,
        start: usize,
        len: usize,
        vocab: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), DataError> {
        let end = start + len;
        if let TokenStore::Mapped(m) = self {
            for c in start / CHECK_CHUNK..end.div_ceil(CHECK_CHUNK) {
                self.check_chunk(c, vocab)?;
            }
            out.reserve(len);
            out.extend((start..end).map(|i| self.get(i)));
            m.release(start, end);
            return Ok(());
        }
        out.extend((start..end).map(|i| self.get(i)));
        Ok(())
    }
}

impl Mapped {
    /// Hands the pages of tokens `start..end` back to the kernel: they leave this process's
    /// resident set (the file stays in the page cache; a later read faults them in again).
    fn release(&self, start: usize, end: usize) {
        let size = self.dtype.size();
        let page = 4096;
        // whole pages inside the range only: a page shared with a neighbour is left
        let from = (start * size).div_ceil(page) * page;
        let to = (end * size) / page * page;
        if to > from {
            // SAFETY: a read-only file mapping; the pages are re-read from the file on the next
            // access, so dropping them changes no value anyone sees.
            let _ = unsafe {
                self.map
                    .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from)
            };
        }
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
/// for evaluation (or the last `data.eval_fraction` of `data.path`), mapped.
pub fn load(r: &crate::config::Resolved) -> Result<super::Data, DataError> {
    let c = &r.config.data;
    let Some(value) = &c.path else {
        return Err(DataError::Invalid(
            "`data.kind` = \"tokens\" needs `data.path`: a token file (nanoGPT's `train.bin`, or `kiln tokenize`'s output)".into(),
        ));
    };
    let dtype = match c.dtype.unwrap_or(crate::config::TokenFileDtype::U16) {
        crate::config::TokenFileDtype::U16 => TokenDType::U16,
        crate::config::TokenFileDtype::U32 => TokenDType::U32,
    };
    let vocab = r.config.model.vocab_size.unwrap_or(256);
    let block = r.config.model.block_size.unwrap_or(128).max(1);
    let stride = c.stride.unwrap_or(block);
    let path = r.path_of("data.path", value);
    let store = std::sync::Arc::new(TokenStore::map(&path, "data.path", dtype, vocab)?);
    let what = path.display().to_string();
    let Some(eval) = &c.eval_path else {
        return super::text::split(
            store,
            &what,
            block,
            stride,
            c.eval_fraction.unwrap_or(0.1),
            vocab,
            "tokens",
        );
    };
    let mut data = super::text::split(store, &what, block, stride, 0.0, vocab, "tokens")?;
    let eval_path = r.path_of("data.eval_path", eval);
    let es = std::sync::Arc::new(TokenStore::map(&eval_path, "data.eval_path", dtype, vocab)?);
    let width = block + 1;
    if es.len() < width {
        return Err(DataError::Invalid(format!(
            "{} (data.eval_path) has {} tokens, shorter than one window of model.block_size + 1 = {width}",
            eval_path.display(),
            es.len()
        )));
    }
    let len = es.len();
    // every held-out target scored once: windows every block tokens
    data.eval = Some(super::Dataset::windows(Windows::over(
        es, 0, len, width, block, vocab,
    )));
    Ok(data)
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
    fn a_mapped_file_is_checked_by_chunk_naming_the_offset() {
        let d = crate::testdir::tempdir().unwrap();
        let p = d.path().join("t.bin");
        // u16: two chunks, the bad id in the second
        let mut ids: Vec<u16> = (0..(CHECK_CHUNK + 100) as u32)
            .map(|i| (i % 50) as u16)
            .collect();
        ids[CHECK_CHUNK + 7] = 300;
        let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&p, &bytes).unwrap();
        let store = TokenStore::map(&p, "data.path", TokenDType::U16, 256).unwrap();
        assert_eq!(store.len(), CHECK_CHUNK + 100);
        let mut out = Vec::new();
        store.read(5, 3, 256, &mut out).unwrap();
        assert_eq!(out, [5, 6, 7]);
        let e = store
            .read(CHECK_CHUNK, 4, 256, &mut out)
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
        let e = TokenStore::map(&p, "data.path", TokenDType::U16, 40)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token 40 (byte offset 80) is id 40"), "{e}");
        // a length that is not whole tokens
        std::fs::write(&p, [1u8, 0, 2]).unwrap();
        let e = TokenStore::map(&p, "data.path", TokenDType::U16, 256)
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
        let s = TokenStore::map(&p, "data.path", TokenDType::U32, 100_000).unwrap();
        out.clear();
        s.read(0, 2, 100_000, &mut out).unwrap();
        assert_eq!(out, [7, 70_000]);
    }
}
