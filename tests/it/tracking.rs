//! MLflow (`[log.mlflow]`) against a real tracking server (`mlflow server`, from
//! scripts/mlflow-up.sh's venv): a run becomes an MLflow run with its config as params and every
//! metrics line; a server that dies mid-run leaves the run finished, and `kiln track push`
//! completes the history afterwards.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln::track::mlflow::{Endpoint, State};

use crate::common::{kiln, metric_lines, stderr, stdout, summary, write, KILN, TINY};

/// The python of scripts/mlflow-up.sh (which installs MLflow when missing).
fn mlflow_python() -> String {
    let o = Command::new("bash")
        .arg(crate::common::root().join("scripts/mlflow-up.sh"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "scripts/mlflow-up.sh could not make a Python with MLflow: {}",
        stderr(&o)
    );
    stdout(&o).trim().to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A tracking server on `port` over `dir`'s sqlite store, in its own process group; returns
/// once it answers.
fn server(python: &str, dir: &Path, port: u16) -> Child {
    use std::os::unix::process::CommandExt;
    let child = Command::new(python)
        .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--backend-store-uri")
        .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
        .arg("--default-artifact-root")
        .arg(dir.join("artifacts"))
        .args(["--workers", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let ep = Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    let start = Instant::now();
    while ep.experiment_id("Default").is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the MLflow server did not come up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    child
}

fn stop(server: &mut Child) {
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(server.id() as i32), libc::SIGKILL) };
    let _ = server.wait();
}

/// What the MLflow server has of run `run`: its status, its params and its loss points.
fn check_run(ep: &Endpoint, run: &Path) {
    let state = State::read(run).expect("mlflow.json");
    let r = ep.get_run(&state.run_id).unwrap();
    assert_eq!(r["run"]["info"]["status"], "FINISHED", "{r}");
    let params = r["run"]["data"]["params"].as_array().unwrap();
    assert!(
        params
            .iter()
            .any(|p| p["key"] == "optim.lr" && p["value"] == "0.05"),
        "{params:?}"
    );
    let tags = r["run"]["data"]["tags"].as_array().unwrap();
    assert!(
        tags.iter().any(|t| t["key"] == "env.backend.device"),
        "{tags:?}"
    );
    let losses = ep.history(&state.run_id, "loss").unwrap();
    assert_eq!(losses.len(), metric_lines(run).len(), "{r}");
}

#[test]
fn a_run_is_an_mlflow_run_and_track_push_completes_what_a_dead_server_missed() {
    let python = mlflow_python();
    let d = kiln::testdir::tempdir().unwrap();
    let port = free_port();
    let mut srv = server(&python, d.path(), port);
    let uri = format!("log.mlflow.uri=http://127.0.0.1:{port}");
    write(d.path(), "t.toml", TINY);
    let ep = Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap();
    // a run, sent as it trains
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "a",
            "--set",
            &uri,
            "--set",
            "optim.lr=0.05",
            "--set",
            "log.mlflow.experiment=kiln-it",
            "--set",
            "checkpoint.every_steps=4",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    check_run(&ep, &d.path().join("a"));
    // the server dies while a run trains: the run finishes, says so once
    let mut child = Command::new(KILN)
        .current_dir(d.path())
        .args(["run", "t.toml", "--quiet", "--run-dir", "b", "--set", &uri])
        .args([
            "--set",
            "optim.lr=0.05",
            "--set",
            "log.mlflow.experiment=kiln-it",
        ])
        .args([
            "--set",
            "train.max_steps=40000",
            "--set",
            "train.log_every=200",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = d.path().join("b");
    let start = Instant::now();
    while !run.join("mlflow.json").is_file() || metric_lines(&run).len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the run never logged"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop(&mut srv);
    assert!(
        child.try_wait().unwrap().is_none(),
        "the run ended before the server was stopped: make it longer"
    );
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(summary(&run)["status"], "finished");
    let e = stderr(&o);
    assert_eq!(e.matches("is unreachable").count(), 1, "{e}");
    assert!(e.contains("`kiln track push"), "{e}");
    // the server back: push completes the history and the status
    let mut srv = server(&python, d.path(), port);
    let o = kiln(d.path(), &["track", "push", "b"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("metric line(s) of b to MLflow run"),
        "{}",
        stdout(&o)
    );
    check_run(&ep, &run);
    // nothing left: a second push sends nothing
    let o = kiln(d.path(), &["track", "push", "b"]);
    assert!(
        stdout(&o).contains("sent 0 metric line(s)"),
        "{}",
        stdout(&o)
    );
    // a resumed run continues its MLflow run; from an earlier checkpoint, the steps it trains
    // again (to the same bits) are not sent twice
    let a = d.path().join("a");
    let first = State::read(&a).unwrap().run_id;
    let o = kiln(
        d.path(),
        &[
            "resume",
            "a",
            "--quiet",
            "--from",
            "step-00000004",
            "--set",
            "train.max_steps=12",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(State::read(&a).unwrap().run_id, first);
    assert_eq!(metric_lines(&a).len(), 12);
    check_run(&ep, &a);
    stop(&mut srv);
}

#[test]
fn mlflow_addresses_are_checked_up_front() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    for (uri, why) in [
        ("https://mlflow.example", "is not an http:// address"),
        ("http://:5000", "names no host"),
        ("http://h:50x", "is not a port"),
    ] {
        let set = format!("log.mlflow.uri={uri}");
        let o = kiln(d.path(), &["check", "t.toml", "--set", &set]);
        assert_eq!(o.status.code(), Some(2), "{uri}");
        assert!(stderr(&o).contains(why), "{uri}: {}", stderr(&o));
    }
    let o = kiln(d.path(), &["track", "push", "nowhere"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("is not a run directory"),
        "{}",
        stderr(&o)
    );
}

/// A fake tracking server on loopback that answers every request with `reply` (a function of
/// the stream), for `requests` connections at most; returns its port.
fn fake_server(requests: usize, reply: fn(std::net::TcpStream)) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(requests).flatten() {
            std::thread::spawn(move || reply(stream));
        }
    });
    port
}

/// Issue 58, defect 7: a server that answers with an endless body (here: until 256 MiB or the
/// client hangs up) crashed training allocating 1 GiB; each reply is capped, the run finishes
/// with its summary and says once that MLflow is unreachable.
#[test]
fn a_server_with_an_endless_reply_fails_its_requests_not_the_run() {
    use std::io::{Read, Write};
    let port = fake_server(64, |mut s| {
        let mut head = [0u8; 4096];
        let _ = s.read(&mut head);
        let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n[");
        let chunk = vec![b'1'; 1 << 20];
        for _ in 0..256 {
            if s.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let uri = format!("log.mlflow.uri=http://127.0.0.1:{port}");
    let o = kiln(
        d.path(),
        &["run", "t.toml", "--quiet", "--run-dir", "a", "--set", &uri],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(summary(&d.path().join("a"))["status"], "finished");
    let err = stderr(&o);
    assert_eq!(err.matches("is unreachable").count(), 1, "{err}");
    assert!(err.contains("a reply of over 4 MiB"), "{err}");
}

/// Issue 58, defect 8: a server that takes connections and never answers. The run finishes
/// and says so once (it exited 0 without a word); `kiln track push` says it timed out, naming
/// the address (it said "Resource temporarily unavailable (os error 11)"). The requests' limit
/// is MLflow's own `MLFLOW_HTTP_REQUEST_TIMEOUT` (1 s here).
#[test]
fn a_server_that_never_answers_is_said_once_and_push_says_it_timed_out() {
    let port = fake_server(64, |s| {
        // hold the connection, say nothing, until the client hangs up
        let mut s = s;
        let _ = std::io::Read::read_to_end(&mut s, &mut Vec::new());
    });
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let uri = format!("log.mlflow.uri=http://127.0.0.1:{port}");
    let env = [("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")];
    let o = crate::common::kiln_env(
        d.path(),
        &["run", "t.toml", "--quiet", "--run-dir", "a", "--set", &uri],
        &env,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    let said = err
        .lines()
        .filter(|l| l.starts_with("warning: MLflow at"))
        .count();
    assert_eq!(said, 1, "{err}");
    assert!(err.contains("did not answer within"), "{err}");
    assert!(err.contains("kiln track push"), "{err}");
    let o = crate::common::kiln_env(
        d.path(),
        &[
            "track",
            "push",
            "a",
            "--uri",
            &format!("http://127.0.0.1:{port}"),
        ],
        &env,
    );
    assert_ne!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains(&format!(
            "http://127.0.0.1:{port} did not answer within 1 s (timed out)"
        )),
        "{err}"
    );
    assert!(!err.contains("os error 11"), "{err}");
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_with(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_with(&p, needle));
        } else if std::fs::read(&p)
            .unwrap_or_default()
            .windows(needle.len())
            .any(|w| w == needle)
        {
            out.push(p.display().to_string());
        }
    }
    out
}

/// Issue 58, defects 9 and 10: user info in `log.mlflow.uri` is HTTP basic auth (it was read
/// as part of the host, and never worked), and the password is written nowhere: not in
/// config.toml, env.json (the command line, `KILN_LOG__MLFLOW__URI`), stdout, stderr or
/// `kiln check`'s listing. `HTTP://` and `http://[::1]:PORT` are addresses too.
#[test]
fn a_tracking_password_authenticates_and_is_written_nowhere() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().take(16).flatten() {
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = s.write_all(b"HTTP/1.0 500 Internal Server Error\r\n\r\n{}");
        }
    });
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let uri = format!("HTTP://alice:hunter2@127.0.0.1:{port}");
    let o = kiln(
        d.path(),
        &[
            "check",
            "t.toml",
            "--set",
            &format!("log.mlflow.uri=\"{uri}\""),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("hunter2"), "{}", stdout(&o));
    assert!(stdout(&o).contains("alice:***@"), "{}", stdout(&o));
    let o = crate::common::kiln_env(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "a",
            "--set",
            &format!("log.mlflow.uri={uri}"),
        ],
        &[
            ("KILN_LOG__MLFLOW__EXPERIMENT", "e"),
            ("KILN_LOG__MLFLOW__URI", &uri),
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for text in [stdout(&o), stderr(&o)] {
        assert!(!text.contains("hunter2"), "{text}");
    }
    let leaked = files_with(&d.path().join("a"), b"hunter2");
    assert!(leaked.is_empty(), "{leaked:?}");
    let heads = heads.lock().unwrap().clone();
    assert!(!heads.is_empty());
    // base64("alice:hunter2")
    assert!(
        heads
            .iter()
            .all(|h| h.contains("Authorization: Basic YWxpY2U6aHVudGVyMg==\r\n")),
        "{heads:?}"
    );
    assert!(
        heads
            .iter()
            .all(|h| h.contains(&format!("Host: 127.0.0.1:{port}\r\n"))),
        "{heads:?}"
    );
    // while a process holds the run, a push is refused (sqlite's UNIQUE constraint failed)
    {
        use std::os::unix::io::AsRawFd;
        let lock = std::fs::File::open(d.path().join("a/.kiln.lock")).unwrap();
        // SAFETY: flock on a descriptor this test owns, released when it is dropped.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let o = kiln(d.path(), &["track", "push", "a"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("is running"), "{}", stderr(&o));
    }
    // an IPv6 address is an address (it passed the check, then "cannot resolve [::1]")
    let o = kiln(d.path(), &["track", "push", "a", "--uri", "http://[::1]:9"]);
    assert!(!stderr(&o).contains("cannot resolve"), "{}", stderr(&o));
    assert!(stderr(&o).contains("http://[::1]:9"), "{}", stderr(&o));
}
