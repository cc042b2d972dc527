//! `[log]`: where a run's metrics go besides `metrics.jsonl`.

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use super::*;

/// `[log]`: where a run's metrics go besides `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Also write TensorBoard event files (`tb/events.out.tfevents.<time>.<host>` in the run
    /// directory: every number of `metrics.jsonl` by step; `tensorboard --logdir runs`).
    /// Default: `false`.
    pub tensorboard: bool,
    /// `[log.mlflow]`: the run (or each trial of a sweep, tagged with it) becomes an MLflow run,
    /// sent by a background thread. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlflow: Option<MlflowConfig>,
}

/// `[log.mlflow]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MlflowConfig {
    /// The tracking server, `http://host:port` (MLflow's REST API over plain HTTP).
    /// Default: none (required).
    pub uri: String,
    /// The MLflow experiment, made when missing. Default: `experiment.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
}

impl LogConfig {
    pub fn is_default(&self) -> bool {
        *self == LogConfig::default()
    }

    /// `log.mlflow.uri` an http:// address with a host; an experiment name that is not empty.
    pub(super) fn check(&self, r: &super::load::Resolved) -> Result<(), super::error::ConfigError> {
        let Some(m) = &self.mlflow else {
            return Ok(());
        };
        if let Err(why) = http_address(&m.uri) {
            return Err(r.key_error(
                "log.mlflow.uri",
                format!("`log.mlflow.uri` = {why}"),
                Some("e.g. \"http://127.0.0.1:5000\" (`mlflow server --port 5000`)".into()),
            ));
        }
        if m.experiment.as_deref().is_some_and(|e| e.trim().is_empty()) {
            return Err(r.key_error(
                "log.mlflow.experiment",
                "`log.mlflow.experiment` is empty".into(),
                Some("name the MLflow experiment, or leave it out for `experiment.name`".into()),
            ));
        }
        Ok(())
    }
}

/// The parts of an `http://[user[:password]@]host[:port][/prefix]` address: the scheme is
/// matched in any case (`HTTP://`), an IPv6 host is bracketed (`http://[::1]:5000`), and user
/// info is HTTP basic auth (issue 58, defects 9 and 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpAddress {
    /// As a name resolves it: brackets of an IPv6 literal removed.
    pub host: String,
    pub port: u16,
    /// `/prefix` without a trailing `/`, or empty.
    pub prefix: String,
    pub user: Option<String>,
    pub password: Option<String>,
}

impl HttpAddress {
    /// The address without its user info, for messages and files.
    pub fn shown(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        format!("http://{host}:{}{}", self.port, self.prefix)
    }
}

/// Parses `uri` (see `HttpAddress`); the error never repeats a password.
pub fn parse_http_address(uri: &str) -> Result<HttpAddress, String> {
    let shown = redact(uri);
    let rest = match uri.get(..7) {
        Some(s) if s.eq_ignore_ascii_case("http://") => &uri[7..],
        _ => {
            return Err(format!(
                "{shown:?} is not an http:// address (kiln speaks plain HTTP to MLflow's REST API; put a local proxy in front of an https server)"
            ))
        }
    };
    // user info up to the last `@` (a password may hold a `/`), then host, port and prefix
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    let (hostport, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let Some((h, after)) = v6.split_once(']') else {
            return Err(format!("{shown:?}: an IPv6 host needs its closing `]`"));
        };
        match after {
            "" => (h, None),
            p => match p.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => {
                    return Err(format!(
                        "{shown:?}: {after:?} after the IPv6 host is not `:PORT`"
                    ))
                }
            },
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{shown:?} names no host"));
    }
    let port = match port {
        None => 80,
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("{shown:?}: {:?} is not a port", super::brief(p, 20)))?,
    };
    let (user, password) = match userinfo {
        None => (None, None),
        Some(u) => match u.split_once(':') {
            Some((n, p)) => (Some(percent_decode(n)), Some(percent_decode(p))),
            None => (Some(percent_decode(u)), None),
        },
    };
    Ok(HttpAddress {
        host: host.to_string(),
        port,
        prefix: prefix.to_string(),
        user,
        password,
    })
}

/// Whether `uri` is `http://[user[:password]@]host[:port][/path]` (config sits below track,
/// which talks to it).
pub fn http_address(uri: &str) -> Result<(), String> {
    parse_http_address(uri).map(|_| ())
}

/// `%XX` escapes of URL user info decoded (a password with `@` or `:` in it is written
/// `%40`, `%3A`).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `text` with the password of every `scheme://user:password@` in it replaced by `***`: what
/// kiln writes to a file or a terminal where a URL may stand (issue 58, defect 9: a tracking
/// server's password went to config.toml, env.json and stdout).
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        // the URL: up to whitespace or a quote; its user info up to its last `@` (a password
        // may hold a `/`)
        let end = tail
            .find(|c: char| c.is_whitespace() || "\"'<>".contains(c))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => out.push_str(&format!("{user}:***@{host}")),
                None => out.push_str(&format!("{userinfo}@{host}")),
            },
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `uri` without the password of its user info (`http://alice@host`): what files keep. The
/// password is the session's that was given it; a resume or a sweep's next session takes it
/// from `MLFLOW_TRACKING_PASSWORD`.
pub fn without_password(uri: &str) -> String {
    redact(uri).replace(":***@", "@")
}

impl MlflowConfig {
    /// The config as files keep it (`without_password`).
    pub fn stored(&self) -> MlflowConfig {
        MlflowConfig {
            uri: without_password(&self.uri),
            experiment: self.experiment.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_any_case_with_ipv6_hosts_and_user_info() {
        let a = parse_http_address("HTTP://[::1]:5000/mlflow/").unwrap();
        assert_eq!(
            (a.host.as_str(), a.port, a.prefix.as_str()),
            ("::1", 5000, "/mlflow")
        );
        assert_eq!(a.shown(), "http://[::1]:5000/mlflow");
        let a = parse_http_address("http://alice:s%40cret:x@host:81").unwrap();
        assert_eq!(a.user.as_deref(), Some("alice"));
        assert_eq!(a.password.as_deref(), Some("s@cret:x"));
        assert_eq!(a.shown(), "http://host:81");
        let e = parse_http_address("https://alice:hunter2@host").unwrap_err();
        assert!(!e.contains("hunter2"), "{e}");
        let e = parse_http_address("http://alice:hunter2@host:5x").unwrap_err();
        assert!(!e.contains("hunter2") && e.contains("is not a port"), "{e}");
        assert!(parse_http_address("http://[::1").is_err());
        // a `/` in the password
        let a = parse_http_address("http://alice:pa/ss@mlflow:5000/x").unwrap();
        assert_eq!(
            (a.password.as_deref(), a.host.as_str(), a.prefix.as_str()),
            (Some("pa/ss"), "mlflow", "/x")
        );
        let e = parse_http_address("http://alice:pa/ss@mlflow:50x").unwrap_err();
        assert!(!e.contains("pa/ss") && !e.contains("ss@"), "{e}");
    }

    #[test]
    fn passwords_are_redacted_wherever_a_url_stands() {
        assert_eq!(
            redact("uri = \"http://alice:hunter2@host:5000/x\" and https://bob:pw@h"),
            "uri = \"http://alice:***@host:5000/x\" and https://bob:***@h"
        );
        assert_eq!(
            redact("--set log.mlflow.uri=http://u:p@h"),
            "--set log.mlflow.uri=http://u:***@h"
        );
        assert_eq!(redact("http://host:5000"), "http://host:5000");
        assert_eq!(redact("no url"), "no url");
        assert_eq!(without_password("http://u:p@h:1/x"), "http://u@h:1/x");
        assert_eq!(
            redact("uri = \"http://bob:12/34@host\""),
            "uri = \"http://bob:***@host\""
        );
    }
}
