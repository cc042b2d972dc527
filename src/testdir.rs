//! Temporary directories for kiln's own tests and benchmarks (unit tests, `tests/`, `benches/`):
//! a fresh directory under the system's temporary directory, removed when dropped. Kept here
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
