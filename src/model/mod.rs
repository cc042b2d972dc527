//! Layer: model (above `params`; imports only `params`, `config` and `rng`).
//!
//! Model families behind one `Model` trait. A family is a Burn `#[derive(Module)]` struct and a
//! `Family` impl (build, init, forward); kiln owns its parameters as flat buffers in the layout
//! it derives by visiting the module, so every strategy, optimizer and checkpoint works for every
//! model without knowing it. Outside this module only `Model`, `Compute` and the layout are
//! used; `registry` maps `model.kind` to a builder.

mod api;
pub(crate) mod backends;
pub mod cnn;
pub mod decode;
mod engine;
mod forward;
mod freeze;
pub mod gpt;
pub mod init;
pub mod llama;
pub mod lora;
pub mod mlp;
#[cfg(test)]
mod packed_tests;
pub mod portable;
mod registry;
mod sizing;

pub use api::decoder_on;
pub use api::{
    forward_backward, recomputed, regathered, resharded, stage_per_unit, Act, Batch, Compute,
    ComputeOn, ConfigMismatch, EvalOut, Family, Forward, GradScale, Input, MicroStep, Model,
    ModelError, SameNames, SharedModel, StagedEval, StepKey, Task, TokenDecoder, UnitParams,
    WeightAdapter,
};
pub(crate) use backends::for_each_backend;
pub use engine::{trains_up_to, FamilyModel};
pub use freeze::{freeze_names, frozen};
pub use registry::{build, install, registry, Builder, Registry};
