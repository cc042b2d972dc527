//! Collective communication between ranks: the `Collective` trait and its implementations
//! (`local`: threads in one process, shared memory). Every op is numbered per rank and carries its
//! name, so a hang becomes an error that says which rank never arrived and where it was last seen.

mod api;
mod device;
mod local;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod node;
pub mod tcp;

pub use api::*;
#[cfg(test)]
pub(crate) use device::emulated;
pub use device::{
    device_error, DevDType, DeviceFlat, DeviceOps, DeviceTensor, Grads, RawBuf, RawFn,
};
pub use local::{LocalGroup, LocalRank};
