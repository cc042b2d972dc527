//! Progress output types.

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
        let style =
            ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} steps  {msg}  eta {eta}")
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

/// A sweep's view: one overall bar (done/total, ETA) and one line per running trial. Without a
/// terminal it prints one line per trial start and end instead.
pub struct SweepProgress {
    multi: Option<indicatif::MultiProgress>,
    overall: Option<ProgressBar>,
    trials: Vec<(String, ProgressBar)>,
    quiet: bool,
}

impl SweepProgress {
    pub fn new(total: usize, done: usize, quiet: bool) -> Self {
        if quiet || !std::io::stderr().is_terminal() {
            return SweepProgress {
                multi: None,
                overall: None,
                trials: Vec::new(),
                quiet,
            };
        }
        let multi = indicatif::MultiProgress::new();
        let overall = multi.add(ProgressBar::new(total as u64));
        let style =
            ProgressStyle::with_template("{bar:30.green/blue} {pos}/{len} trials  eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
        overall.set_style(style);
        overall.set_position(done as u64);
        overall.reset_eta();
        SweepProgress {
            multi: Some(multi),
            overall: Some(overall),
            trials: Vec::new(),
            quiet,
        }
    }

    pub fn info(&self, msg: &str) {
        if self.quiet {
            return;
        }
        match &self.multi {
            Some(m) => {
                let _ = m.println(msg);
            }
            None => eprintln!("{msg}"),
        }
    }

    pub fn started(&mut self, id: &str, what: &str) {
        match &self.multi {
            Some(m) => {
                let bar = m.add(ProgressBar::new_spinner());
                bar.set_prefix(format!("{id} {what}"));
                bar.set_style(
                    ProgressStyle::with_template("  {spinner} {prefix}  {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                );
                bar.enable_steady_tick(std::time::Duration::from_millis(200));
                self.trials.push((id.to_string(), bar));
            }
            None => self.info(&format!("trial {id} started: {what}")),
        }
    }

    pub fn update(&self, id: &str, msg: &str) {
        if let Some((_, b)) = self.trials.iter().find(|(t, _)| t == id) {
            b.set_message(msg.to_string());
        }
    }

    pub fn finished(&mut self, id: &str, ok: bool, why: &str) {
        if let Some(pos) = self.trials.iter().position(|(t, _)| t == id) {
            let (_, b) = self.trials.remove(pos);
            b.finish_and_clear();
            if let Some(m) = &self.multi {
                m.remove(&b);
            }
        }
        if let Some(o) = &self.overall {
            o.inc(1);
        }
        let line = if ok {
            format!("trial {id} done")
        } else {
            format!("trial {id} failed: {why}")
        };
        self.info(&line);
    }

    pub fn finish(&mut self) {
        for (_, b) in self.trials.drain(..) {
            b.finish_and_clear();
        }
        if let Some(o) = self.overall.take() {
            o.finish_and_clear();
        }
    }
}
