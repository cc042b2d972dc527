//! Layer: panic (a leaf: imports nothing from kiln).
//!
//! The text of a caught panic, for the errors that report one (a rank's thread, a data loader
//! worker, a communication thread).

use std::any::Any;
use std::cell::Cell;

thread_local! {
    /// Set while `catch_quietly` runs on this thread.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, catching a panic in it whose message the process's panic hook (kiln's, set by
/// `cli::main_with`) then does not print: for a dependency that panics on bad input, which the
/// caller reports as such (a tokenizer.json `tokenizers` cannot use).
pub fn catch_quietly<R>(
    f: impl FnOnce() -> R + std::panic::UnwindSafe,
) -> Result<R, Box<dyn Any + Send>> {
    // (nested: the outer call's setting comes back)
    let before = QUIET.with(|q| q.replace(true));
    let r = std::panic::catch_unwind(f);
    QUIET.with(|q| q.set(before));
    r
}

/// Whether this thread is inside `catch_quietly`.
pub fn is_quiet() -> bool {
    QUIET.with(|q| q.get())
}

/// What a panic said (its `&str` or `String` payload), or "unknown panic".
pub fn message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn both_payload_kinds_and_others_have_a_text() {
        let text = |f: fn()| super::message(std::panic::catch_unwind(f).unwrap_err().as_ref());
        assert_eq!(text(|| panic!("plain")), "plain");
        assert_eq!(text(|| panic!("formatted {}", 1)), "formatted 1");
        assert_eq!(text(|| std::panic::panic_any(7u8)), "unknown panic");
    }
}
