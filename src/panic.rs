//! Layer: panic (a leaf: imports nothing from kiln).
//!
//! The text of a caught panic, for the errors that report one (a rank's thread, a data loader
//! worker, a communication thread).

use std::any::Any;

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
