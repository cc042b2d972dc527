//! Layer: train (above strategy, model, data and checkpoint).
//!
//! The step loop of one rank: micro-batches from the sampler, accumulation, the strategy's
//! synchronisation and update, the LR schedule, exact evaluation, checkpoints and metrics events.

mod eval;
mod events;
mod loader;
mod placement;
pub mod preempt;
mod save;
mod scaler;
pub mod schedule;
mod start;
mod step;
mod timed;
pub mod timing;
mod totals;
mod trainer;
mod watch;

pub use eval::evaluate_like_run;
pub use events::{
    EvalMetrics, EvalSums, MetricLine, Outcome, RankSink, SharedInit, TrainError, TrainEvent,
    TrainInput,
};
pub use scaler::LossScaler;
pub use timed::Timed;
pub use timing::{wait_hook, Clock, Phase, Span, Totals};
pub use trainer::train;
