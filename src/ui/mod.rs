//! Terminal output: the only module that imports indicatif. Rank 0 shows a progress bar
//! (step/total, loss, samples/s, ETA) when stderr is a terminal and `--quiet` is not given.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Progress of one run.
pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        Progress { bar: None, quiet }
    }

    /// Starts the bar for `total` steps at `first` (only on a terminal, only when not quiet).
    pub fn start(&mut self, total: usize, first: usize) {
        if self.quiet || !std::io::stderr().is_terminal() {
            return;
        }
        let bar = ProgressBar::new(total as u64);
        let style = ProgressStyle::with_template(
            "{bar:30.cyan/blue} {pos}/{len} steps  {msg}  eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_position(first as u64);
        bar.reset_eta();
        self.bar = Some(bar);
    }

    pub fn step(&self, step: usize, loss: f64, samples_per_sec: f64) {
        if let Some(b) = &self.bar {
            b.set_position(step as u64);
            b.set_message(format!("loss {loss:.4}  {samples_per_sec:.0} samples/s"));
        }
    }

    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }

    /// A status line on stderr (suppressed by `--quiet`).
    pub fn info(&self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(b) => b.println(msg),
            None => eprintln!("{msg}"),
        }
    }
}
