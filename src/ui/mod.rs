//! Layer: ui (a leaf: imports nothing from kiln).
//!
//! Terminal output: the only module that imports indicatif, and the only one below `cli` that
//! prints. Rank 0 shows a progress bar (step/total, loss, samples/s, ETA) when stderr is a
//! terminal and `--quiet` is not given; `out` and `note` are the plain lines library code has to
//! say (results on stdout, warnings and notes on stderr).

mod progress;

pub use progress::*;

/// A result line, on stdout (printed even when quiet: scripts read it).
pub fn out(line: &str) {
    println!("{line}");
}

/// A note or warning for the person at the terminal, on stderr.
pub fn note(line: &str) {
    eprintln!("{line}");
}
