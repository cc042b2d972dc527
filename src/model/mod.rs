//! Model families. Parameters live in one flat `f32` buffer described by a layout, so strategies
//! can all-reduce, shard and checkpoint them without knowing the model; each step the model is
//! assembled from that buffer as Burn tensors, run forward and backward, and its gradients are
//! flattened back in the same layout.

pub mod mlp;
mod param;

pub use mlp::{LayerTensors, Mlp};
pub use param::*;
