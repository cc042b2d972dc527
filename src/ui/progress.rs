//! Progress output types.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Progress of one run: on a terminal a bar (step/total, loss, samples/s or tokens/s, ETA);
/// otherwise a plain line at each logged step; nothing with `--quiet`.
pub struct Progress {
    bar: Option<ProgressBar>,
    quiet: bool,
    total: usize,
    first: usize,
    tokens_per_sample: Option<usize>,
    started: std::time::Instant,
}

/// `1h02m`, `3m05s`, `42s`.
fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

impl Progress {
    pub fn new(quiet: bool) -> Self {
        Progress {
            bar: None,
            quiet,
            total: 0,
            first: 0,
            tokens_per_sample: None,
            started: std::time::Instant::now(),
        }
    }

    /// Rates are shown in tokens/s for a language model (`tokens_per_sample` set).
    pub fn with_tokens(mut self, tokens_per_sample: Option<usize>) -> Self {
        self.tokens_per_sample = tokens_per_sample;
        self
    }

    /// Starts the bar for `total` steps at `first` (only on a terminal, only when not quiet).
    pub fn start(&mut self, total: usize, first: usize) {
        self.total = total;
        self.first = first;
        self.started = std::time::Instant::now();
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

    fn rate(&self, samples_per_sec: f64) -> String {
        match self.tokens_per_sample {
            Some(t) => format!("{:.0} tokens/s", samples_per_sec * t as f64),
            None => format!("{samples_per_sec:.0} samples/s"),
        }
    }

    /// A finished step; `logged` when it is a `log_every` step (the lines printed without a
    /// terminal).
    pub fn step(&self, step: usize, loss: f64, samples_per_sec: f64, logged: bool) {
        if let Some(b) = &self.bar {
            b.set_position(step as u64);
            b.set_message(format!("loss {loss:.4}  {}", self.rate(samples_per_sec)));
        } else if logged && !self.quiet {
            let done = step.saturating_sub(self.first).max(1) as f64;
            let left = self.total.saturating_sub(step) as f64;
            let eta = self.started.elapsed().as_secs_f64() / done * left;
            eprintln!(
                "step {step}/{}  loss {loss:.4}  {}  eta {}",
                self.total,
                self.rate(samples_per_sec),
                duration(eta)
            );
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
            Some(b) => b.println(super::printable(msg)),
            None => eprintln!("{}", super::printable(msg)),
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
                let _ = m.println(super::printable(msg));
            }
            None => eprintln!("{}", super::printable(msg)),
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

    /// A trial that stopped for now (asha's pause at a rung): its line, not counted as done.
    pub fn paused(&mut self, id: &str, msg: &str) {
        if let Some(pos) = self.trials.iter().position(|(t, _)| t == id) {
            let (_, b) = self.trials.remove(pos);
            b.finish_and_clear();
            if let Some(m) = &self.multi {
                m.remove(&b);
            }
        }
        self.info(&format!("trial {id} {msg}"));
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

#[cfg(test)]
mod tests {
    use super::duration;

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(duration(42.4), "42s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(3720.0), "1h02m");
    }
}
