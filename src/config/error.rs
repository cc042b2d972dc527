//! Config errors: each names the dotted key, the source that set it (file and line, env var,
//! `--set` flag or built-in default), what is allowed, and for unknown keys the closest valid one.

use std::fmt;
use std::path::PathBuf;

/// Everything that can be wrong with a config before anything runs. Always "bad input" (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file `{path}`: {source}\n  = help: check the path; paths in `extends` are relative to the file that names them")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{path}` is not valid TOML: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("`extends` cycle: {}\n  = help: remove one of these `extends` entries", .chain.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" -> "))]
    ExtendsCycle { chain: Vec<PathBuf> },
    #[error("`extends` in `{path}` must be a list of file paths, e.g. extends = [\"../templates/base.toml\"]")]
    ExtendsType { path: PathBuf },
    #[error("bad --set `{arg}`: {why}\n  = help: write --set section.key=value, e.g. --set optim.lr=0.1")]
    BadSet { arg: String, why: String },
    #[error("{0}")]
    Key(KeyError),
    /// Several keys are wrong: all of them, as rustc reports several errors.
    #[error("{}", many(.0))]
    Many(Vec<ConfigError>),
}

fn many(errors: &[ConfigError]) -> String {
    let mut out = String::new();
    for (i, e) in errors.iter().enumerate() {
        if i > 0 {
            out.push_str("\n\nerror: ");
        }
        out.push_str(&e.to_string());
    }
    out.push_str(&format!(
        "\n\nerror: {} problems in the config; fix them all and run again",
        errors.len()
    ));
    out
}

impl ConfigError {
    /// The dotted key the error is about, when it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Key(k) if !k.key.is_empty() => Some(&k.key),
            _ => None,
        }
    }
}

/// An error about one dotted key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyError {
    /// The dotted key, e.g. `optim.lr` (empty when the error is about no one key).
    pub key: String,
    /// What kind of problem it is: whether the other keys can still be judged.
    pub kind: KeyErrorKind,
    /// What is wrong, e.g. "unknown key `optim.lrr`".
    pub message: String,
    /// Where the offending value came from, e.g. "experiments/a.toml:7" or "--set optim.lr=-1".
    pub source: String,
    /// What to do instead.
    pub help: Option<String>,
}

/// The kind of a key's error, which the loader matches on (never on the message's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyErrorKind {
    /// A value out of its own range: nothing to do with any other key, so the loader sets the
    /// key aside and goes on judging the rest, to report every such error at once.
    Range,
    /// Anything else: a wrong type, an unknown key or choice (also judged alone, as figment
    /// reports them before the checks), a missing file, keys that disagree (which could only
    /// cascade when a key is set aside).
    #[default]
    Other,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\n  --> {}", self.message, self.source)?;
        if let Some(h) = &self.help {
            write!(f, "\n  = help: {h}")?;
        }
        Ok(())
    }
}

/// Edit distance counting an adjacent transposition as one edit (optimal string alignment), for
/// "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The candidate closest to `word`, if it is close enough to be a plausible typo.
/// `text` cut to its first `max` characters for a message that quotes it (a value, a file's
/// error), saying how much was left out.
pub fn brief(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}... ({} more bytes)", &text[..at], text.len() - at),
        None => text.to_string(),
    }
}

pub fn closest<'a>(word: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 3).max(1) + usize::from(c.len() > 5))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_finds_typos_only() {
        assert_eq!(closest("lrr", &["kind", "lr", "momentum"]), Some("lr"));
        assert_eq!(
            closest("batchsize", &["batch_size", "epochs"]),
            Some("batch_size")
        );
        assert_eq!(closest("zzzzzz", &["kind", "lr"]), None);
        assert_eq!(closest("mpl", &["mlp", "csv"]), Some("mlp"));
    }
}
