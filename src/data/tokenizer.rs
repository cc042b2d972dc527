//! Tokenizers (`data.tokenizer`): bytes (each byte a token, vocabulary 256), GPT-2's byte-level
//! BPE (`"gpt2"`, r50k: the vocabulary ships inside the `tiktoken-rs` crate, so it works
//! offline) and Hugging Face `tokenizer.json` files (the `tokenizers` crate, without its
//! download feature). Text is bytes here: the byte-level ones encode any bytes, valid UTF-8 or
//! not, and decode them back unchanged.

use std::path::{Path, PathBuf};

/// A tokenizer.
pub enum Tokenizer {
    Bytes,
    /// GPT-2's BPE, with the token of each single byte (for bytes that are not UTF-8).
    Gpt2 {
        bpe: Box<tiktoken_rs::CoreBPE>,
        byte_token: Box<[u32; 256]>,
    },
    HuggingFace {
        tokenizer: Box<tokenizers::Tokenizer>,
        path: PathBuf,
    },
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The tokenizer `data.tokenizer` names (a path relative to the file that set it).
pub fn from_config(r: &crate::config::Resolved) -> Result<Tokenizer, super::DataError> {
    let spec = &r.config.data.tokenizer;
    let loaded = match spec.as_str() {
        "bytes" | "gpt2" => Tokenizer::load(spec, Path::new(".")),
        path => {
            let p = r.path_of("data.tokenizer", path);
            Tokenizer::load(&p.to_string_lossy(), Path::new("."))
        }
    };
    loaded.map_err(|e| super::DataError::Invalid(format!("`data.tokenizer`: {e}")))
}

/// The tokenizer.json that `path` names: itself, or a Hugging Face model directory's.
pub fn json_file(path: std::path::PathBuf) -> std::path::PathBuf {
    if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path
    }
}

/// Each id's byte range in the text it was encoded from.
pub type Offsets = Vec<(usize, usize)>;

/// GPT-2's end-of-text token.
pub const GPT2_EOT: u32 = 50256;

/// The `eos_token` of a tokenizer_config.json or special_tokens_map.json: a string, or an
/// added token's `{"content": ...}`.
fn eos_token_of(v: &serde_json::Value) -> Option<String> {
    match &v["eos_token"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl Tokenizer {
    /// `spec`: `"bytes"`, `"gpt2"`, or the path of a `tokenizer.json` (relative paths against
    /// `base`).
    pub fn load(spec: &str, base: &Path) -> Result<Self, String> {
        match spec {
            "bytes" => Ok(Tokenizer::Bytes),
            "gpt2" => {
                let bpe = tiktoken_rs::r50k_base().map_err(|e| format!("GPT-2's BPE: {e}"))?;
                // GPT-2 has a token for every single byte
                let mut byte_token = [u32::MAX; 256];
                for rank in 0..GPT2_EOT {
                    if let Ok(b) = bpe.decode_bytes(&[rank]) {
                        if let [one] = b[..] {
                            byte_token[usize::from(one)] = rank;
                        }
                    }
                }
                if byte_token.contains(&u32::MAX) {
                    return Err("GPT-2's BPE lacks a token for some byte".into());
                }
                Ok(Tokenizer::Gpt2 {
                    bpe: Box::new(bpe),
                    byte_token: Box::new(byte_token),
                })
            }
            path => {
                let p = json_file(base.join(path));
                if !p.is_file() {
                    return Err(format!(
                        "`{path}` is neither \"bytes\", \"gpt2\" nor a tokenizer.json file ({} not found)",
                        p.display()
                    ));
                }
                // `tokenizers` panics on some files it cannot use (a BPE merge of a token with
                // itself: issue 45, defect 1) and quotes the file in its errors (a 200 MB
                // `version` string: defect 13): both are said about the file, briefly
                let loaded = crate::panic::catch_quietly(|| tokenizers::Tokenizer::from_file(&p));
                let t = match loaded {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        return Err(format!(
                            "{}: not a tokenizer.json Hugging Face's `tokenizers` reads: {}",
                            p.display(),
                            crate::config::brief(&e.to_string(), 300)
                        ))
                    }
                    Err(panic) => {
                        return Err(format!(
                            "{}: Hugging Face's `tokenizers` cannot build a tokenizer from it ({}); check its `model` (vocab and merges)",
                            p.display(),
                            crate::config::brief(&crate::panic::message(panic.as_ref()), 300)
                        ))
                    }
                };
                Ok(Tokenizer::HuggingFace {
                    tokenizer: Box::new(t),
                    path: p,
                })
            }
        }
    }

    /// How it is named in config and messages.
    pub fn name(&self) -> String {
        match self {
            Tokenizer::Bytes => "bytes".into(),
            Tokenizer::Gpt2 { .. } => "gpt2".into(),
            Tokenizer::HuggingFace { path, .. } => path.display().to_string(),
        }
    }

    /// Token ids run from 0 to this (exclusive): the largest id + 1, the rows an embedding
    /// needs (a tokenizer.json's ids need not be dense: its entry count can be far below its
    /// largest id, issue 45, defects 7 and 8).
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Gpt2 { .. } => GPT2_EOT as usize + 1,
            Tokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .get_vocab(true)
                .values()
                .max()
                .map_or(0, |&m| m as usize + 1)
                .max(tokenizer.get_vocab_size(true)),
        }
    }

    /// The end-of-text token, where the tokenizer has one.
    pub fn eot(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Gpt2 { .. } => Some(GPT2_EOT),
            Tokenizer::HuggingFace { tokenizer, .. } => ["<|endoftext|>", "</s>", "<eos>"]
                .iter()
                .find_map(|t| tokenizer.token_to_id(t)),
        }
    }

    /// The ids of `text` (special-token text is ordinary text, as nanoGPT's `encode_ordinary`).
    /// Bytes that are not UTF-8: their byte tokens (GPT-2, bytes); for a `tokenizer.json`, each
    /// invalid run is replaced by U+FFFD, and counted in the second value.
    pub fn encode(&self, text: &[u8]) -> Result<(Vec<u32>, usize), String> {
        match self {
            Tokenizer::Bytes => Ok((text.iter().map(|&b| u32::from(b)).collect(), 0)),
            Tokenizer::Gpt2 { bpe, byte_token } => {
                let mut ids = Vec::with_capacity(text.len() / 3);
                for chunk in text.utf8_chunks() {
                    if !chunk.valid().is_empty() {
                        ids.extend(bpe.encode_ordinary(chunk.valid()));
                    }
                    ids.extend(chunk.invalid().iter().map(|&b| byte_token[usize::from(b)]));
                }
                Ok((ids, 0))
            }
            Tokenizer::HuggingFace { tokenizer, .. } => {
                let replaced = text
                    .utf8_chunks()
                    .filter(|c| !c.invalid().is_empty())
                    .count();
                let s = String::from_utf8_lossy(text);
                let enc = tokenizer
                    .encode(s.as_ref(), false)
                    .map_err(|e| format!("tokenizing: {e}"))?;
                Ok((enc.get_ids().to_vec(), replaced))
            }
        }
    }

    /// The ids of `text` without the tokenizer's own special tokens (transformers'
    /// `tokenizer(text, add_special_tokens=False)`, what `apply_chat_template` tokenizes a
    /// rendering with), and each id's byte range in `text`.
    pub fn encode_offsets(&self, text: &str) -> Result<(Vec<u32>, Offsets), String> {
        match self {
            Tokenizer::HuggingFace { tokenizer, .. } => {
                let enc = tokenizer
                    .encode(text, false)
                    .map_err(|e| format!("tokenizing: {e}"))?;
                Ok((enc.get_ids().to_vec(), enc.get_offsets().to_vec()))
            }
            _ => {
                // byte-level: each id's bytes follow the one before's
                let (ids, _) = self.encode(text.as_bytes())?;
                let mut offsets = Vec::with_capacity(ids.len());
                let mut at = 0;
                for &id in &ids {
                    let n = match self {
                        Tokenizer::Bytes => 1,
                        _ => self.decode(&[id])?.len(),
                    };
                    offsets.push((at, at + n));
                    at += n;
                }
                Ok((ids, offsets))
            }
        }
    }

    /// Whether `id` is one of the tokenizer's special tokens (a tokenizer.json's added tokens
    /// marked special).
    pub fn is_special(&self, id: u32) -> bool {
        match self {
            Tokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .get_added_tokens_decoder()
                .get(&id)
                .is_some_and(|t| t.special),
            _ => false,
        }
    }

    /// A document's ids as transformers gives them, `tokenizer(text)["input_ids"]`: with the
    /// tokenizer's own special tokens (its post-processor: Llama's BOS; GPT-2 adds none), the
    /// end-of-sequence id not included.
    pub fn encode_document(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Tokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| format!("tokenizing: {e}")),
            _ => self.encode(text.as_bytes()).map(|(ids, _)| ids),
        }
    }

    /// The id a document ends with, and where it was found: a tokenizer.json's
    /// `tokenizer_config.json` (`eos_token`) or `special_tokens_map.json` beside it, as
    /// transformers reads them; else its end-of-text token; GPT-2's `<|endoftext|>`. `None`
    /// for bytes, which have no such token.
    pub fn eos(&self) -> Option<(u32, String)> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Gpt2 { .. } => Some((GPT2_EOT, "GPT-2's <|endoftext|>".into())),
            Tokenizer::HuggingFace { tokenizer, path } => {
                let dir = path.parent().unwrap_or(Path::new("."));
                for file in ["tokenizer_config.json", "special_tokens_map.json"] {
                    let p = dir.join(file);
                    let Some(token) = std::fs::read(&p)
                        .ok()
                        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                        .and_then(|v| eos_token_of(&v))
                    else {
                        continue;
                    };
                    if let Some(id) = tokenizer.token_to_id(&token) {
                        return Some((id, format!("`eos_token` {token:?} of {}", p.display())));
                    }
                }
                self.eot()
                    .map(|id| (id, format!("the end-of-text token of {}", path.display())))
            }
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, String> {
        match self {
            Tokenizer::Bytes => ids
                .iter()
                .map(|&t| u8::try_from(t).map_err(|_| format!("token {t} is not a byte")))
                .collect(),
            Tokenizer::Gpt2 { bpe, .. } => bpe
                .decode_bytes(ids)
                .map_err(|e| format!("GPT-2 cannot decode: {e:?}")),
            Tokenizer::HuggingFace { tokenizer, .. } => tokenizer
                .decode(ids, false)
                .map(String::into_bytes)
                .map_err(|e| format!("decoding: {e}")),
        }
    }
}

/// Decodes a growing sequence a token at a time into the bytes each token adds, as
/// `transformers`' text streamers do (issue 45, defect 15). Byte-level tokenizers (bytes,
/// GPT-2) give each token's own bytes, exact. A tokenizer.json decodes the tail of the
/// sequence with a few tokens before it, and emits what the new token added: a token alone
/// would lose the space a Metaspace (`▁`) decoder puts between words, and half a character of
/// a byte-level BPE would print as U+FFFD; an incomplete character is held back until the
/// token that completes it (or `finish`).
pub struct StreamDecoder<'a> {
    t: &'a Tokenizer,
    ids: Vec<u32>,
    /// `ids[prefix..read]` was decoded and emitted; `ids[read..]` is held back.
    prefix: usize,
    read: usize,
}

impl<'a> StreamDecoder<'a> {
    /// After the context `ids` (the prompt), which the caller has shown.
    pub fn new(t: &'a Tokenizer, context: &[u32]) -> Self {
        // a few tokens of context decide the first token's leading space
        let keep = &context[context.len().saturating_sub(4)..];
        StreamDecoder {
            t,
            ids: keep.to_vec(),
            prefix: 0,
            read: keep.len(),
        }
    }

    /// The bytes token `id` adds to the text (none while a character is incomplete).
    pub fn push(&mut self, id: u32) -> Result<Vec<u8>, String> {
        if !matches!(self.t, Tokenizer::HuggingFace { .. }) {
            return self.t.decode(&[id]);
        }
        self.ids.push(id);
        let shown = self.t.decode(&self.ids[self.prefix..self.read])?;
        let now = self.t.decode(&self.ids[self.prefix..])?;
        let complete = !String::from_utf8_lossy(&now).ends_with('\u{FFFD}');
        // (held back for 16 tokens: a decoder whose text does not grow by a prefix, or a real
        // U+FFFD, is emitted as it decodes rather than re-decoded for ever)
        let forced = self.ids.len() - self.read >= 16;
        let added = match now.strip_prefix(&shown[..]) {
            Some(a) if complete || forced => a.to_vec(),
            // (what differs from the text shown, from where they part)
            None if forced => now[common_len(&shown, &now)..].to_vec(),
            _ => return Ok(Vec::new()),
        };
        if added.is_empty() && !forced {
            return Ok(Vec::new());
        }
        // the next token is decoded after the ones just shown
        self.prefix = self.read;
        self.read = self.ids.len();
        // (only the tokens since `prefix` are decoded again: bounded work per token)
        self.ids.drain(..self.prefix);
        self.read -= self.prefix;
        self.prefix = 0;
        Ok(added)
    }

    /// What is still held back (an incomplete character at the end), as the tokenizer decodes
    /// it.
    pub fn finish(&mut self) -> Result<Vec<u8>, String> {
        if self.read >= self.ids.len() {
            return Ok(Vec::new());
        }
        let shown = self.t.decode(&self.ids[self.prefix..self.read])?;
        let now = self.t.decode(&self.ids[self.prefix..])?;
        self.read = self.ids.len();
        Ok(match now.strip_prefix(&shown[..]) {
            Some(rest) => rest.to_vec(),
            // (not a continuation of what was shown: from where they part)
            None => now[common_len(&shown, &now)..].to_vec(),
        })
    }
}

/// The length of the longest common prefix of `a` and `b`.
fn common_len(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_ids_are_gpt2s_and_any_bytes_round_trip() {
        let t = Tokenizer::load("gpt2", Path::new(".")).unwrap();
        assert_eq!(t.vocab_size(), 50257);
        // GPT-2's own ids (tiktoken / transformers' GPT2TokenizerFast)
        for (text, ids) in [("Hello world", &[15496u32, 995][..]), (" the", &[262])] {
            assert_eq!(t.encode(text.as_bytes()).unwrap().0, ids, "{text:?}");
        }
        for bytes in [
            "naïve café, 日本語 🦀\n\ttabs".as_bytes().to_vec(),
            vec![0xff, b'a', 0xc3, b' ', 0x80, 0xfe, 0x00, b'z'],
            (0..=255u8).collect(),
        ] {
            let (ids, _) = t.encode(&bytes).unwrap();
            assert!(ids.iter().all(|&i| i < 50257));
            assert_eq!(t.decode(&ids).unwrap(), bytes);
        }
        let b = Tokenizer::load("bytes", Path::new(".")).unwrap();
        assert_eq!(b.encode(&[0xff, 7]).unwrap().0, [255, 7]);
        assert!(b.decode(&[300]).is_err());
        assert!(Tokenizer::load("gtp2", Path::new("."))
            .unwrap_err()
            .contains("neither \"bytes\", \"gpt2\" nor a tokenizer.json"));
    }

    /// Issue 45, defect 15: a Metaspace tokenizer's spaces and a byte-level BPE's multi-byte
    /// characters survive decoding a token at a time.
    #[test]
    fn streamed_decoding_keeps_spaces_and_whole_characters() {
        let d = crate::testdir::tempdir().unwrap();
        let meta = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true},"post_processor":null,"decoder":{"type":"Metaspace","replacement":"\u2581","prepend_scheme":"always","split":true},"model":{"type":"WordLevel","vocab":{"\u2581hello":0,"\u2581world":1,"\u2581again":2,"[UNK]":3},"unk_token":"[UNK]"}}"#;
        let bytes = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":null,"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false},"model":{"type":"WordLevel","vocab":{"a":0,"\u00c3":1,"\u00a9":2,"[UNK]":3},"unk_token":"[UNK]"}}"#;
        std::fs::write(d.path().join("meta.json"), meta).unwrap();
        std::fs::write(d.path().join("bytes.json"), bytes).unwrap();
        let stream = |file: &str, context: &[u32], ids: &[u32]| {
            let t = Tokenizer::load(file, d.path()).unwrap();
            let mut s = StreamDecoder::new(&t, context);
            let mut pieces = Vec::new();
            for &id in ids {
                pieces.push(String::from_utf8(s.push(id).unwrap()).unwrap());
            }
            pieces.push(String::from_utf8(s.finish().unwrap()).unwrap());
            pieces
        };
        // (a token alone: "world", the space lost)
        assert_eq!(stream("meta.json", &[0], &[1, 2]), [" world", " again", ""]);
        // "é" is two byte-level tokens: nothing until the second, never U+FFFD
        assert_eq!(stream("bytes.json", &[0], &[1, 2, 0]), ["", "é", "a", ""]);
        // held back at the end: what the tokenizer makes of it
        assert_eq!(stream("bytes.json", &[0], &[1]), ["", "\u{FFFD}"]);
    }

    #[test]
    fn a_document_gets_the_post_processors_bos_and_the_configs_eos() {
        // a Llama-style tokenizer.json: a template that puts <s> first, as transformers saves
        // LlamaTokenizerFast's; its tokenizer_config.json names </s> the eos_token
        let dir = crate::testdir::tempdir().unwrap();
        let json = r#"{"version":"1.0","truncation":null,"padding":null,
            "added_tokens":[{"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
                            {"id":2,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},
            "post_processor":{"type":"TemplateProcessing",
                "single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],
                "pair":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],
                "special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},
            "decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"<s>":1,"</s>":2,"a":3,"b":4},"unk_token":"[UNK]"}}"#;
        std::fs::write(dir.path().join("tokenizer.json"), json).unwrap();
        let t = Tokenizer::load(&dir.path().display().to_string(), Path::new(".")).unwrap();
        assert_eq!(t.encode_document("a b a").unwrap(), [1, 3, 4, 3]);
        // (the plain encoding stays nanoGPT's: no special tokens)
        assert_eq!(t.encode(b"a b a").unwrap().0, [3, 4, 3]);
        // no config: none of the usual end-of-text names is in this vocabulary but </s>
        assert_eq!(t.eos().map(|(id, _)| id), Some(2));
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": {"content": "b", "special": true}}"#,
        )
        .unwrap();
        let (id, from) = t.eos().unwrap();
        assert_eq!(id, 4);
        assert!(from.contains("tokenizer_config.json"), "{from}");
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"eos_token": "a"}"#,
        )
        .unwrap();
        assert_eq!(t.eos().map(|(id, _)| id), Some(3));
        // GPT-2 adds nothing and ends with <|endoftext|>; bytes have no end-of-sequence token
        let g = Tokenizer::load("gpt2", Path::new(".")).unwrap();
        assert_eq!(
            g.encode_document("Hello").unwrap(),
            g.encode(b"Hello").unwrap().0
        );
        assert_eq!(g.eos().map(|(id, _)| id), Some(GPT2_EOT));
        assert!(Tokenizer::Bytes.eos().is_none());
    }
}
