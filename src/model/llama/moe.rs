//! Mixtral's sparse mixture of experts, as transformers 5 computes `MixtralSparseMoeBlock`: a
//! router (`gate`, no bias) gives each token a softmax over the experts, the top
//! `experts_per_token` of them run (their probabilities renormalised to sum to 1 weigh their
//! outputs), each a SwiGLU MLP `w2(silu(w1(x)) * w3(x))`. The names are those transformers
//! 5.25 saves (`model.layers.0.block_sparse_moe.experts.3.w1.weight`, `...gate.weight`): it
//! computes with the experts fused in two tensors (`mlp.experts.gate_up_proj`) but converts
//! them back to Mixtral's original per-expert names in `save_pretrained`, and reads those.
//!
//! The load-balancing loss (transformers' `load_balancing_loss_func`, Switch Transformer's):
//! `experts * sum_e f_e * p_e`, `f_e` the fraction of routing choices that went to expert e and
//! `p_e` its mean routing probability, both over every layer's tokens but a row's padding
//! (transformers leaves out what `attention_mask` masks). kiln computes it per
//! sample (each row's tokens) and the engine averages the samples weighted by their targets, as
//! their tokens' losses are, so that a batch split across ranks or micro-steps trains to the
//! same parameters as the whole batch (transformers computes it over the whole micro-batch of
//! each rank: the same for one sequence). Its statistics travel from
//! block to block beside the hidden state (`Act::WithStats`), so the staged engine, fsdp and
//! activation checkpointing carry its gradient like any activation's.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};

use super::Llama;
use crate::model::gpt::dense;

/// `[model]`'s mixture of experts (kind `mixtral`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    pub experts: usize,
    pub top_k: usize,
    /// `router_aux_loss_coef`.
    pub aux_coef: f64,
}

/// One expert: `w2(silu(w1(x)) * w3(x))`.
#[derive(Module, Debug)]
pub struct Expert<B: Backend> {
    pub w1: Linear<B>,
    pub w2: Linear<B>,
    pub w3: Linear<B>,
}

/// One block's mixture: the router and the experts.
#[derive(Module, Debug)]
pub struct SparseMoe<B: Backend> {
    pub gate: Linear<B>,
    pub experts: Vec<Expert<B>>,
}

/// A block's router statistics, per sample: `[n, 3, experts]`, row 0 the sum over the sample's
/// tokens of each expert's routing probability (with its graph), row 1 how many times its
/// tokens chose each expert, row 2 (every column) how many tokens it has (constants); padding
/// is not a token of the sample's. Summed over the blocks.
pub type RouterStats<B> = Tensor<B, 3>;

impl Llama {
    /// The experts' output for the normed `hx` `[n, t, dim]`, and the router's statistics
    /// over the positions that are not `padding` (`[n * t]`; `None`: none is).
    pub(super) fn experts<B: Backend>(
        &self,
        moe: &SparseMoe<B>,
        hx: Tensor<B, 3>,
        fused: bool,
        padding: Option<&[bool]>,
    ) -> (Tensor<B, 3>, RouterStats<B>) {
        let [n, t, d] = hx.dims();
        let ne = moe.experts.len();
        let k = self.moe.map_or(1, |m| m.top_k);
        let rows = n * t;
        let device = hx.device();
        let x = hx.reshape([rows, d]);
        let probs = softmax(dense(&moe.gate, x.clone(), None, fused), 1);
        // the choices (no gradient flows through them): each row's k most probable experts, the
        // most probable first (torch.topk; a tie goes to the lower index)
        let host: Vec<f32> = probs
            .clone()
            .into_data()
            .convert::<f32>()
            .into_vec()
            .unwrap_or_default();
        let mut chosen = Vec::with_capacity(rows * k);
        // each expert's routing slots (row * k + rank among the row's choices), in row order
        let mut slots: Vec<Vec<usize>> = vec![Vec::new(); ne];
        let mut counts = vec![0f32; n * ne];
        let mut tokens = vec![0f32; n * ne];
        let pad = |r: usize| padding.is_some_and(|p| p[r]);
        for r in 0..rows {
            let row = &host[r * ne..(r + 1) * ne];
            let mut order: Vec<usize> = (0..ne).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            for &ex in &order[..k] {
                slots[ex].push(chosen.len());
                chosen.push(ex);
                if !pad(r) {
                    counts[(r / t) * ne + ex] += 1.0;
                }
            }
            if !pad(r) {
                for c in &mut tokens[(r / t) * ne..(r / t + 1) * ne] {
                    *c += 1.0;
                }
            }
        }
        let ints = |v: Vec<i64>| {
            let len = v.len();
            Tensor::<B, 1, Int>::from_data(TensorData::new(v, [len]), &device)
        };
        let at: Vec<i64> = chosen
            .iter()
            .enumerate()
            .map(|(j, &ex)| ((j / k) * ne + ex) as i64)
            .collect();
        let w = probs.clone().reshape([rows * ne]).select(0, ints(at));
        let w = w.reshape([rows, k]);
        let w = w.clone() / w.sum_dim(1);
        // each expert on the tokens that chose it, its outputs stacked, then put back in order
        let mut outs = Vec::new();
        let mut place = vec![0i64; rows * k];
        let mut next = 0i64;
        // an expert no token chose still takes part, times 0: its gradient is zeros
        let mut idle: Option<Tensor<B, 1>> = None;
        for (e, slots) in moe.experts.iter().zip(slots) {
            if slots.is_empty() {
                let zero = [&e.w1, &e.w2, &e.w3]
                    .into_iter()
                    .map(|l| l.weight.val().sum().mul_scalar(0.0))
                    .reduce(|a, b| a + b);
                idle = match (idle, zero) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                continue;
            }
            let tokens = ints(slots.iter().map(|&j| (j / k) as i64).collect());
            let xe = x.clone().select(0, tokens);
            let g = dense(&e.w1, xe.clone(), None, fused);
            let h = self.gated(g, dense(&e.w3, xe, None, fused), fused);
            outs.push(dense(&e.w2, h, None, fused));
            for j in slots {
                place[j] = next;
                next += 1;
            }
        }
        let each = Tensor::cat(outs, 0)
            .select(0, ints(place))
            .reshape([rows, k, d]);
        let y = (each * w.reshape([rows, k, 1]))
            .sum_dim(1)
            .reshape([n, t, d]);
        let y = match idle {
            Some(z) => y + z.reshape([1, 1, 1]),
            None => y,
        };
        let probs = match padding {
            Some(p) => {
                let keep: Vec<f32> = p.iter().map(|&pad| if pad { 0.0 } else { 1.0 }).collect();
                probs * Tensor::<B, 2>::from_data(TensorData::new(keep, [rows, 1]), &device)
            }
            None => probs,
        };
        // (the statistics in f32 whatever the compute dtype: the probabilities' sums cast to
        // it, the counts made in it, as a block's counts pass bf16's exact integers (256) from
        // 128 tokens of 2 choices, and every layer's f16's range)
        let p = probs.reshape([n, t, ne]).sum_dim(1).cast(FloatDType::F32);
        let constant = |v: Vec<f32>| {
            Tensor::<B, 3>::from_data(TensorData::new(v, [n, 1, ne]), (&device, DType::F32))
        };
        (
            y,
            Tensor::cat(vec![p, constant(counts), constant(tokens)], 1),
        )
    }

    /// Each sample's load-balancing loss (times `router_aux_loss_coef`) `[n]`, in f32, from
    /// the router statistics summed over every block (the engine weighs the samples as it
    /// weighs their tokens' losses).
    pub(super) fn aux_loss<B: Backend>(&self, stats: Tensor<B, 3>) -> Tensor<B, 1> {
        let [n, _, ne] = stats.dims();
        let stats = stats.cast(FloatDType::F32);
        let coef = self.moe.map_or(0.0, |m| m.aux_coef);
        let p = stats.clone().slice([0..n, 0..1, 0..ne]);
        let c = stats.clone().slice([0..n, 1..2, 0..ne]).detach();
        // every layer's tokens of the sample (a row of nothing but padding has no loss)
        let lt = stats
            .slice([0..n, 2..3, 0..1])
            .detach()
            .reshape([n])
            .clamp_min(1.0);
        (p * c).sum_dim(2).reshape([n]).mul_scalar(coef * ne as f64) / (lt.clone() * lt)
    }
}
