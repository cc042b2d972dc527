//! The loss a micro-step takes the backward of (`cross_entropy`) and the evaluation's score of
//! each sample (`score`), both on the device, in f32.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};

use super::super::api::{EvalOut, ModelError, Task};
use super::install::to_vec;
use crate::kernels::IGNORE;

/// `targets` as a `[rows, 1]` index tensor on `device`.
fn target_index<B: Backend>(targets: &[u32], device: &B::Device) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
    Tensor::from_data(TensorData::new(ids, [targets.len(), 1]), device)
}

/// Adds each sample's loss and correctness of `logits` (`[rows, classes]`) against `targets`
/// to `out`: a sample's result is the mean over its targets (one for classification), or with
/// `by_tokens` (rows packed with documents) the sum over its targets that are not `IGNORE`,
/// with their count in `out.targets` (the evaluation is then a mean over tokens). Each
/// row's loss (its log-probability of its target, in f32) and whether its argmax is the target
/// are taken on the device; only a value per row comes back, so nothing on the host grows with
/// the number of classes (GPT-2's 50,257).
pub(super) fn score<B: Backend>(
    task: &Task,
    logits: Tensor<B, 2>,
    targets: &[u32],
    by_tokens: bool,
    out: &mut EvalOut,
) -> Result<(), ModelError> {
    let per_sample = task.targets_per_sample();
    let rows = targets.len();
    let logits = logits.cast(FloatDType::F32);
    let idx = if targets.contains(&IGNORE) {
        ignored::<B>(targets, &logits.device()).0
    } else {
        target_index::<B>(targets, &logits.device())
    };
    let picked = log_softmax(logits.clone(), 1)
        .gather(1, idx.clone())
        .reshape([rows]);
    // (a float, not a bool tensor: CubeCL cannot read bools back)
    let right = logits
        .argmax(1)
        .equal(idx)
        .float()
        .cast(FloatDType::F32)
        .reshape([rows]);
    let (picked, right) = (to_vec(picked)?, to_vec(right)?);
    let (mut loss, mut hits, mut counted) = (0.0, 0.0, 0usize);
    for (i, (p, r)) in picked.iter().zip(&right).enumerate() {
        if targets[i] != IGNORE {
            loss -= f64::from(*p);
            hits += f64::from(*r);
            counted += 1;
        }
        if (i + 1) % per_sample == 0 {
            if by_tokens {
                out.losses.push(loss);
                out.correct.push(hits);
                out.targets.push(counted as u64);
            } else {
                out.losses.push(loss / per_sample as f64);
                out.correct.push(hits / per_sample as f64);
            }
            (loss, hits, counted) = (0.0, 0.0, 0);
        }
    }
    Ok(())
}

/// The mean cross-entropy of `logits` for the class `targets` of their rows, as torch's
/// `cross_entropy` computes it, in f32 whatever the compute dtype (as under torch's autocast):
/// each row's log-probability of its target is picked on the device (no one-hot rows: nothing
/// of the size rows x classes is made on the host).
/// With `fused`, on flex in f32 it is one pass per row (`kernels::cross_entropy`).
pub(super) fn cross_entropy<B: Backend>(
    logits: Tensor<B, 2>,
    targets: &[u32],
    fused: bool,
) -> Tensor<B, 1> {
    let logits = logits.cast(FloatDType::F32);
    if fused {
        if let Some(loss) = crate::kernels::cross_entropy(logits.clone(), targets) {
            return loss;
        }
    }
    let device = logits.device();
    if !targets.contains(&IGNORE) {
        let idx = target_index::<B>(targets, &device);
        return log_softmax(logits, 1)
            .gather(1, idx)
            .sum()
            .neg()
            .div_scalar(targets.len() as f64);
    }
    // targets without a loss (padding, a document's last token): picked at class 0, then
    // multiplied by 0; the mean is over the others
    let (idx, mask) = ignored(targets, &device);
    let counted = targets.iter().filter(|&&t| t != IGNORE).count().max(1);
    (log_softmax(logits, 1).gather(1, idx) * mask)
        .sum()
        .neg()
        .div_scalar(counted as f64)
}

/// `targets` as a `[rows, 1]` index tensor with `IGNORE` at class 0, and the `[rows, 1]` mask
/// that is 0 there and 1 elsewhere.
fn ignored<B: Backend>(targets: &[u32], device: &B::Device) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
    let rows = targets.len();
    let ids: Vec<i64> = targets
        .iter()
        .map(|&t| if t == IGNORE { 0 } else { i64::from(t) })
        .collect();
    let mask: Vec<f32> = targets
        .iter()
        .map(|&t| if t == IGNORE { 0.0 } else { 1.0 })
        .collect();
    (
        Tensor::from_data(TensorData::new(ids, [rows, 1]), device),
        Tensor::from_data(TensorData::new(mask, [rows, 1]), device),
    )
}

/// A model's own loss from each sample's `[n]` (a mixture of experts' load balancing), in f32:
/// the samples weighted by their targets (`targets`, row by row), as the cross-entropy weighs
/// their tokens, so that the step's loss is the same however its rows are split over ranks
/// and micro-steps.
pub(super) fn own_loss<B: Backend>(per_sample: Tensor<B, 1>, targets: &[u32]) -> Tensor<B, 1> {
    let per_sample = per_sample.cast(FloatDType::F32);
    let n = per_sample.dims()[0].max(1);
    let t = targets.len() / n;
    let counts: Vec<f32> = (0..n)
        .map(|r| {
            targets[r * t..(r + 1) * t]
                .iter()
                .filter(|&&x| x != IGNORE)
                .count() as f32
        })
        .collect();
    let total: f32 = counts.iter().sum();
    let w: Vec<f32> = counts.iter().map(|c| c / total.max(1.0)).collect();
    let w = Tensor::<B, 1>::from_data(TensorData::new(w, [n]), &per_sample.device())
        .cast(FloatDType::F32);
    (per_sample * w).sum()
}
