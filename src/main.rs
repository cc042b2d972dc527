//! The `kiln` binary: kiln's command line with the built-in model families. It owns the process
//! exit code (0 ok, 1 the run failed, 2 bad input), which `kiln::cli::main_with` returns after
//! printing any error.

fn main() {
    std::process::exit(kiln::cli::main_with(kiln::model::Registry::builtin()));
}

/// Small blocks come from mimalloc (fast, per thread); blocks of 64 KiB and more are mapped
/// for themselves (and kept for reuse, within a bound) by the counting wrapper (see
/// `kiln::memory`), which also attributes every byte to the rank that allocated it
/// (`summary.json`'s `memory[r].peak_bytes`).
#[global_allocator]
static GLOBAL: kiln::memory::Counting<mimalloc::MiMalloc> =
    kiln::memory::Counting(mimalloc::MiMalloc);

/// mimalloc's options, set before the first allocation (an ELF constructor runs before the Rust
/// runtime allocates; the first arena is made then, too late for `main`): freed pages go back
/// to the OS after 100 ms instead of 1 s, and arenas commit memory as it is used. Without them a run's resident set keeps the high-water mark of every thread's short-lived
/// blocks: fsdp(4) on `experiments/bench-memory.toml` peaked at 650-690 MiB instead of 600 (the
/// ranks hold 560 at most). A `MIMALLOC_PURGE_DELAY` or `MIMALLOC_ARENA_EAGER_COMMIT` the user
/// set wins (or their legacy names `MIMALLOC_RESET_DELAY`, `MIMALLOC_EAGER_REGION_COMMIT`).
#[cfg(target_os = "linux")]
mod allocator_options {
    use std::os::raw::{c_int, c_long};

    extern "C" {
        fn mi_option_set(option: c_int, value: c_long);
    }

    /// `mi_option_e` of mimalloc as libmimalloc-sys 0.1.49 builds it (`include/mimalloc.h`, the
    /// same numbers in v2 and v3); the test below fails when the lock file moves to another
    /// version, to check them again (it cannot tell a wrong number: an option reads back what
    /// was set).
    const ARENA_EAGER_COMMIT: c_int = 4;
    const PURGE_DELAY: c_int = 15;

    /// Whether none of the variables (NUL-terminated names) is set, asked without allocating
    /// (an allocation here would make mimalloc's first arena). mimalloc reads its variables
    /// without regard to case, the legacy names too; the usual spellings are checked.
    fn unset(vars: &[&[u8]]) -> bool {
        vars.iter().all(|v| {
            // SAFETY: a NUL-terminated name; getenv only reads the environment
            unsafe { libc::getenv(v.as_ptr().cast()) }.is_null()
        })
    }

    extern "C" fn set() {
        // SAFETY: mimalloc's options are plain integers it reads when it needs them
        unsafe {
            if unset(&[
                b"MIMALLOC_PURGE_DELAY\0",
                b"mimalloc_purge_delay\0",
                b"MIMALLOC_RESET_DELAY\0",
            ]) {
                mi_option_set(PURGE_DELAY, 100);
            }
            if unset(&[
                b"MIMALLOC_ARENA_EAGER_COMMIT\0",
                b"mimalloc_arena_eager_commit\0",
                b"MIMALLOC_EAGER_REGION_COMMIT\0",
            ]) {
                mi_option_set(ARENA_EAGER_COMMIT, 0);
            }
        }
    }

    #[used]
    #[link_section = ".init_array"]
    static SET: extern "C" fn() = set;

    #[cfg(test)]
    mod tests {
        extern "C" {
            fn mi_option_get(option: super::c_int) -> super::c_long;
        }

        #[test]
        fn the_option_numbers_are_those_of_the_locked_mimalloc() {
            let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock"))
                .unwrap();
            assert!(
                lock.contains("name = \"libmimalloc-sys\"\nversion = \"0.1.49\""),
                "libmimalloc-sys moved: check ARENA_EAGER_COMMIT and PURGE_DELAY against its mimalloc.h"
            );
            // SAFETY: reads two options
            let (purge, eager) = unsafe {
                (
                    mi_option_get(super::PURGE_DELAY),
                    mi_option_get(super::ARENA_EAGER_COMMIT),
                )
            };
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                assert_eq!(purge, 100);
            }
            if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_none() {
                assert_eq!(eager, 0);
            }
        }
    }
}
