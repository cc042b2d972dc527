//! `kiln tokenize`'s work: a text file to nanoGPT-format token files (flat little-endian `u16`
//! ids, `u32` for vocabularies over 65,536), the training file and, with an eval fraction, the
//! held-out end of the text in a second file. The text is read mapped and tokenized in pieces
//! cut where a line ends and the next begins with a non-space (a place no tokenizer here joins
//! across), and the ids are written as they come: memory does not grow with the file. Both
//! files appear whole or not at all (written beside, then renamed).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::data::tokenizer::Tokenizer;
use crate::error::{Error, Result};

/// What to tokenize, with what, and where to.
#[derive(Debug, Clone)]
pub struct TokenizeOptions {
    pub input: PathBuf,
    /// The training file.
    pub out: PathBuf,
    /// `bytes`, `gpt2` or a `tokenizer.json` path.
    pub tokenizer: String,
    /// The end of the text held out for evaluation, in [0, 1).
    pub eval_fraction: Option<f64>,
    /// Where the held-out ids go (default: `val.bin` beside a `train.bin`, else
    /// `<stem>.val.<ext>`).
    pub eval_out: Option<PathBuf>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct TokenizeReport {
    pub train: (PathBuf, usize),
    pub eval: Option<(PathBuf, usize)>,
    pub vocab: usize,
    pub dtype: &'static str,
    /// The largest id written.
    pub max_id: u32,
    /// Invalid UTF-8 runs a `tokenizer.json` saw replaced by U+FFFD.
    pub replaced: usize,
}

/// The held-out file beside `out`: `val.bin` for a `train.bin`, else `<stem>.val.<ext>`.
fn eval_path_for(out: &Path) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned());
    let ext = out.extension().map(|e| e.to_string_lossy().into_owned());
    let name = match (stem.as_deref(), ext.as_deref()) {
        (Some("train"), Some(e)) => format!("val.{e}"),
        (Some(s), Some(e)) => format!("{s}.val.{e}"),
        (Some(s), None) => format!("{s}.val"),
        _ => "val.bin".into(),
    };
    out.with_file_name(name)
}

/// Where `text` may be cut into pieces tokenized apart, at or after `at`: just before a newline
/// that a byte other than whitespace follows. GPT-2's pre-tokenizer splits a run of
/// whitespace before a word into the run less its last character and that character (here the
/// newline, which no word takes as a prefix), so the run's end falls at the cut whether the
/// text goes on or not; the newline then starts the next piece as it would start its own
/// token.
fn cut_at(text: &[u8], at: usize) -> usize {
    let mut i = at.max(1);
    while i + 1 < text.len() {
        if text[i] == b'\n' && !text[i + 1].is_ascii_whitespace() {
            return i;
        }
        i += 1;
    }
    text.len()
}

/// Hands `sink` the ids of `text`, tokenized in pieces of about `piece` bytes (cut by
/// `cut_at`), with the invalid UTF-8 runs each piece had replaced.
fn encode_pieces(
    t: &Tokenizer,
    text: &[u8],
    piece: usize,
    sink: &mut dyn FnMut(&[u32], usize) -> Result<()>,
) -> Result<()> {
    let mut start = 0;
    // a tokenizer that never cuts cleanly (one that marks the start of every piece, as a
    // `Prepend("▁")` normalizer does) is found after a few tries, and the text from there
    // goes whole (trying every line of a large file would take hours)
    while start < text.len() {
        let mut end = cut_at(text, start.saturating_add(piece));
        let mut failed = 0;
        while end < text.len() && !cuts_cleanly(t, text, end)? {
            failed += 1;
            end = if failed >= 8 {
                text.len()
            } else {
                cut_at(text, end + 1)
            };
        }
        let (ids, r) = t.encode(&text[start..end]).map_err(Error::Usage)?;
        sink(&ids, r)?;
        start = end;
    }
    Ok(())
}

/// Whether `text` may be cut at `at` for `t`: always for GPT-2 and bytes (see `cut_at`); for a
/// tokenizer.json, whose pre-tokenizer kiln does not know, when the 4 KiB on either side
/// tokenize to the same ids in two pieces as in one (issue 45, defect 11: its text went in
/// one piece, 30 MB of it peaking at 3.1 GB).
fn cuts_cleanly(t: &Tokenizer, text: &[u8], at: usize) -> Result<bool> {
    if !matches!(t, Tokenizer::HuggingFace { .. }) {
        return Ok(true);
    }
    // the window's own ends fall on character starts, the same in both encodings
    let starts = |i: usize| i >= text.len() || (text[i] & 0xC0) != 0x80;
    let mut lo = at.saturating_sub(4096);
    while !starts(lo) {
        lo += 1;
    }
    let mut hi = (at + 4096).min(text.len());
    while !starts(hi) {
        hi -= 1;
    }
    let enc = |a: usize, b: usize| t.encode(&text[a..b]).map(|e| e.0).map_err(Error::Usage);
    let mut apart = enc(lo, at)?;
    apart.extend(enc(at, hi)?);
    Ok(apart == enc(lo, hi)?)
}

/// Where the ids go (`-o`) and the held-out ids (`--eval-out`, with `--eval-fraction`): files
/// that may be replaced, neither the other nor the text being tokenized.
fn outputs(o: &TokenizeOptions) -> Result<(PathBuf, Option<PathBuf>)> {
    let out = crate::rundir::output_path(&o.out, "-o")?;
    let eval_out = match o.eval_fraction.filter(|f| *f > 0.0) {
        Some(_) => {
            let p = o.eval_out.clone().unwrap_or_else(|| eval_path_for(&o.out));
            let p = crate::rundir::output_path(&p, "--eval-out")?;
            if p == out {
                return Err(Error::Usage(format!(
                    "the held-out ids would go to `{}`, the training file; give --eval-out another path",
                    p.display()
                )));
            }
            Some(p)
        }
        None => None,
    };
    // the ids never replace the text they come from (issue 45, defect 9)
    if let Ok(input) = o.input.canonicalize() {
        for (flag, p) in [("-o", Some(&out)), ("--eval-out", eval_out.as_ref())] {
            if p == Some(&input) {
                return Err(Error::Usage(format!(
                    "{flag} `{}` is the text file being tokenized; give the token ids another path",
                    input.display()
                )));
            }
        }
    }
    Ok((out, eval_out))
}

/// `tmp` made new, never opened through what is there (issue 45, defect 10): an interrupted
/// run's leftover, or a link planted in its place, is removed (a link itself, never its
/// target), and a file that appears in between fails the exclusive create.
fn create_new(tmp: &Path) -> Result<std::fs::File> {
    let io = |e| Error::io(format!("writing {}", tmp.display()), e);
    if let Ok(m) = std::fs::symlink_metadata(tmp) {
        if m.is_dir() {
            return Err(Error::Usage(format!(
                "`{}` (tokenize's temporary file) is a directory; remove it",
                tmp.display()
            )));
        }
        std::fs::remove_file(tmp).map_err(io)?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(io)
}

/// Removes the temporary files of earlier tokenizes to `out` that were killed (their process
/// is gone), and the one older builds named without a pid: a per-process name alone would
/// leave each interrupted tokenize's file, as large as its output, for good. A link is
/// removed itself, never followed.
fn remove_stale_tmps(out: &Path) {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let prefix = format!(".{name}.kiln-tmp");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = file.strip_prefix(&prefix) else {
            continue;
        };
        let gone = match rest.strip_prefix('-').map(str::parse::<i32>) {
            // SAFETY: kill with signal 0 only asks whether the process exists.
            Some(Ok(pid)) => {
                pid > 0
                    && unsafe { libc::kill(pid, 0) } != 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            }
            Some(Err(_)) => false,
            None => rest.is_empty(),
        };
        if gone && e.file_type().is_ok_and(|t| !t.is_dir()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Tokenizes `o.input` into `o.out` (and the held-out file). The directories of the outputs
/// are made when missing (issue 58, defect 15: `-o newdir/train.bin` failed), and removed again
/// when the tokenize fails.
pub fn tokenize(o: &TokenizeOptions) -> Result<TokenizeReport> {
    let parents: Vec<PathBuf> = std::iter::once(Some(&o.out))
        .chain(std::iter::once(o.eval_out.as_ref()))
        .flatten()
        .filter_map(|p| p.parent().filter(|d| !d.as_os_str().is_empty()))
        .map(Path::to_path_buf)
        .collect();
    let mut made: Vec<(PathBuf, PathBuf)> = Vec::new();
    for dir in &parents {
        if let Some(top) = crate::rundir::first_missing(dir) {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("making the directory {}", dir.display()), e))?;
            made.push((dir.clone(), top));
        }
    }
    let result = tokenize_into(o);
    if result.is_err() {
        // the directories made here, deepest first, while empty
        for (dir, top) in &made {
            for d in dir.ancestors() {
                if std::fs::remove_dir(d).is_err() || d == top.as_path() {
                    break;
                }
            }
        }
    }
    result
}

fn tokenize_into(o: &TokenizeOptions) -> Result<TokenizeReport> {
    if let Some(f) = o.eval_fraction {
        if !(0.0..1.0).contains(&f) {
            return Err(Error::Usage(format!(
                "--eval-fraction {f} is out of range: give a fraction in [0, 1)"
            )));
        }
    }
    let t = Tokenizer::load(&o.tokenizer, Path::new("."))
        .map_err(|e| Error::Usage(format!("--tokenizer: {e}")))?;
    let (out, eval_out) = outputs(o)?;
    let vocab = t.vocab_size();
    let wide = vocab > 1 << 16;
    let size = if wide { 4 } else { 2 };
    // the input is bad input when it cannot be read
    let unreadable = |e: std::io::Error| {
        Error::Usage(format!(
            "cannot read the text file `{}`: {e}",
            o.input.display()
        ))
    };
    let file = std::fs::File::open(&o.input).map_err(unreadable)?;
    if !file.metadata().map_err(unreadable)?.is_file() {
        return Err(Error::Usage(format!(
            "`{}` is not a regular file; give the text file to tokenize",
            o.input.display()
        )));
    }
    // SAFETY: read-only map of a file kiln does not change; one changed under it is the
    // writer's to answer for, as for any reader.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(unreadable)?;
    let text: &[u8] = &map;
    // the ids, written beside the training file as they come
    // (this process's own: two tokenizes to one `-o` never share it)
    let tmp = out.with_file_name(format!(
        ".{}.kiln-tmp-{}",
        out.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let io = |what: &Path| {
        let what = what.display().to_string();
        move |e| Error::io(format!("writing {what}"), e)
    };
    remove_stale_tmps(&out);
    let file = create_new(&tmp)?;
    let mut w = std::io::BufWriter::new(file);
    let (mut count, mut max_id, mut replaced) = (0usize, 0u32, 0usize);
    let written = (|| -> Result<()> {
        // (a tokenizer.json's pieces are smaller: `tokenizers` takes ~100 bytes per byte)
        let piece = match t {
            Tokenizer::HuggingFace { .. } => 1 << 20,
            _ => 8 << 20,
        };
        encode_pieces(&t, text, piece, &mut |ids, r| {
            replaced += r;
            for &id in ids {
                max_id = max_id.max(id);
                if wide {
                    w.write_all(&id.to_le_bytes()).map_err(io(&tmp))?;
                } else {
                    w.write_all(&(id as u16).to_le_bytes()).map_err(io(&tmp))?;
                }
                count += 1;
            }
            Ok(())
        })
        .map_err(|e| match e {
            Error::Usage(m) => Error::Usage(format!("{}: {m}", o.input.display())),
            e => e,
        })?;
        w.flush().map_err(io(&tmp))?;
        Ok(())
    })();
    let finish = (|| -> Result<TokenizeReport> {
        written?;
        let f = w.into_inner().map_err(|e| io(&tmp)(e.into_error()))?;
        let held = o
            .eval_fraction
            .map_or(0, |frac| (count as f64 * frac).round() as usize);
        let eval = match &eval_out {
            Some(p) => {
                // the tail of the ids, copied to the held-out file a buffer at a time (issue 45,
                // defect 12: the whole file was read), then cut from the training file
                use std::io::{Seek, SeekFrom};
                let at = (count - held) * size;
                let mut src = std::fs::File::open(&tmp).map_err(io(&tmp))?;
                src.seek(SeekFrom::Start(at as u64)).map_err(io(&tmp))?;
                crate::rundir::replace_file_with(p, |dst| std::io::copy(&mut src, dst).map(|_| ()))
                    .map_err(io(p))?;
                f.set_len(at as u64).map_err(io(&tmp))?;
                Some((p.clone(), held))
            }
            None => None,
        };
        f.sync_all().map_err(io(&tmp))?;
        drop(f);
        std::fs::rename(&tmp, &out).map_err(io(&out))?;
        Ok(TokenizeReport {
            train: (out.clone(), count - held),
            eval,
            vocab,
            dtype: if wide { "u32" } else { "u16" },
            max_id,
            replaced,
        })
    })();
    if finish.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    finish
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_cut_where_a_line_starts_with_a_non_space() {
        let t = b"ab\n  cd\nef\n\ngh\nij";
        // before a newline a word follows: "ab\n  cd" | "\nef\n" | "\ngh" | "\nij"
        assert_eq!(cut_at(t, 0), 7);
        assert_eq!(cut_at(t, 8), 11);
        assert_eq!(cut_at(t, 12), 14);
        assert_eq!(cut_at(t, 15), t.len());
        assert_eq!(
            eval_path_for(Path::new("d/train.bin")),
            Path::new("d/val.bin")
        );
        assert_eq!(
            eval_path_for(Path::new("d/book.bin")),
            Path::new("d/book.val.bin")
        );
    }

    #[test]
    fn gpt2_ids_in_pieces_are_the_ids_of_the_whole_text() {
        let text = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/data/text/rust-book.txt"),
        )
        .unwrap();
        let text = &text[..40_000];
        let t = Tokenizer::load("gpt2", Path::new(".")).unwrap();
        let whole = t.encode(text).unwrap().0;
        let mut pieces = Vec::new();
        let mut n = 0;
        encode_pieces(&t, text, 300, &mut |ids, _| {
            pieces.extend_from_slice(ids);
            n += 1;
            Ok(())
        })
        .unwrap();
        assert!(n > 50, "{n} pieces");
        assert_eq!(pieces, whole);
    }

    /// Issue 45, defect 11: a tokenizer.json's text goes in pieces where that changes no id,
    /// and stays whole where it would (a merge across the newline, no pre-tokenizer).
    #[test]
    fn tokenizer_json_ids_in_pieces_are_the_ids_of_the_whole_text() {
        let d = crate::testdir::tempdir().unwrap();
        let words = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"\u010a":2,"\u0120":3,"ab":4,"\u0120a":5},"merges":[["a","b"],["\u0120","a"]]}}"#;
        let glued = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":null,"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{"a":0,"b":1,"\n":2,"b\n":3},"merges":[["b","\n"]]}}"#;
        std::fs::write(d.path().join("words.json"), words).unwrap();
        std::fs::write(d.path().join("glued.json"), glued).unwrap();
        // (glued: "b\n" is one token, so no cut before a newline after "b" is clean, and one
        // after "a" is)
        for (file, text, cut) in [
            ("words.json", "ab a\nba ab\n".repeat(200), true),
            ("glued.json", "ab ab\n".repeat(200), false),
            ("glued.json", "ab a\nba ab\n".repeat(200), true),
        ] {
            let t = Tokenizer::load(file, d.path()).unwrap();
            let whole = t.encode(text.as_bytes()).unwrap().0;
            let (mut pieces, mut n) = (Vec::new(), 0);
            encode_pieces(&t, text.as_bytes(), 100, &mut |ids, _| {
                pieces.extend_from_slice(ids);
                n += 1;
                Ok(())
            })
            .unwrap();
            assert_eq!(pieces, whole, "{file}");
            assert_eq!(n > 10, cut, "{file}: {n} pieces");
        }
    }
}
