//! Several node processes on 127.0.0.1: equal results to one process with the same global batch,
//! the job token, garbage and port scans against the store, and a node that never arrives.

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Output};
use std::time::Duration;

use crate::common::{hand_store, kiln, node_cmd, root, stderr, store_port, write, KILN, TINY};

pub(crate) fn node(
    dir: &Path,
    file: &str,
    node: usize,
    nnodes: usize,
    port: u16,
    token: &str,
    sets: &[&str],
) -> Child {
    let mut args = vec!["run", file];
    for s in sets {
        args.extend(["--set", s]);
    }
    node_cmd(dir, &args, node, nnodes, port, token)
        .spawn()
        .unwrap()
}

pub(crate) fn final_loss(o: &Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .find_map(|l| {
            l.split("final loss ")
                .nth(1)
                .map(|r| r.split([',', ';']).next().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| panic!("no final loss in {out} / {}", stderr(o)))
}

pub(crate) fn summary_hash(run: &Path) -> serde_json::Value {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    s["params_sha256"].clone()
}

/// nnodes x devices processes vs one process, same global batch: parameters within 1e-5.
/// `strategy`: the strategy's keys, for both.
/// Returns the state of the multi-node run's last checkpoint.
pub(crate) fn equal_to_one_process(
    nnodes: usize,
    devices: usize,
    strategy: &[&str],
) -> kiln::checkpoint::State {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let per = 16 / (nnodes * devices);
    let batch = format!("train.batch_size={per}");
    let dev = format!("strategy.devices={devices}");
    let mut sets = vec![
        &dev[..],
        &batch,
        "train.max_steps=5",
        "checkpoint.at_end=true",
        "profile.enabled=true",
        "profile.wait=0",
        "profile.warmup=1",
        "profile.active=2",
    ];
    sets.extend_from_slice(strategy);
    let port = store_port();
    let children: Vec<Child> = (0..nnodes)
        .map(|n| node(d.path(), "t.toml", n, nnodes, port, "tok", &sets))
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (n, o) in outs.iter().enumerate() {
        assert_eq!(o.status.code(), Some(0), "node {n}: {}", stderr(o));
    }
    let losses: Vec<String> = outs.iter().map(final_loss).collect();
    assert!(losses.windows(2).all(|w| w[0] == w[1]), "{losses:?}");
    // node 0 merged every node's ranks into one timeline
    let all: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("runs/tiny/trace/all.json")).unwrap())
            .unwrap();
    let mut pids: Vec<u64> = all["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "step")
        .map(|e| e["pid"].as_u64().unwrap())
        .collect();
    pids.sort();
    pids.dedup();
    assert_eq!(pids, (0..(nnodes * devices) as u64).collect::<Vec<_>>());
    // one process with every rank
    let world = format!("strategy.devices={}", nnodes * devices);
    let mut args = vec![
        "run",
        "t.toml",
        "--quiet",
        "--run-dir",
        "one",
        "--set",
        &world,
        "--set",
        &batch,
        "--set",
        "train.max_steps=5",
    ];
    args.extend(strategy.iter().flat_map(|s| ["--set", s]));
    let o = kiln(d.path(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let one = crate::common::checkpoint_params(
        &d.path().join("one"),
        &d.path().join("one/checkpoints/step-00000005"),
    );
    let multi = crate::common::checkpoint_params(
        &d.path().join("runs/tiny"),
        &d.path().join("runs/tiny/checkpoints/step-00000005"),
    );
    let diff = crate::common::max_diff(&one, &multi);
    assert!(diff <= 1e-5, "max |param diff| {diff}");
    // and single with the whole batch
    let o = kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "single",
            "--set",
            "train.batch_size=16",
            "--set",
            "train.max_steps=5",
        ],
    );
    assert_eq!(o.status.code(), Some(0));
    let single = crate::common::checkpoint_params(
        &d.path().join("single"),
        &d.path().join("single/checkpoints/step-00000005"),
    );
    let diff = crate::common::max_diff(&single, &multi);
    assert!(diff <= 1e-5, "vs single: max |param diff| {diff}");
    assert!(summary_hash(&d.path().join("runs/tiny")).is_string());
    kiln::checkpoint::read_state(&d.path().join("runs/tiny/checkpoints/step-00000005")).unwrap()
}

#[test]
fn two_nodes_of_one_device_equal_one_process() {
    equal_to_one_process(2, 1, &["strategy.kind=ddp"]);
}

#[test]
fn two_nodes_of_two_devices_equal_one_process() {
    equal_to_one_process(2, 2, &["strategy.kind=ddp"]);
}

#[test]
fn wrong_tokens_garbage_and_port_scans_do_not_disturb_the_run() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let port = store_port();
    let sets = [
        "strategy.kind=ddp",
        "train.batch_size=4",
        "train.max_steps=5",
    ];
    let n0 = node(d.path(), "t.toml", 0, 2, port, "secret", &sets);
    // wait for the store, then attack it
    let addr = format!("127.0.0.1:{port}");
    let mut tries = 0;
    while TcpStream::connect(&addr).is_err() && tries < 500 {
        std::thread::sleep(Duration::from_millis(10));
        tries += 1;
    }
    drop(TcpStream::connect(&addr).unwrap()); // a port scan: connect and leave
    let mut g = TcpStream::connect(&addr).unwrap();
    let _ = g.write_all(b"\x00\x00\x00\x05hello garbage that is not a frame");
    drop(g);
    let mut huge = TcpStream::connect(&addr).unwrap();
    let _ = huge.write_all(&u32::MAX.to_be_bytes());
    drop(huge);
    // a node with the wrong token is refused
    let bad = node(d.path(), "t.toml", 1, 2, port, "wrong", &sets)
        .wait_with_output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("refused this node: bad job token"),
        "{}",
        stderr(&bad)
    );
    // the real node 1 joins and the job finishes
    let n1 = node(d.path(), "t.toml", 1, 2, port, "secret", &sets);
    let (o0, o1) = (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    );
    assert_eq!(o0.status.code(), Some(0), "{}", stderr(&o0));
    assert_eq!(o1.status.code(), Some(0), "{}", stderr(&o1));
    assert_eq!(final_loss(&o0), final_loss(&o1));
}

#[test]
fn a_node_that_never_arrives_is_named() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let port = store_port();
    let o = node(
        d.path(),
        "t.toml",
        0,
        3,
        port,
        "tok",
        &["strategy.kind=ddp", "launch.rendezvous_timeout_secs=1"],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("rendezvous timed out after 1s: nodes 1-2 never arrived (2 of 3)"),
        "{e}"
    );
}

#[test]
fn launch_settings_come_from_flags_torchrun_and_slurm_variables() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let env = |pairs: &[(&str, &str)]| {
        let o = crate::common::kiln_env(
            d.path(),
            &["check", "t.toml", "--set", "strategy.kind=ddp"],
            pairs,
        );
        (o.status.code(), crate::common::stdout(&o), stderr(&o))
    };
    let (code, out, _) = env(&[
        ("WORLD_SIZE", "4"),
        ("RANK", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1234"),
    ]);
    assert_eq!(code, Some(0));
    assert!(
        out.contains("nnodes = 4") && out.contains("# environment variable WORLD_SIZE"),
        "{out}"
    );
    assert!(
        out.contains("node_rank = 2") && out.contains("master_port = 1234"),
        "{out}"
    );
    assert!(out.contains("world 4 x batch 8"), "{out}");
    let (_, out, _) = env(&[("SLURM_NNODES", "2"), ("SLURM_NODEID", "1")]);
    assert!(out.contains("# environment variable SLURM_NODEID"), "{out}");
    let (code, _, e) = env(&[("WORLD_SIZE", "2"), ("RANK", "2")]);
    assert_eq!(code, Some(2));
    assert!(
        e.contains("`launch.node_rank` = 2 but `launch.nnodes` = 2"),
        "{e}"
    );
    // issue 45, defect 22: under torchrun the store takes MASTER_PORT + 1, and 65535 has no port
    // after it (it fell back to the agent's own port); a port past 65535 names the range
    let (code, _, e) = env(&[
        ("WORLD_SIZE", "2"),
        ("RANK", "0"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "65535"),
    ]);
    assert_eq!(code, Some(2), "{e}");
    assert!(
        e.contains("launch.master_port")
            && e.contains("65536")
            && e.contains("an integer from 0 to 65535")
            && e.contains("MASTER_PORT + 1"),
        "{e}"
    );
    // issue 45, defect 23: an empty or malformed node 0 address is bad input, said up front
    for addr in ["", "  ", " 10.0.0.1", "node 0", "host;rm"] {
        let (code, _, e) = env(&[("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_ADDR", addr)]);
        assert_eq!(code, Some(2), "{addr:?}: {e}");
        assert!(
            e.contains("`launch.master_addr`") && e.contains("is not a host name or IP address"),
            "{addr:?}: {e}"
        );
    }
    let (code, _, e) = env(&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")]);
    assert_eq!(code, Some(2), "{e}");
    assert!(
        e.contains("70000") && e.contains("an integer from 0 to 65535"),
        "{e}"
    );
    let _ = root();
}

/// The pid of `agent`'s worker child (Linux).
pub(crate) fn worker_of(agent: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{agent}/task/{agent}/children")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

pub(crate) fn restart_job(max_restarts: usize) -> (Output, Output, std::path::PathBuf) {
    let d = kiln::testdir::tempdir().unwrap().keep();
    write(&d, "t.toml", TINY);
    let port = store_port();
    let restarts = format!("launch.max_restarts={max_restarts}");
    let sets = [
        "strategy.kind=ddp",
        "train.batch_size=4",
        "train.max_steps=400",
        "train.log_every=50",
        "checkpoint.every_steps=20",
        "launch.heartbeat_secs=2",
        restarts.as_str(),
    ];
    let n0 = node(&d, "t.toml", 0, 2, port, "tok", &sets);
    let n1 = node(&d, "t.toml", 1, 2, port, "tok", &sets);
    // once a checkpoint exists, SIGKILL node 1's training process
    let ckpt = d.join("runs/tiny/checkpoints/step-00000020");
    let start = std::time::Instant::now();
    while !ckpt.exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let victim = if max_restarts > 0 {
        worker_of(n1.id()).expect("node 1's worker")
    } else {
        n1.id()
    };
    unsafe {
        libc::kill(victim as i32, libc::SIGKILL);
    }
    (
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
        d,
    )
}

#[test]
fn a_killed_node_restarts_the_job_from_the_last_checkpoint() {
    let (o0, o1, d) = restart_job(1);
    assert_eq!(o0.status.code(), Some(0), "{}", stderr(&o0));
    assert_eq!(o1.status.code(), Some(0), "{}", stderr(&o1));
    assert!(
        stderr(&o1).contains("node 1: the worker was killed by signal 9; restarting the job"),
        "{}",
        stderr(&o1)
    );
    assert!(
        stderr(&o0).contains("node 0: the worker exited with status 1; restarting the job"),
        "{}",
        stderr(&o0)
    );
    let log = std::fs::read_to_string(d.join("runs/tiny/logs/restarts.log")).unwrap();
    assert!(log.contains("restart 1 of 1"), "{log}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("runs/tiny/summary.json")).unwrap())
            .unwrap();
    assert_eq!(s["status"], "finished");
    assert_eq!(s["steps"], 400);
    assert!(s["resumed_from_step"].as_u64().unwrap() >= 20, "{s}");
    assert_eq!(final_loss(&o0), final_loss(&o1));
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn without_restarts_a_killed_node_fails_the_job_saying_why() {
    let (o0, _o1, d) = restart_job(0);
    assert_eq!(o0.status.code(), Some(1));
    let e = stderr(&o0);
    assert!(
        e.contains("node 1") && (e.contains("lost the connection") || e.contains("heartbeat")),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn a_silent_node_is_detected_by_heartbeat() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let port = store_port();
    let sets = [
        "strategy.kind=ddp",
        "train.batch_size=4",
        "train.max_steps=100000",
        "launch.heartbeat_secs=1",
    ];
    let n0 = node(d.path(), "t.toml", 0, 2, port, "tok", &sets);
    let mut n1 = node(d.path(), "t.toml", 1, 2, port, "tok", &sets);
    let logs = d.path().join("runs/tiny/logs/rank-1.log");
    let start = std::time::Instant::now();
    while !std::fs::read_to_string(&logs)
        .unwrap_or_default()
        .contains("step 10 ")
        && start.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    // freeze node 1: it stops answering but keeps its sockets open
    unsafe {
        libc::kill(n1.id() as i32, libc::SIGSTOP);
    }
    let t = std::time::Instant::now();
    let o0 = n0.wait_with_output().unwrap();
    let waited = t.elapsed();
    let _ = n1.kill();
    let _ = n1.wait();
    assert_eq!(o0.status.code(), Some(1));
    assert!(
        stderr(&o0).contains("node 1 sent no heartbeat for 1s"),
        "{}",
        stderr(&o0)
    );
    assert!(waited < Duration::from_secs(20), "{waited:?}");
}

/// Issue 20: kiln re-executes itself (to put NCCL and NVRTC on the library path) at the top of
/// `main`, before the rendezvous: a node that generated the job token keeps it, and its store
/// stays up. Forced here on a machine that needs no re-exec.
#[cfg(feature = "cuda")]
#[test]
fn the_cuda_re_exec_comes_before_the_rendezvous_and_keeps_a_generated_token() {
    use std::io::{BufRead, BufReader};
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let port = store_port().to_string();
    let args = |n: &str| {
        vec![
            "run".to_string(),
            "t.toml".into(),
            "--quiet".into(),
            "--nnodes".into(),
            "2".into(),
            "--node-rank".into(),
            n.into(),
            "--master-addr".into(),
            "127.0.0.1".into(),
            "--master-port".into(),
            port.clone(),
            "--set".into(),
            "strategy.kind=ddp".into(),
            "--set".into(),
            "train.max_steps=3".into(),
        ]
    };
    let mut n0 = crate::common::clean_cmd(std::path::Path::new(KILN), d.path(), &[]);
    n0.args(args("0"))
        .env("KILN_CUDA_REEXEC", "force")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    hand_store(&mut n0, port.parse().unwrap());
    let mut n0 = n0.spawn().unwrap();
    // node 0 generated a token and printed it (after the re-exec: it is the one in use)
    let mut lines = BufReader::new(n0.stderr.take().unwrap()).lines();
    let token = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("job token: ").map(str::to_string))
        .expect("node 0 printed its job token");
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let n1 = crate::common::clean_cmd(std::path::Path::new(KILN), d.path(), &[])
        .args(args("1"))
        .env("KILN_CUDA_REEXEC", "force")
        .env("KILN_JOB_TOKEN", &token)
        .output()
        .unwrap();
    let o0 = n0.wait_with_output().unwrap();
    let err0 = rest.join().unwrap().join("\n");
    assert_eq!(n1.status.code(), Some(0), "node 1: {}", stderr(&n1));
    assert_eq!(o0.status.code(), Some(0), "node 0: {err0}");
    assert!(summary_hash(&d.path().join("runs/tiny")).is_string());
    // both processes are the re-executed ones
    let env = crate::common::kiln_env(d.path(), &["env"], &[("KILN_CUDA_REEXEC", "force")]);
    assert!(
        crate::common::stdout(&env).contains("environment prepared by kiln (re-executed)"),
        "{}",
        crate::common::stdout(&env)
    );
}

/// `kiln resume DIR` on every node of a job whose directory holds its config and no checkpoint
/// yet (what `kiln submit`'s script runs on a job's first start) starts from
/// `model.init_from`, as the same run on one node does.
#[test]
fn a_multi_node_resume_without_a_checkpoint_starts_from_init_from() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let ok = |o: &Output| assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    ok(&kiln(
        d.path(),
        &[
            "run",
            "t.toml",
            "--quiet",
            "--run-dir",
            "a",
            "--set",
            "train.max_steps=2",
        ],
    ));
    ok(&kiln(d.path(), &["export", "a", "-o", "w.safetensors"]));
    let sets = [
        "--set",
        "strategy.kind=\"ddp\"",
        "--set",
        "model.init_from=\"w.safetensors\"",
        "--set",
        "train.max_steps=6",
    ];
    let mut args = vec![
        "run",
        "t.toml",
        "--quiet",
        "--run-dir",
        "ref",
        "--set",
        "strategy.devices=2",
    ];
    args.extend(sets);
    ok(&kiln(d.path(), &args));
    std::fs::create_dir(d.path().join("job")).unwrap();
    std::fs::copy(
        d.path().join("ref/config.toml"),
        d.path().join("job/config.toml"),
    )
    .unwrap();
    let port = store_port();
    let nodes: Vec<Child> = (0..2)
        .map(|n| {
            let args = ["resume", "job", "--set", "strategy.devices=1"];
            node_cmd(d.path(), &args, n, 2, port, "init-from-token")
                .spawn()
                .unwrap()
        })
        .collect();
    for c in nodes {
        ok(&c.wait_with_output().unwrap());
    }
    let ref_losses = crate::common::losses(&d.path().join("ref"));
    assert_eq!(ref_losses.len(), 6);
    assert_eq!(crate::common::losses(&d.path().join("job")), ref_losses);
}

/// Node 0 serves its store on the listening socket its launcher hands over
/// (`KILN_STORE_FD`, what these tests do); a descriptor that is not one, or a socket on another
/// port, is refused naming the variable.
#[test]
fn a_handed_over_store_socket_is_checked() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    // node 0 of a 2-node ddp job, handed `hand`'s descriptor: exit 2 naming the variable
    let refused = |hand: &dyn Fn(&mut std::process::Command), says: &str, var: &str| {
        let mut cmd = crate::common::clean_cmd(
            Path::new(KILN),
            d.path(),
            &[
                "run",
                "t.toml",
                "--quiet",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                "9",
                "--set",
                "strategy.kind=\"ddp\"",
            ],
        );
        cmd.env("KILN_JOB_TOKEN", "tok");
        hand(&mut cmd);
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{says}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(var) && e.contains(says), "{says}: {e}");
    };
    let other = store_port();
    for (fd, says) in [
        ("abc", "not a file descriptor number above 2"),
        ("1", "not a file descriptor number above 2"),
        ("77", "descriptor 77 is not an open socket"),
        ("3", "not the job's"),
    ] {
        // descriptor 3 is the socket of another port
        let hand = |cmd: &mut std::process::Command| {
            hand_store(cmd, other);
            cmd.env("KILN_STORE_FD", fd);
        };
        refused(&hand, says, &format!("KILN_STORE_FD={fd}"));
    }
    // issue 45, defect 24: sockets that are no TCP listener are refused at once, exit 2 naming
    // the variable (they were taken, and the rendezvous waited out its timeout)
    use std::os::fd::AsRawFd;
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // SAFETY: a new socket bound to 127.0.0.1:0 and never listened on.
    let bound = unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(s, (&a as *const libc::sockaddr_in).cast(), len),
            0
        );
        s
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let connected = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    for (fd, says) in [
        (udp.as_raw_fd(), "is not a TCP socket"),
        (bound, "does not listen"),
        (connected.as_raw_fd(), "does not listen"),
    ] {
        let hand = |cmd: &mut std::process::Command| crate::common::hand_fd(cmd, fd);
        refused(&hand, says, "KILN_STORE_FD=3");
    }
    // SAFETY: the socket made above, closed once.
    unsafe { libc::close(bound) };
}

/// Issue 58, defect 17: nodes started with different settings (here `strategy.shard_size`)
/// stop at the rendezvous naming the key, both values and the nodes, exit 2 (they failed with
/// "collective size mismatch in all_gather #0").
#[test]
fn nodes_with_different_settings_are_refused_naming_the_key() {
    let d = kiln::testdir::tempdir().unwrap();
    write(d.path(), "t.toml", TINY);
    let port = crate::common::store_port();
    let sets = |shard: &str| {
        vec![
            "strategy.kind=fsdp".to_string(),
            "strategy.devices=2".into(),
            format!("strategy.shard_size={shard}"),
            "train.max_steps=2".into(),
        ]
    };
    let spawn = |rank: usize, shard: &str| {
        let mut args = vec!["run".to_string(), "t.toml".into()];
        for s in sets(shard) {
            args.extend(["--set".into(), s]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        crate::common::node_cmd(d.path(), &refs, rank, 2, port, "tok")
            .spawn()
            .unwrap()
    };
    let n0 = spawn(0, "2");
    let n1 = spawn(1, "4");
    for (rank, o) in [
        n0.wait_with_output().unwrap(),
        n1.wait_with_output().unwrap(),
    ]
    .into_iter()
    .enumerate()
    {
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "node {rank}: {e}");
        let (mine, theirs) = if rank == 0 { ("2", "4") } else { ("4", "2") };
        let other = 1 - rank;
        assert!(
            e.contains(&format!(
                "node {other} has `strategy.shard_size` = {theirs} but node {rank} has {mine}"
            )),
            "node {rank}: {e}"
        );
    }
}
