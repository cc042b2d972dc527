//! Training: the step loop, the optimizers, LR schedules and the per-micro-step math.

pub mod device_optim;
pub mod optim;
pub mod schedule;
pub mod step;
mod trainer;

pub use trainer::{train, MetricLine, Outcome, RankSink, TrainError, TrainEvent, TrainInput};
