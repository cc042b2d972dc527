//! Layer: ui (a leaf: imports nothing from kiln).
//!
//! Terminal output: the only module that imports indicatif, and the only one below `cli` that
//! prints. Rank 0 shows a progress bar (step/total, loss, samples/s, ETA) when stderr is a
//! terminal and `--quiet` is not given; `out` and `note` are the plain lines library code has to
//! say (results on stdout, warnings and notes on stderr).

mod progress;

pub use progress::*;

/// A result line, on stdout (printed even when quiet: scripts read it), its control
/// characters escaped (`printable`).
pub fn out(line: &str) {
    out_raw(&format!("{}\n", printable(line)));
}

/// `text` with every control character but newline and tab escaped as Rust writes it
/// (`\u{1b}`): a name kiln quotes from a file (a shard, a tensor, a key of a downloaded
/// model's config.json) can never drive the user's terminal (issue 58, defect 14: ESC, an OSC
/// title and NUL were printed raw).
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    // control characters, and the bidirectional overrides and isolates that reorder how a
    // line shows (U+202A-U+202E, U+2066-U+2069)
    let bad = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || ('\u{202A}'..='\u{202E}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
    };
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` on stdout as it is (no newline added). A failed write (a closed pipe, a full disk)
/// never panics: the first error is kept for `stdout_error` and later writes are skipped, so
/// that a run whose stdout went away still finishes and keeps its files; `main` then says so
/// and exits non-zero (or 0 for a read-only command whose reader closed the pipe, as `| head`
/// does).
pub fn out_raw(text: &str) {
    use std::io::Write as _;
    let mut failed = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
    if failed.is_some() {
        return;
    }
    let mut lock = std::io::stdout().lock();
    if let Err(e) = lock.write_all(text.as_bytes()).and_then(|_| lock.flush()) {
        *failed = Some(e);
    }
}

static STDOUT_ERROR: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::new(None);

/// The first error writing to stdout, if any: its kind and message.
pub fn stdout_error() -> Option<(std::io::ErrorKind, String)> {
    STDOUT_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|e| (e.kind(), e.to_string()))
}

/// `println!` through `ui::out`: never panics on a failed write (see `out_raw`).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::ui::out("")
    };
    ($($t:tt)*) => {
        $crate::ui::out(&format!($($t)*))
    };
}

/// A note or warning for the person at the terminal, on stderr.
pub fn note(line: &str) {
    eprintln!("{}", printable(line));
}

/// A byte count for people: `512 B`, `3.4 KiB`, `30.1 MiB`, `2.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `t` as RFC 3339 in UTC with milliseconds, e.g. `2026-11-30T16:05:09.123Z`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    let (date, ms) = utc_parts(t);
    let [y, mo, d, h, mi, s] = date;
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
}

/// `t` in UTC for a file name, e.g. `20261130T160509Z`.
pub fn compact_utc(t: std::time::SystemTime) -> String {
    let ([y, mo, d, h, mi, s], _) = utc_parts(t);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// Year, month, day, hour, minute, second and milliseconds of `t` in UTC (Howard Hinnant's
/// days-to-civil algorithm; no time zone database needed).
fn utc_parts(t: std::time::SystemTime) -> ([i64; 6], i64) {
    let ms_total = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let (secs, ms) = (ms_total.div_euclid(1000), ms_total.rem_euclid(1000));
    (civil(secs), ms)
}

/// Year, month, day, hour, minute and second of `secs` seconds after 1970-01-01T00:00:00
/// (Howard Hinnant's days-to-civil algorithm).
pub fn civil(secs: i64) -> [i64; 6] {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    [y, m, d, rem / 3600, rem % 3600 / 60, rem % 60]
}

#[cfg(test)]
mod time_tests {
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn utc_times_match_known_dates() {
        let t = |s: u64, ms: u64| UNIX_EPOCH + Duration::from_millis(s * 1000 + ms);
        assert_eq!(super::rfc3339(t(0, 0)), "1970-01-01T00:00:00.000Z");
        // 2024-02-29 12:34:56.789 (a leap day)
        assert_eq!(
            super::rfc3339(t(1_709_210_096, 789)),
            "2024-02-29T12:34:56.789Z"
        );
        assert_eq!(super::compact_utc(t(1_798_761_599, 0)), "20261231T235959Z");
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(31_530_000), "30.1 MiB");
        assert_eq!(super::bytes(3 << 30), "3.0 GiB");
    }
}

#[cfg(test)]
mod printable_tests {
    #[test]
    fn control_characters_are_escaped_and_lines_kept() {
        assert_eq!(super::printable("a\nb\tc"), "a\nb\tc");
        assert_eq!(
            super::printable("shard \u{1b}]0;pwned\u{7}\0.safetensors \u{9b}"),
            "shard \\u{1b}]0;pwned\\u{7}\\u{0}.safetensors \\u{9b}"
        );
        // a right-to-left override would show the rest of the line reversed
        assert_eq!(
            super::printable("a\u{202e}txt.exe \u{2066}b"),
            "a\\u{202e}txt.exe \\u{2066}b"
        );
    }
}
