//! Layer: checkpoint (a leaf: imports nothing from kiln).
//!
//! Checkpoints that survive crashes and world-size changes: `step-<8 digits>/` directories with
//! the model as safetensors (one file per shard for fsdp), optimizer state, `state.json` and a manifest.

mod dir;
mod format;
mod retention;
pub mod tensors;
mod written;

pub use dir::{load, read_state, step_of, verify, CheckpointDir, CheckpointError, Entry, Loaded};
pub use format::{
    encode_files, DataPosition, DocumentsPosition, Layout, LossScaleState, Manifest, OptState,
    OptimizerInfo, RngState, SchedulerInfo, ShardUnit, SourcePosition, State, WatchState, FORMAT,
};
pub use retention::to_delete;
