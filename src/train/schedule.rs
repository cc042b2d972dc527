//! Learning-rate schedules as pure functions of the optimizer step, so resuming needs no
//! scheduler state. Warm-up rises linearly as nanoGPT's `get_lr` (and torch's `LinearLR` from
//! `1 / (warmup + 1)`): step `i < warmup` trains with `lr * (i + 1) / (warmup + 1)`, so the
//! first step already learns (issue 45: it trained with 0, as Hugging Face's
//! `get_*_schedule_with_warmup` does). The cosine decays to `min_lr` at `decay_steps`
//! (nanoGPT's `lr_decay_iters`; the run's last step when unset) and stays there.

use crate::config::{ScheduleConfig, ScheduleKind};

/// The learning rate for optimizer step `step` (0-based) of `total`.
pub fn lr_at(c: &ScheduleConfig, base: f64, step: usize, total: usize) -> f64 {
    if step < c.warmup_steps {
        return base * (step + 1) as f64 / (c.warmup_steps + 1) as f64;
    }
    let after = step - c.warmup_steps;
    match c.kind {
        ScheduleKind::Constant => base,
        ScheduleKind::Step => base * c.gamma.powi((after / c.step_size.max(1)) as i32),
        ScheduleKind::Cosine => {
            let end = c.decay_steps.unwrap_or(total);
            let span = end.saturating_sub(c.warmup_steps).max(1) as f64;
            let progress = (after as f64 / span).min(1.0);
            c.min_lr + (base - c.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let mut c = ScheduleConfig {
            warmup_steps: 4,
            ..ScheduleConfig::default()
        };
        // nanoGPT's: (i + 1) / (warmup + 1), never 0
        assert_eq!(lr_at(&c, 1.0, 0, 10), 0.2);
        assert_eq!(lr_at(&c, 1.0, 3, 10), 0.8);
        assert_eq!(lr_at(&c, 1.0, 7, 10), 1.0);
        c.kind = ScheduleKind::Cosine;
        assert!((lr_at(&c, 1.0, 4, 10) - 1.0).abs() < 1e-12);
        assert!(lr_at(&c, 1.0, 10, 10).abs() < 1e-12);
        // decay_steps: the horizon of the cosine, min_lr after it
        c.decay_steps = Some(6);
        c.min_lr = 0.1;
        assert!(
            (lr_at(&c, 1.0, 5, 10)
                - (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * 0.5).cos())))
            .abs()
                < 1e-12
        );
        assert!((lr_at(&c, 1.0, 6, 10) - 0.1).abs() < 1e-12);
        assert!((lr_at(&c, 1.0, 9, 10) - 0.1).abs() < 1e-12);
        c.decay_steps = None;
        c.min_lr = 0.0;
        c.kind = ScheduleKind::Step;
        c.warmup_steps = 0;
        c.step_size = 3;
        c.gamma = 0.5;
        assert_eq!(lr_at(&c, 1.0, 3, 10), 0.5);
        assert_eq!(lr_at(&c, 1.0, 6, 10), 0.25);
    }
}
