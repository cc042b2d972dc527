//! The rendezvous store under hostile peers, and secrets compared in constant time.

#![allow(unused_imports)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::common::{
    code, kiln, kiln_env, metric_lines, stderr, stdout, summary, write, KILN, TINY,
};

/// Threads of this process serving store connections (named `kiln-store-conn`).
fn store_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| c.trim() == "kiln-store-conn")
        })
        .count()
}

/// Node 0's store under hostile peers on 127.0.0.1: a flood of connections announcing large
/// frames costs at most a few threads and no large buffers, a trickling peer is dropped at
/// the hello deadline, and the job's own client is served throughout.
#[test]
fn the_rendezvous_store_survives_floods_and_trickling_peers() {
    use kiln::rendezvous::store::{StoreClient, StoreServer, HELLO_SECS, MAX_PENDING};
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let server = StoreServer::start("127.0.0.1:0", "tok".into(), 0, Duration::ZERO).unwrap();
    let addr = server.addr.to_string();
    // 200 strangers, each announcing a 1 MiB hello and sending nothing more
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut s = TcpStream::connect(&addr).ok()?;
            let _ = s.write_all(&(1u32 << 20).to_be_bytes());
            Some(s)
        })
        .collect();
    // during the flood: at most 2 x MAX_PENDING of the store's connection threads (the
    // newest MAX_PENDING in their hello, and closed ones ending)
    let mut peak = 0;
    for _ in 0..20 {
        peak = peak.max(store_threads());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        peak <= 2 * MAX_PENDING,
        "{peak} connection threads during the flood"
    );
    let start = Instant::now();
    // the job's own node still gets in (retrying while the flood holds the hello slots)
    let mut client = StoreClient::connect(&addr, "tok", 1, 0, Duration::from_secs(30)).unwrap();
    client.set("k", "v").unwrap();
    assert!(start.elapsed() < Duration::from_secs(HELLO_SECS * 3));
    drop(flood);
    // one byte every 300 ms (to a store of its own, whose log the flood did not fill): still
    // dropped when its whole hello is overdue
    let server = StoreServer::start("127.0.0.1:0", "tok".into(), 0, Duration::ZERO).unwrap();
    let addr = server.addr.to_string();
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let start = Instant::now();
    let hello = br#"{"hello":{"token":"tok","node":2}}"#;
    let mut frame = (hello.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(hello);
    let mut closed = false;
    for b in frame.iter().cycle().take(60) {
        if slow.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 64];
        if let Ok(0) = slow.read(&mut buf) {
            closed = true;
            break;
        }
        if start.elapsed() > Duration::from_secs(HELLO_SECS + 4) {
            break;
        }
    }
    assert!(
        closed,
        "a trickling peer kept its connection for {:?}",
        start.elapsed()
    );
    assert!(start.elapsed() < Duration::from_secs(HELLO_SECS + 4));
    let local = slow.local_addr().unwrap().to_string();
    assert!(
        server
            .rejected()
            .iter()
            .any(|r| r.starts_with(&local) && r.contains("did not arrive in time")),
        "{:?}",
        server.rejected()
    );
}

#[test]
fn secrets_compare_equal_only_when_equal() {
    use kiln::rendezvous::store::same_secret;
    assert!(same_secret("abc", "abc"));
    assert!(!same_secret("abc", "abd"));
    assert!(!same_secret("abc", "ab"));
    assert!(!same_secret("", "a"));
}
