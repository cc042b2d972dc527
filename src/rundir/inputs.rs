//! `inputs.json`: the files a run reads besides its experiment file, fingerprinted when the
//! run is made (issue 45, defect 14), so that a tokenizer or token file replaced since is found
//! before it does harm: `kiln sample` and `kiln eval` would decode with another tokenizer, and
//! `kiln resume` would go on training on re-tokenized data, each with exit 0. The tokenizer is
//! hashed whole; a data file (possibly many GB) by its length and the sha256 of its first and
//! last MiB.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::config::Resolved;
use crate::error::{Error, Result};

const FILE: &str = "inputs.json";

/// The files beside a tokenizer.json that say how text becomes ids (its special tokens, its
/// chat template): fingerprinted with it, where they are.
pub const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

/// A data file's ends that are hashed.
const END: u64 = 1 << 20;

/// The config keys of the files a run reads, with their paths as this config resolves them.
fn files(r: &Resolved) -> Vec<(String, std::path::PathBuf)> {
    let d = &r.config.data;
    let mut out = Vec::new();
    if !matches!(d.tokenizer.as_str(), "bytes" | "gpt2") {
        let p = crate::data::tokenizer::json_file(r.path_of("data.tokenizer", &d.tokenizer));
        // the files beside it that say its chat template and special tokens
        if let Some(dir) = p.parent() {
            for f in TOKENIZER_FILES {
                out.push((format!("data.tokenizer ({f})"), dir.join(f)));
            }
        }
        out.push(("data.tokenizer".to_string(), p));
    }
    for (key, v) in [
        ("data.path", &d.path),
        ("data.eval_path", &d.eval_path),
        ("data.labels_path", &d.labels_path),
        ("data.eval_labels_path", &d.eval_labels_path),
        ("data.chat_template", &d.chat_template),
    ] {
        if let Some(v) = v {
            out.push((key.to_string(), r.path_of(key, v)));
        }
    }
    // a mixture's sources that are files (a directory or a glob of shards is not fingerprinted:
    // the checkpoint's `documents.files` names its shards and their sizes)
    for (i, m) in d.mix.iter().enumerate() {
        out.push((format!("data.mix[{i}]"), r.path_of("data.mix", &m.path)));
    }
    // (canonical: the stored config's absolute paths and the experiment's relative ones
    // name a file alike)
    out.into_iter()
        .map(|(k, p)| (k, p.canonicalize().unwrap_or(p)))
        .collect()
}

/// The fingerprint of `path` (`whole`: every byte hashed), or `None` when it cannot be read.
fn fingerprint(path: &Path, whole: bool) -> Option<Value> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let mut h = Sha256::new();
    if whole || len <= 2 * END {
        std::io::copy(&mut f, &mut h).ok()?;
    } else {
        let mut buf = vec![0u8; END as usize];
        f.read_exact(&mut buf).ok()?;
        h.update(&buf);
        f.seek(SeekFrom::Start(len - END)).ok()?;
        f.read_exact(&mut buf).ok()?;
        h.update(&buf);
    }
    let sha: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Some(json!({"path": path.display().to_string(), "bytes": len, "sha256": sha}))
}

/// The fingerprints of every file `r` reads.
fn current(r: &Resolved) -> Map<String, Value> {
    files(r)
        .into_iter()
        .filter_map(|(k, p)| {
            let f = fingerprint(&p, k.starts_with("data.tokenizer"))?;
            Some((k, f))
        })
        .collect()
}

/// Writes `inputs.json` into a new run's directory.
pub fn record(run_dir: &Path, r: &Resolved) -> Result<()> {
    let text = serde_json::to_string_pretty(&Value::Object(current(r))).unwrap_or_default();
    super::replace_file(&run_dir.join(FILE), format!("{text}\n").as_bytes())
        .map_err(|e| Error::io(format!("writing {}/{FILE}", run_dir.display()), e))
}

/// The recorded files among `keys` (all: `None`) that differ now, each said in a line naming
/// the key, the file and how; nothing for a run made before `inputs.json` existed.
pub fn changed(run_dir: &Path, r: &Resolved, keys: Option<&[&str]>) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(run_dir.join(FILE)) else {
        return Vec::new();
    };
    let Ok(Value::Object(then)) = serde_json::from_str::<Value>(&text) else {
        return vec![format!(
            "`{}/{FILE}` does not parse: was it edited by hand?",
            run_dir.display()
        )];
    };
    let paths = files(r);
    let mut out = Vec::new();
    for (key, was) in then
        .iter()
        .filter(|(k, _)| keys.is_none_or(|ks| ks.contains(&k.as_str())))
    {
        let path = was["path"].as_str().unwrap_or("?");
        let now_path = paths.iter().find(|(k, _)| k == key).map(|(_, p)| p);
        // a file given anew (another path, from any source: `kiln eval --set`, the
        // environment) is the user's choice, not the run's file changed: not read at all
        if now_path.is_some_and(|p| p.display().to_string() != path) {
            continue;
        }
        match now_path.and_then(|p| fingerprint(p, key.starts_with("data.tokenizer"))) {
            None => out.push(format!("  `{key}` = {path}: gone or unreadable now")),
            Some(is) if is["sha256"] != was["sha256"] || is["bytes"] != was["bytes"] => {
                out.push(format!(
                    "  `{key}` = {}: changed since the run was made ({} bytes, sha256 {:.12} then; {} bytes, sha256 {:.12} now)",
                    is["path"].as_str().unwrap_or(path),
                    was["bytes"],
                    was["sha256"].as_str().unwrap_or("?"),
                    is["bytes"],
                    is["sha256"].as_str().unwrap_or("?")
                ))
            }
            Some(_) => {}
        }
    }
    out
}

/// The keys of the tokenizer and the files beside it (what `kiln sample` and `kiln eval`
/// read of a run's inputs).
pub const TOKENIZER_KEYS: [&str; 5] = [
    "data.tokenizer",
    "data.chat_template",
    "data.tokenizer (tokenizer_config.json)",
    "data.tokenizer (special_tokens_map.json)",
    "data.tokenizer (chat_template.jinja)",
];

/// `changed` as an error for `what` (a command), exit 2.
pub fn refuse_changed(
    run_dir: &Path,
    r: &Resolved,
    keys: Option<&[&str]>,
    what: &str,
) -> Result<()> {
    let lines = changed(run_dir, r, keys);
    if lines.is_empty() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{what} `{}`: the files it was made from are not what they were:\n{}\n  = help: restore them (the run would read other tokens, or decode with another tokenizer), or start a new run",
        run_dir.display(),
        lines.join("\n")
    )))
}
