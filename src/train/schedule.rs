//! Learning-rate schedules as pure functions of the optimizer step, so resuming needs no
//! scheduler state. Warm-up rises linearly from 0 (HF `get_*_schedule_with_warmup` convention).

use crate::config::{ScheduleConfig, ScheduleKind};

/// The learning rate for optimizer step `step` (0-based) of `total`.
pub fn lr_at(c: &ScheduleConfig, base: f64, step: usize, total: usize) -> f64 {
    if step < c.warmup_steps {
        return base * step as f64 / c.warmup_steps.max(1) as f64;
    }
    let after = step - c.warmup_steps;
    match c.kind {
        ScheduleKind::Constant => base,
        ScheduleKind::Step => base * c.gamma.powi((after / c.step_size.max(1)) as i32),
        ScheduleKind::Cosine => {
            let span = total.saturating_sub(c.warmup_steps).max(1) as f64;
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
        assert_eq!(lr_at(&c, 1.0, 0, 10), 0.0);
        assert_eq!(lr_at(&c, 1.0, 2, 10), 0.5);
        assert_eq!(lr_at(&c, 1.0, 7, 10), 1.0);
        c.kind = ScheduleKind::Cosine;
        assert!((lr_at(&c, 1.0, 4, 10) - 1.0).abs() < 1e-12);
        assert!(lr_at(&c, 1.0, 10, 10).abs() < 1e-12);
        c.kind = ScheduleKind::Step;
        c.warmup_steps = 0;
        c.step_size = 3;
        c.gamma = 0.5;
        assert_eq!(lr_at(&c, 1.0, 3, 10), 0.5);
        assert_eq!(lr_at(&c, 1.0, 6, 10), 0.25);
    }
}
