//! Fast CPU kernels for a transformer's hot path, as Burn custom autodiff ops on flex (forward
//! and backward), so that a model stays a Burn module and gets them by calling these functions
//! instead of Burn's ops: causal attention straight from the q/k/v projection, LayerNorm, GELU
//! (exact and tanh), softmax cross-entropy and linear layers (transposed weights read through
//! gemm's strides, the residual added in the same gemm). Each function runs its kernel when the
//! backend is flex (with or without autodiff) and the tensors are f32, and Burn's ops (or
//! `None`, for the caller's own) everywhere else, so a model is written once for every backend.
//! `backend.fused = false` makes the models call Burn's ops directly, to compare.
//!
//! The loops are plain `f32` code compiled for AVX-512, for AVX2 + FMA and for the baseline,
//! chosen at run time (`math::multiversion!`); the matrix products are gemm's, which picks its
//! AVX-512 kernels where the CPU has them. Work is split over the rank's rayon threads in
//! chunks that depend on the shape only, so every sum is added in the same order whatever the
//! thread count.

mod activation;
mod attention;
mod dense;
mod linear;
mod loss;
pub(crate) mod math;
mod norm;
mod optim;
mod route;

pub use activation::{gelu, gelu_tanh_ops};
pub use attention::{causal_attention, document_attention, Starts};
pub use linear::linear;
pub use loss::{cross_entropy, IGNORE};
pub use norm::layer_norm;
pub use optim::{adam_update, add_into, all_finite, scale, sum_squares, AdamStep};
pub use route::fused_on;

#[cfg(test)]
mod tests;
