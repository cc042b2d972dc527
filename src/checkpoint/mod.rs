//! Layer: checkpoint (a leaf: imports nothing from kiln).
//!
//! Checkpoints that survive crashes and world-size changes: `step-<8 digits>/` directories with
//! the model (one file per shard for fsdp), optimizer state, `state.json` and a manifest.

mod format;
mod retention;
mod store;

pub use format::{
    decode_f32, decode_opt, encode_f32, encode_opt, DataPosition, Layout, Manifest, OptState,
    OptimizerInfo, RngState, SchedulerInfo, State,
};
pub use retention::to_delete;
pub use store::{load, verify, CheckpointError, Entry, Loaded, Store};
