//! Layer: params (bottom, above only the leaves `config`, `checkpoint` and `rng`).
//!
//! What every model, strategy and collective shares about parameters, written once: the flat
//! layout (each parameter's module path, shape and offset, and the model's units for fsdp), host
//! and device flat buffers, the optimizers (SGD, Adam, AdamW) and global-norm clipping. Nothing
//! here knows a model family, a strategy or a transport.

mod buffer;
mod device;
mod layout;
mod optim;
pub mod transfers;

pub use buffer::{
    all_finite, float_dtype, grads_to_host, master_upload, master_zeros, no_address, DevDType,
    DeviceFlat, DeviceTensor, Grads, RawBuf, RawFn,
};
pub use device::{BurnParams, DeviceParams};
pub use layout::{unit_of, ParamLayout, ParamSpec, UnitSpec};
pub use optim::{clip_and_step, clip_by_norm, clip_coef, sum_squares, Optimizer};
pub use transfers::{Moved, Transfers};

/// An optimizer's state as checkpoints store it (defined with the checkpoint format).
pub use crate::checkpoint::OptState;
