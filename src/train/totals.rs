//! What one training step adds up over its micro-steps and then over the ranks.

use crate::strategy::Strategy;

use super::TrainError;

/// What one step adds up over its micro-steps, then over the ranks in one reduction, so that
/// every rank decides alike on the loss, a stop and a non-finite gradient.
#[derive(Default)]
pub(super) struct StepTotals {
    /// The micro-batches' losses, each weighted by its batch's weight.
    pub(super) weighted_loss: f64,
    /// Their parts that are the model's own (a mixture of experts' load balancing), weighted
    /// alike, and how many micro-batches had one.
    pub(super) weighted_own: f64,
    pub(super) owns: f64,
    pub(super) samples: f64,
    /// A stop request's signal number (0: none): above 0 once summed when any rank has one.
    pub(super) stop: f64,
    /// Ranks whose gradient has a NaN or an infinity.
    pub(super) bad_grads: f64,
}

impl StepTotals {
    /// Sums every field over the ranks (one all-reduce, in this order).
    pub(super) fn sum_over_ranks(&mut self, strategy: &mut dyn Strategy) -> Result<(), TrainError> {
        let mut v = [
            self.weighted_loss,
            self.weighted_own,
            self.owns,
            self.samples,
            self.stop,
            self.bad_grads,
        ];
        strategy.sum(&mut v)?;
        [
            self.weighted_loss,
            self.weighted_own,
            self.owns,
            self.samples,
            self.stop,
            self.bad_grads,
        ] = v;
        Ok(())
    }
}
