//! MLflow through its REST API (`[log.mlflow]`): the run becomes an MLflow run of an experiment
//! (made when missing), with every config value as a param, every number of `metrics.jsonl` at
//! its step, the facts of `env.json` as tags, and its status at the end (FINISHED, FAILED, or
//! KILLED for a stopped run, RUNNING again when resumed). A background thread sends; the
//! training never waits for it. When the server is down the run goes on, says so once, and
//! `kiln track push RUN` sends what is missing later: `mlflow.json` in the run directory keeps
//! the MLflow run id and how many lines of `metrics.jsonl` were sent.
//!
//! Plain HTTP/1.0 (no chunked replies, the connection closes after each reply), JSON bodies.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::MetricSink;
use crate::train::MetricLine;

/// MLflow's limits per `runs/log-batch` request.
const MAX_METRICS: usize = 1000;
const MAX_PARAMS: usize = 100;
const MAX_TAGS: usize = 100;
/// The most one request may take, connection to the last byte of the reply: 15 s, or
/// `MLFLOW_HTTP_REQUEST_TIMEOUT` seconds as MLflow's own clients take it.
fn request_timeout() -> Duration {
    static SECS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    Duration::from_secs(*SECS.get_or_init(|| {
        std::env::var("MLFLOW_HTTP_REQUEST_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| (1..=3600).contains(s))
            .unwrap_or(15)
    }))
}
/// The largest reply taken: more is a failed request (issue 58, defect 7: a server that
/// answered with an endless body had training allocate until it aborted).
const MAX_REPLY: usize = 4 << 20;
/// Longest param value MLflow keeps (its `MAX_PARAM_VAL_LENGTH` before 2.x grew it).
const MAX_PARAM: usize = 500;

/// A tracking server's address, from `http://[user[:password]@]host[:port][/prefix]`, and how
/// requests authenticate: the address's user info as HTTP basic auth, else
/// `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD` (basic), else
/// `MLFLOW_TRACKING_TOKEN` (bearer), as MLflow's own clients do (issue 58, defect 9).
#[derive(Clone, PartialEq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub prefix: String,
    /// The `Authorization` header's value; never printed (`Debug` shows whether there is one).
    auth: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("prefix", &self.prefix)
            .field("auth", &self.auth.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Endpoint {
    pub fn parse(uri: &str) -> Result<Endpoint, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self::parse_with(uri, &var)
    }

    /// `parse`, with the process environment `var`.
    pub fn parse_with(uri: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<Endpoint, String> {
        // (what `[log.mlflow]`'s check accepts)
        let a = crate::config::parse_http_address(uri)?;
        let basic = |user: &str, password: &str| {
            format!("Basic {}", base64(format!("{user}:{password}").as_bytes()))
        };
        let auth = match (&a.user, &a.password) {
            (Some(u), Some(p)) => Some(basic(u, p)),
            // (the address as files keep it: the password from the environment, else a token)
            (Some(u), None) => match (
                var("MLFLOW_TRACKING_PASSWORD"),
                var("MLFLOW_TRACKING_TOKEN"),
            ) {
                (Some(p), _) => Some(basic(u, &p)),
                (None, Some(t)) => Some(format!("Bearer {t}")),
                (None, None) => Some(basic(u, "")),
            },
            (None, _) => match (
                var("MLFLOW_TRACKING_USERNAME"),
                var("MLFLOW_TRACKING_PASSWORD"),
            ) {
                (Some(u), Some(p)) => Some(basic(&u, &p)),
                _ => var("MLFLOW_TRACKING_TOKEN").map(|t| format!("Bearer {t}")),
            },
        };
        Ok(Endpoint {
            host: a.host,
            port: a.port,
            prefix: a.prefix,
            auth,
        })
    }

    /// The address as kiln shows it: no user info, an IPv6 host in brackets.
    pub fn uri(&self) -> String {
        crate::config::HttpAddress {
            host: self.host.clone(),
            port: self.port,
            prefix: self.prefix.clone(),
            user: None,
            password: None,
        }
        .shown()
    }

    /// A request that timed out (issue 58, defect 8: it said "Resource temporarily
    /// unavailable (os error 11)").
    fn no_answer(&self) -> String {
        format!(
            "{} did not answer within {} s (timed out)",
            self.uri(),
            request_timeout().as_secs()
        )
    }

    /// One request; the reply's JSON (`{}` for an empty body), or why not.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        // every address the name has (`localhost` is often ::1 first, MLflow binds 127.0.0.1)
        let addrs: Vec<_> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.host))?
            .collect();
        let mut last = format!("cannot resolve {}", self.host);
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(5)) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = format!("cannot connect to {}: {e}", self.uri()),
            }
        }
        let mut s = stream.ok_or(last)?;
        let deadline = std::time::Instant::now() + request_timeout();
        let _ = s.set_read_timeout(Some(request_timeout()));
        let _ = s.set_write_timeout(Some(request_timeout()));
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let auth = self
            .auth
            .as_ref()
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        let shown = self.uri();
        let host = shown
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or_default();
        let head = format!(
            "{method} {}{path} HTTP/1.0\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.prefix,
            body.len()
        );
        s.write_all(head.as_bytes())
            .and_then(|()| s.write_all(body.as_bytes()))
            .map_err(|e| match timed_out(&e) {
                true => self.no_answer(),
                false => format!("sending to {}: {e}", self.uri()),
            })?;
        // the whole reply within the request's deadline (a server that trickles bytes too)
        let mut reply = Vec::new();
        let mut buf = [0u8; 16384];
        loop {
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "{} did not answer within {} s",
                    self.uri(),
                    request_timeout().as_secs()
                ));
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&buf[..n]),
                Err(e) if timed_out(&e) => return Err(self.no_answer()),
                Err(e) => return Err(format!("reading from {}: {e}", self.uri())),
            }
            if reply.len() > MAX_REPLY {
                return Err(format!(
                    "{} sent a reply of over {} MiB to {method} {path}; not an MLflow server's answer",
                    self.uri(),
                    MAX_REPLY >> 20
                ));
            }
        }
        let text = String::from_utf8_lossy(&reply);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("{} did not answer in HTTP", self.uri()))?;
        if status != 200 {
            return Err(format!(
                "{method} {path}: HTTP {status}: {}",
                body.chars().take(300).collect::<String>()
            ));
        }
        if body.trim().is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_str(body)
            .map_err(|e| format!("{method} {path}: the reply is not JSON ({e})"))
    }

    /// The id of experiment `name`, made when missing.
    pub fn experiment_id(&self, name: &str) -> Result<String, String> {
        let get = || {
            self.call(
                "GET",
                &format!(
                    "/api/2.0/mlflow/experiments/get-by-name?experiment_name={}",
                    encode(name)
                ),
                None,
            )
        };
        let id = |v: &Value| {
            v["experiment"]["experiment_id"]
                .as_str()
                .map(str::to_string)
        };
        match get() {
            Ok(v) => id(&v).ok_or_else(|| "experiments/get-by-name: no experiment_id".into()),
            Err(e) if e.contains("RESOURCE_DOES_NOT_EXIST") => {
                match self.call(
                    "POST",
                    "/api/2.0/mlflow/experiments/create",
                    Some(&json!({ "name": name })),
                ) {
                    Ok(v) => v["experiment_id"]
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| "experiments/create: no experiment_id".into()),
                    // made meanwhile (another trial of the sweep)
                    Err(e) if e.contains("RESOURCE_ALREADY_EXISTS") => {
                        get().and_then(|v| id(&v).ok_or_else(|| e.clone()))
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    pub fn create_run(
        &self,
        experiment_id: &str,
        name: &str,
        tags: &[(String, String)],
    ) -> Result<String, String> {
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        let v = self.call(
            "POST",
            "/api/2.0/mlflow/runs/create",
            Some(&json!({
                "experiment_id": experiment_id,
                "run_name": name,
                "start_time": now_ms(),
                "tags": tags,
            })),
        )?;
        v["run"]["info"]["run_id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| "runs/create: no run_id".into())
    }

    /// Sends metrics, params and tags in as many `runs/log-batch` requests as MLflow's limits
    /// need.
    pub fn log_batch(
        &self,
        run_id: &str,
        metrics: &[Value],
        params: &[(String, String)],
        tags: &[(String, String)],
    ) -> Result<(), String> {
        let kv = |(k, v): &(String, String)| json!({ "key": k, "value": v });
        for chunk in params.chunks(MAX_PARAMS) {
            let params: Vec<Value> = chunk.iter().map(kv).collect();
            self.batch(json!({ "run_id": run_id, "params": params }))?;
        }
        for chunk in tags.chunks(MAX_TAGS) {
            let tags: Vec<Value> = chunk.iter().map(kv).collect();
            self.batch(json!({ "run_id": run_id, "tags": tags }))?;
        }
        for chunk in metrics.chunks(MAX_METRICS) {
            self.batch(json!({ "run_id": run_id, "metrics": chunk }))?;
        }
        Ok(())
    }

    fn batch(&self, body: Value) -> Result<(), String> {
        self.call("POST", "/api/2.0/mlflow/runs/log-batch", Some(&body))
            .map(|_| ())
    }

    /// Sets the run's status (RUNNING, FINISHED, FAILED, KILLED).
    pub fn update_run(&self, run_id: &str, status: &str) -> Result<(), String> {
        let mut body = json!({ "run_id": run_id, "status": status });
        if status != "RUNNING" {
            body["end_time"] = json!(now_ms());
        }
        self.call("POST", "/api/2.0/mlflow/runs/update", Some(&body))
            .map(|_| ())
    }

    /// A run's history of `key` (for checks).
    pub fn history(&self, run_id: &str, key: &str) -> Result<Vec<Value>, String> {
        let v = self.call(
            "GET",
            &format!(
                "/api/2.0/mlflow/metrics/get-history?run_id={}&metric_key={}&max_results=25000",
                encode(run_id),
                encode(key)
            ),
            None,
        )?;
        Ok(v["metrics"].as_array().cloned().unwrap_or_default())
    }

    /// A run as MLflow has it (`runs/get`).
    pub fn get_run(&self, run_id: &str) -> Result<Value, String> {
        self.call(
            "GET",
            &format!("/api/2.0/mlflow/runs/get?run_id={}", encode(run_id)),
            None,
        )
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `mlflow.json`: which MLflow run this run is, and how much of `metrics.jsonl` it has.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct State {
    pub uri: String,
    pub experiment_id: String,
    pub run_id: String,
    /// Lines of `metrics.jsonl` sent.
    pub sent_lines: usize,
    /// Whether the config's params and the tags were sent (the run is made first, and
    /// recorded, so a failure in between never makes a second run).
    #[serde(default)]
    pub params_logged: bool,
    /// The furthest step sent, and how many of its lines: a resume cuts `metrics.jsonl` back
    /// to its checkpoint and trains the steps after it again (to the same bits), and MLflow,
    /// which keeps every point, has those already.
    #[serde(default)]
    pub sent_step: u64,
    #[serde(default)]
    pub sent_at_step: usize,
}

impl State {
    pub fn read(dir: &Path) -> Option<State> {
        serde_json::from_slice(&std::fs::read(dir.join("mlflow.json")).ok()?).ok()
    }

    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        crate::rundir::replace_file(&dir.join("mlflow.json"), &text)
    }
}

/// A metrics line's numbers as MLflow metrics at its step (`ts` its timestamp).
pub fn metrics_of(line: &Value) -> Vec<Value> {
    let step = line["step"].as_u64().unwrap_or(0);
    let ts = line["ts"]
        .as_f64()
        .map_or_else(now_ms, |t| (t * 1000.0) as u64);
    line.as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "step" | "ts"))
        .filter_map(|(k, v)| {
            let v = v.as_f64().filter(|v| v.is_finite())?;
            Some(json!({ "key": k, "value": v, "timestamp": ts, "step": step }))
        })
        .collect()
}

/// Every value of a config (TOML text) as `section.key` = value.
pub fn params_of(config_toml: &str) -> Vec<(String, String)> {
    fn walk(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, out),
                toml::Value::String(s) => out.push((key, s.clone())),
                v => out.push((key, v.to_string())),
            }
        }
    }
    let mut out = Vec::new();
    if let Ok(t) = config_toml.parse::<toml::Table>() {
        walk("", &t, &mut out);
    }
    for (_, v) in &mut out {
        if v.len() > MAX_PARAM {
            let mut end = MAX_PARAM;
            while !v.is_char_boundary(end) {
                end -= 1;
            }
            v.truncate(end);
        }
    }
    out
}

/// The run's tags: the run directory, the sweep it is a trial of, and `env.json`'s facts.
fn tags_of(dir: &Path) -> Vec<(String, String)> {
    let mut tags = vec![("kiln.run_dir".to_string(), dir.display().to_string())];
    if let Some(parent) = dir.parent().filter(|p| p.join("sweep.json").is_file()) {
        let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
        if let (Some(s), Some(t)) = (name(parent), name(dir)) {
            tags.push(("kiln.sweep".into(), s));
            tags.push(("kiln.trial".into(), t));
        }
    }
    let env: Value = std::fs::read(dir.join("env.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    // the newest session's facts (env.json holds one entry per session, or one object)
    let facts = match &env {
        Value::Array(a) => a.last().cloned().unwrap_or(Value::Null),
        Value::Object(o) => o
            .get("sessions")
            .and_then(|s| s.as_array())
            .and_then(|a| a.last().cloned())
            .unwrap_or_else(|| env.clone()),
        _ => Value::Null,
    };
    // scalars two levels deep (`env.backend.device`); lists and deeper objects are left out
    fn scalar(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.chars().take(MAX_PARAM).collect()),
            Value::Number(_) | Value::Bool(_) => Some(v.to_string()),
            _ => None,
        }
    }
    for (k, v) in facts.as_object().into_iter().flatten() {
        match v {
            Value::Object(inner) => tags.extend(
                inner
                    .iter()
                    .filter_map(|(k2, v2)| Some((format!("env.{k}.{k2}"), scalar(v2)?))),
            ),
            v => tags.extend(scalar(v).map(|s| (format!("env.{k}"), s))),
        }
    }
    tags
}

/// MLflow's status for a run's summary status.
pub fn status_of(summary_status: Option<&str>) -> &'static str {
    match summary_status {
        Some("finished") => "FINISHED",
        Some("failed") => "FAILED",
        Some("preempted" | "paused") => "KILLED",
        _ => "RUNNING",
    }
}

/// Opens (or continues) the run's MLflow run and sends what `metrics.jsonl` holds that MLflow
/// has not yet, then sets its status from `summary.json`: what `kiln track push` does, and
/// what the sink does at the end of a session. Returns the state and the lines it sent.
pub fn push(dir: &Path, uri: &str, experiment: &str) -> Result<(State, usize), String> {
    let ep = Endpoint::parse(uri)?;
    let config = std::fs::read_to_string(dir.join("config.toml")).unwrap_or_default();
    let mut state = open_run(dir, &ep, experiment, &config)?;
    let lines = crate::rundir::MetricsFile::read(dir).lines.len();
    state.sent_lines = state.sent_lines.min(lines);
    let sent = send_new(dir, &ep, &mut state, &mut Tail::default())?;
    let status = crate::rundir::SummaryFile::read(dir).map(|s| s.status);
    ep.update_run(&state.run_id, status_of(status.as_deref()))?;
    Ok((state, sent))
}

/// How far a sender has read `metrics.jsonl`: the byte offset, the lines before it, and the
/// step of the last of them with how many lines are at that step.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tail {
    offset: u64,
    lines: usize,
    step: u64,
    at_step: usize,
}

/// Sends the lines of `metrics.jsonl` MLflow lacks (read on from `tail`, which moves on only
/// when they were sent) and records them sent; how many.
fn send_new(
    dir: &Path,
    ep: &Endpoint,
    state: &mut State,
    tail: &mut Tail,
) -> Result<usize, String> {
    let (new, offset) = crate::rundir::MetricsFile::read_from(dir, tail.offset)
        .map_err(|e| format!("reading {}/metrics.jsonl: {e}", dir.display()))?;
    let mut t = *tail;
    t.offset = offset;
    // (a resume cut metrics.jsonl back to its checkpoint, `sent_lines` clamped to it: what
    // follows is new to this file, but MLflow has the steps up to `sent_step` already)
    let mut metrics = Vec::new();
    let mut fresh = 0;
    for l in &new.lines {
        let step = l["step"].as_u64().unwrap_or(0);
        if step == t.step && t.lines > 0 {
            t.at_step += 1;
        } else {
            (t.step, t.at_step) = (step, 1);
        }
        t.lines += 1;
        if t.lines <= state.sent_lines {
            continue;
        }
        fresh += 1;
        let sent =
            step < state.sent_step || (step == state.sent_step && t.at_step <= state.sent_at_step);
        if !sent {
            metrics.extend(metrics_of(l));
        }
    }
    if fresh == 0 && state.sent_lines == t.lines {
        *tail = t;
        return Ok(0);
    }
    if !metrics.is_empty() {
        ep.log_batch(&state.run_id, &metrics, &[], &[])?;
    }
    state.sent_lines = t.lines;
    if (t.step, t.at_step) > (state.sent_step, state.sent_at_step) {
        (state.sent_step, state.sent_at_step) = (t.step, t.at_step);
    }
    state
        .write(dir)
        .map_err(|e| format!("writing {}/mlflow.json: {e}", dir.display()))?;
    *tail = t;
    Ok(fresh)
}

/// The run's MLflow run: the one `mlflow.json` names at this address, else a new one with the
/// config as params and the tags.
fn open_run(dir: &Path, ep: &Endpoint, experiment: &str, config: &str) -> Result<State, String> {
    let write = |s: &State| {
        s.write(dir)
            .map_err(|e| format!("writing {}/mlflow.json: {e}", dir.display()))
    };
    let mut state = match State::read(dir).filter(|s| s.uri == ep.uri()) {
        Some(s) => s,
        None => {
            let experiment_id = ep.experiment_id(experiment)?;
            let name = dir
                .file_name()
                .map_or("run".into(), |n| n.to_string_lossy().into_owned());
            let run_id = ep.create_run(&experiment_id, &name, &[])?;
            let s = State {
                uri: ep.uri(),
                experiment_id,
                run_id,
                sent_lines: 0,
                params_logged: false,
                sent_step: 0,
                sent_at_step: 0,
            };
            write(&s)?;
            s
        }
    };
    if !state.params_logged {
        ep.log_batch(&state.run_id, &[], &params_of(config), &tags_of(dir))?;
        state.params_logged = true;
        write(&state)?;
    }
    Ok(state)
}

/// The session's MLflow sink: `line` only wakes the sender thread, which sends what
/// `metrics.jsonl` has (it is written first, so it holds every line), with bounded retries.
pub struct MlflowSink {
    uri: String,
    /// Set once the session has said the server is unreachable (by the sender, or by `drop`
    /// when the sender is still waiting on it): said once.
    said: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The run directory, for the message that names `kiln track push`.
    dir: PathBuf,
    /// Says the sender is done (its last send and the status).
    finished: Option<mpsc::Receiver<()>>,
    /// Wakes the sender (a line was written); dropped at the end of the session.
    tx: Option<mpsc::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// The sink for run directory `dir`, its run opened (or continued: RUNNING again) on the
/// sender thread.
pub fn open(dir: &Path, uri: &str, experiment: &str, config_toml: String) -> MlflowSink {
    let (tx, rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let said = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let run_dir = dir.to_path_buf();
    let (dir, uri_s, experiment) = (dir.to_path_buf(), uri.to_string(), experiment.to_string());
    let flag = said.clone();
    let handle = std::thread::Builder::new()
        .name("kiln-mlflow".into())
        .spawn(move || {
            sender(dir, uri_s, experiment, config_toml, rx, &flag);
            let _ = done_tx.send(());
        })
        .ok();
    MlflowSink {
        uri: crate::config::redact(uri),
        said,
        dir: run_dir,
        finished: Some(done_rx),
        tx: Some(tx),
        handle,
    }
}

/// Sends each line as it comes (batched when several wait), then the rest and the status at
/// the end. After a failure it says so once and only tries again at the end.
fn sender(
    dir: PathBuf,
    uri: String,
    experiment: String,
    config: String,
    rx: mpsc::Receiver<()>,
    said: &std::sync::atomic::AtomicBool,
) {
    let down = std::cell::Cell::new(false);
    let shown = crate::config::redact(&uri);
    let say = |why: &str| {
        if !said.swap(true, std::sync::atomic::Ordering::SeqCst) {
            crate::ui::note(&format!(
                "warning: MLflow at {shown} is unreachable ({why}); the run goes on, and `kiln track push {}` sends what is missing",
                dir.display()
            ));
        }
        down.set(true);
    };
    let ep = match Endpoint::parse(&uri) {
        Ok(e) => e,
        Err(e) => return say(&e),
    };
    // a resumed run's metrics.jsonl was cut back to its checkpoint: `sent_lines` counts only
    // what is left of it (the steps trained again are new to the file, not to MLflow)
    let lines = crate::rundir::MetricsFile::read(&dir).lines.len();
    let open = || {
        open_run(&dir, &ep, &experiment, &config).map(|mut s| {
            s.sent_lines = s.sent_lines.min(lines);
            s
        })
    };
    let mut state = match with_retries(open) {
        Ok(s) => {
            let _ = ep.update_run(&s.run_id, "RUNNING");
            Some(s)
        }
        Err(e) => {
            say(&e);
            None
        }
    };
    let tail = std::cell::Cell::new(Tail::default());
    let send = |state: &mut State| {
        let mut t = tail.get();
        let r = send_new(&dir, &ep, state, &mut t).map(|_| ());
        tail.set(t);
        r
    };
    while rx.recv().is_ok() {
        // the lines that came meanwhile go in the same batch
        while rx.try_recv().is_ok() {}
        if down.get() {
            continue;
        }
        if let Some(s) = state.as_mut() {
            if let Err(e) = with_retries(|| send(s)) {
                say(&e);
            }
        }
    }
    // the end of the session: the rest, then the status (the server may be back)
    if state.is_none() {
        state = open().ok();
    }
    let Some(mut s) = state else { return };
    let status = crate::rundir::SummaryFile::read(&dir).map(|s| s.status);
    let end = send(&mut s).and_then(|()| ep.update_run(&s.run_id, status_of(status.as_deref())));
    if let Err(e) = end {
        say(&e);
    }
}

/// Standard base64 (RFC 4648, with padding), for basic auth.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A socket read or write that ran past its timeout (`EAGAIN` on Linux).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// `f` up to three times, 0.2 s and 1 s apart.
fn with_retries<T>(mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut last = String::new();
    for pause in [0, 200, 1000] {
        std::thread::sleep(Duration::from_millis(pause));
        match f() {
            Ok(v) => return Ok(v),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl MetricSink for MlflowSink {
    fn path(&self) -> String {
        self.uri.clone()
    }
    fn what(&self) -> &'static str {
        "MLflow metrics"
    }
    fn line(&mut self, _: &MetricLine) -> std::io::Result<()> {
        if let Some(tx) = &self.tx {
            let _ = tx.send(());
        }
        Ok(())
    }
}

impl Drop for MlflowSink {
    /// The end of the session (after `summary.json`): the sender sends the rest and the status.
    fn drop(&mut self) {
        drop(self.tx.take());
        // a server that hangs holds the run's exit up to two requests' deadlines at most (the
        // rest and the status); after that the sender is left, and `kiln track push` finishes
        let waited = self
            .finished
            .take()
            .map(|rx| rx.recv_timeout(request_timeout() * 2));
        match (waited, self.handle.take()) {
            (Some(Ok(())), Some(h)) => {
                let _ = h.join();
            }
            // still waiting on the server: the run's files are complete, say so once (issue
            // 58, defect 8: the run waited 30 s and exited without a word)
            (Some(Err(_)), _) if !self.said.swap(true, std::sync::atomic::Ordering::SeqCst) => {
                crate::ui::note(&format!(
                    "warning: MLflow at {} did not answer within {} s; the run's own files are complete, and `kiln track push {}` sends what is missing",
                    self.uri,
                    (request_timeout() * 2).as_secs(),
                    self.dir.display()
                ));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_lines_and_configs_become_what_mlflow_takes() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:5000/").unwrap(),
            Endpoint {
                host: "127.0.0.1".into(),
                port: 5000,
                prefix: String::new(),
                auth: None,
            }
        );
        // user info is basic auth, never shown; the variables MLflow's clients read too
        let none = |_: &str| None;
        let e = Endpoint::parse_with("http://alice:hunter2@h:1", &none).unwrap();
        assert_eq!(e.auth.as_deref(), Some("Basic YWxpY2U6aHVudGVyMg=="));
        assert_eq!(e.uri(), "http://h:1");
        assert!(!format!("{e:?}").contains("hunter2") && !format!("{e:?}").contains("YWxp"));
        let vars = |k: &str| match k {
            "MLFLOW_TRACKING_USERNAME" => Some("alice".to_string()),
            "MLFLOW_TRACKING_PASSWORD" => Some("hunter2".to_string()),
            _ => None,
        };
        let e = Endpoint::parse_with("http://h:1", &vars).unwrap();
        assert_eq!(e.auth.as_deref(), Some("Basic YWxpY2U6aHVudGVyMg=="));
        let token = |k: &str| (k == "MLFLOW_TRACKING_TOKEN").then(|| "t0k".to_string());
        let e = Endpoint::parse_with("HTTP://[::1]:5000", &token).unwrap();
        assert_eq!(e.auth.as_deref(), Some("Bearer t0k"));
        assert_eq!(
            (e.host.as_str(), e.uri().as_str()),
            ("::1", "http://[::1]:5000")
        );
        assert_eq!(
            Endpoint::parse("http://mlflow/base").unwrap().prefix,
            "/base"
        );
        assert_eq!(Endpoint::parse("http://mlflow").unwrap().port, 80);
        assert!(Endpoint::parse("https://x")
            .unwrap_err()
            .contains("not an http://"));
        assert!(Endpoint::parse("http://x:port")
            .unwrap_err()
            .contains("not a port"));
        let m = metrics_of(
            &json!({"step": 3, "ts": 1.5, "loss": 2.0, "lr": 0.1, "time": {"forward": 0.5}, "eval_loss": null}),
        );
        let keys: Vec<&str> = m.iter().map(|v| v["key"].as_str().unwrap()).collect();
        assert_eq!(keys, ["loss", "lr"]);
        assert_eq!(m[0]["step"], 3);
        assert_eq!(m[0]["timestamp"], 1500);
        let p = params_of("[optim]\nlr = 0.01\nkind = \"adamw\"\n[model]\nhidden_sizes = [8, 4]\n");
        assert!(p.contains(&("optim.lr".into(), "0.01".into())), "{p:?}");
        assert!(p.contains(&("optim.kind".into(), "adamw".into())), "{p:?}");
        assert!(
            p.contains(&("model.hidden_sizes".into(), "[8, 4]".into())),
            "{p:?}"
        );
        assert_eq!(encode("a b/ü"), "a%20b%2F%C3%BC");
        assert_eq!(status_of(Some("preempted")), "KILLED");
    }
}
