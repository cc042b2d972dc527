//! Learning-rate schedules as pure functions of the optimizer step, so resuming needs no
//! scheduler state. Warm-up rises linearly as nanoGPT's `get_lr` (and torch's `LinearLR` from
//! `1 / (warmup + 1)`): step `i < warmup` trains with `lr * (i + 1) / (warmup + 1)`, so the
//! first step already learns (issue 45: it trained with 0, as Hugging Face's
//! `get_*_schedule_with_warmup` does). The cosine decays to `min_lr` at `decay_steps`
//! (nanoGPT's `lr_decay_iters`; the run's last step when unset) and stays there; the linear
//! schedule (transformers' `get_linear_schedule_with_warmup`) falls in a straight line to
//! `min_lr` (0) there.

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
        // transformers' `get_linear_schedule_with_warmup` after its warm-up:
        // `max(0, (end - step) / max(1, end - warmup))`, from `min_lr` up
        ScheduleKind::Linear => {
            let end = c.decay_steps.unwrap_or(total);
            let span = end.saturating_sub(c.warmup_steps).max(1) as f64;
            let left = (end.saturating_sub(step) as f64 / span).clamp(0.0, 1.0);
            c.min_lr + (base - c.min_lr) * left
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

    /// Every step of a linear schedule against transformers' `get_linear_schedule_with_warmup`
    /// after the warm-up (`(total - step) / (total - warmup)`), and kiln's warm-up before it.
    #[test]
    fn linear_decays_to_zero_at_the_last_step_as_transformers_does() {
        let c = ScheduleConfig {
            kind: ScheduleKind::Linear,
            warmup_steps: 3,
            ..ScheduleConfig::default()
        };
        let (base, total) = (3e-4, 12usize);
        for step in 0..total + 2 {
            let want = if step < 3 {
                base * (step + 1) as f64 / 4.0
            } else {
                base * (total.saturating_sub(step)) as f64 / (total - 3) as f64
            };
            let got = lr_at(&c, base, step, total);
            assert!((got - want).abs() < 1e-15, "step {step}: {got} vs {want}");
        }
        assert_eq!(lr_at(&c, base, 3, total), base);
        assert!(lr_at(&c, base, total - 1, total) > 0.0);
        // decay_steps ends the line early; min_lr is its floor
        let c = ScheduleConfig {
            decay_steps: Some(8),
            min_lr: 1e-5,
            ..c
        };
        assert!((lr_at(&c, base, 8, total) - 1e-5).abs() < 1e-18);
        assert!((lr_at(&c, base, 11, total) - 1e-5).abs() < 1e-18);
        let mid = 1e-5 + (base - 1e-5) * 2.0 / 5.0;
        assert!((lr_at(&c, base, 6, total) - mid).abs() < 1e-15);
    }
}
