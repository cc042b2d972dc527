//! Temporary directories for kiln's own tests and benchmarks (unit tests, `tests/`, `benches/`):
//! a fresh directory under the system's temporary directory, removed when dropped; and ports
//! for a test's node 0 (`free_port`). Kept here
//! rather than taken from the `tempfile` crate because a test-only dependency changes feature
//! unification, and `cargo test --release` would rebuild the Burn stack `cargo run` had built.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A directory removed (with everything in it) when dropped.
#[derive(Debug)]
pub struct TempDir {
    path: Option<PathBuf>,
}

impl TempDir {
    pub fn path(&self) -> &Path {
        self.path
            .as_deref()
            .expect("a kept TempDir has no path to lend")
    }
    /// Keeps the directory (it is not removed) and returns its path.
    pub fn keep(mut self) -> PathBuf {
        self.path.take().expect("kept once")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// A new, empty directory of its own (created exclusively: never one another test holds).
pub fn tempdir() -> std::io::Result<TempDir> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let p = base.join(format!(".kiln-test-{}-{n}-{nanos:x}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => return Ok(TempDir { path: Some(p) }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("no free temporary directory name"))
}

/// A port for a kiln node 0 of a test (unit or integration), that no other test of this run is given and that no
/// connection of this machine takes as its own end: the ports come in turn, two at a time (the
/// one given and the one after it, which kiln's torchrun layout takes), from 10000-19999:
/// below Linux's ephemeral range (32768-60999, where the OS picks the local port of every
/// outgoing connection and of a bind to port 0) and below the ports a bare `srun` step derives
/// (20000-39999). The turn starts at an offset taken from this process's id, so that two test
/// runs at once are unlikely to meet; each pair is checked free by binding it.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const PAIRS: u32 = 5_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(97) % PAIRS,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..PAIRS {
        let port = (LOW + 2 * (NEXT.fetch_add(1, Ordering::SeqCst) % PAIRS)) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 1) {
            return port;
        }
    }
    panic!("no free pair of ports in {LOW}-{}", LOW + 2 * PAIRS - 1);
}
