//! Fast CPU kernels for a transformer's hot path, as Burn custom autodiff ops on flex (forward
//! and backward), so that a model stays a Burn module and gets them by calling these functions
//! instead of Burn's ops: causal attention straight from the q/k/v projection, LayerNorm, GELU
//! (exact and tanh), softmax cross-entropy and linear layers (transposed weights read through
//! gemm's strides, or copied to rows where gemm would gather them value by value, the residual
//! added in the same gemm). Each function runs its kernel when the
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
mod embedding;
mod linear;
mod loss;
pub(crate) mod math;
mod norm;
mod optim;
mod reshard;
mod rms_norm;
mod rope;
mod route;

pub use activation::{gelu, gelu_tanh_ops, glu, Gate};
pub use attention::{causal_attention, document_attention, grouped_attention, Heads, Starts};
pub use embedding::embedding;
pub use linear::linear;
pub use loss::{cross_entropy, IGNORE};
pub use norm::layer_norm;
pub use optim::{adam_update, add_into, all_finite, scale, sum_squares, AdamStep};
pub use reshard::{hollow, param_view, Resharded};
pub use rms_norm::rms_norm;
pub use rope::Rope;
pub use route::fused_on;

/// The instructions the kernels run with on this CPU: gemm's AVX-512 microkernels and kiln's
/// loops compiled for AVX-512, AVX2 + FMA, or the baseline.
pub fn instructions() -> &'static str {
    if math::has_avx512() {
        "AVX-512 (gemm's avx512f microkernels)"
    } else if math::has_avx2() {
        "AVX2 + FMA (gemm's fma microkernels)"
    } else {
        "baseline x86-64 / the target's"
    }
}

#[cfg(test)]
mod tests;
