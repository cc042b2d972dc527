//! f16's dynamic loss scaling, as torch's `GradScaler` does it: the loss is multiplied by a
//! scale before the backward (so that gradients too small for f16 survive), each gradient is
//! divided by it again once it is f32 (`Compute::micro`), and a step whose gradient has an
//! infinite or NaN value on any rank is skipped: no update, the scale multiplied by the backoff
//! factor. After `growth_interval` steps in a row without an overflow the scale grows by the
//! growth factor. The scale and its count are part of a checkpoint, so a resumed run scales
//! exactly as the uninterrupted one would.

use crate::checkpoint::LossScaleState;
use crate::config::LossScaleConfig;

/// 2^-24, f16's smallest subnormal.
const MIN_SCALE: f64 = 5.960_464_477_539_063e-8;

/// The loss scale of a run with `backend.precision = "f16"`.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaler {
    cfg: LossScaleConfig,
    state: LossScaleState,
}

impl LossScaler {
    /// The scaler at the start of a run, or where a checkpoint left it.
    pub fn new(cfg: &LossScaleConfig, resumed: Option<&LossScaleState>) -> Self {
        LossScaler {
            cfg: cfg.clone(),
            state: resumed.cloned().unwrap_or(LossScaleState {
                scale: cfg.init_scale,
                growth_tracker: 0,
                skipped_steps: 0,
            }),
        }
    }

    /// The scale the next step's backward runs with.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// A step ended: `overflow` when its gradient had an infinite or NaN value (the step is
    /// skipped, the scale backs off), otherwise it was taken (the scale grows after
    /// `growth_interval` of them in a row).
    pub fn update(&mut self, overflow: bool) {
        let s = &mut self.state;
        if overflow {
            s.scale *= self.cfg.backoff_factor;
            s.growth_tracker = 0;
            s.skipped_steps += 1;
            return;
        }
        s.growth_tracker += 1;
        if s.growth_tracker >= self.cfg.growth_interval {
            // (f64: a scale that would overflow f32's range stops growing there)
            s.scale = (s.scale * self.cfg.growth_factor).min(f64::from(f32::MAX));
            s.growth_tracker = 0;
        }
    }

    /// Whether the scale has backed off below f16's smallest subnormal (2^-24): a gradient
    /// that still overflows there overflows whatever the scale (a NaN or an infinity in the
    /// data or the parameters), and the run stops as diverged instead of skipping forever.
    pub fn exhausted(&self) -> bool {
        self.state.scale < MIN_SCALE
    }

    /// What a checkpoint keeps.
    pub fn state(&self) -> &LossScaleState {
        &self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backs_off_on_overflow_and_grows_after_the_interval_like_torch() {
        let cfg = LossScaleConfig {
            init_scale: 1024.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 3,
        };
        let mut s = LossScaler::new(&cfg, None);
        let mut scales = Vec::new();
        for overflow in [false, false, true, false, false, false, false, true] {
            s.update(overflow);
            scales.push(s.scale());
        }
        // torch: an overflow resets the count of good steps; the third good step in a row grows
        assert_eq!(
            scales,
            [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 1024.0, 512.0]
        );
        assert_eq!(s.state().skipped_steps, 2);
        assert_eq!(s.state().growth_tracker, 0);
        // a resumed scaler carries on from its state
        let mut a = LossScaler::new(&cfg, None);
        a.update(false);
        a.update(false);
        let mut b = LossScaler::new(&cfg, Some(a.state()));
        a.update(false);
        b.update(false);
        assert_eq!(a, b);
        assert_eq!(a.scale(), 2048.0);
        // overflowing at every scale: exhausted once below 2^-24, after 35 halvings of 2^10
        let mut s = LossScaler::new(&cfg, None);
        let mut skips = 0;
        while !s.exhausted() {
            s.update(true);
            skips += 1;
        }
        assert_eq!((skips, s.scale()), (35, 2f64.powi(-25)));
    }
}
