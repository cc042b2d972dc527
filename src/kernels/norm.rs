//! LayerNorm over the last dimension in one pass per row for the mean and variance, with its
//! backward in one pass too (torch's formula: dx = rstd (g - mean(g) - x̂ mean(g x̂)) with
//! g = dy γ), saving only each row's mean and 1/σ besides the input.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use super::dense;
use super::math::multiversion;
use super::math::{dot, sum};
use super::reshard::Kept;
use super::route::{self, AdTensor, Routes};

// each row's mean and 1/σ (`stats`: two values per row) and the normalised, scaled and shifted
// rows `y`
multiversion! {
    fn forward_rows(
        x: &[f32],
        gamma: &[f32],
        beta: Option<&[f32]>,
        eps: f32,
        y: &mut [f32],
        stats: &mut [f32],
    ) {
        let d = gamma.len();
        for ((xr, yr), st) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(stats.chunks_exact_mut(2)) {
            let mean = sum(xr) / d as f32;
            for (o, &v) in yr.iter_mut().zip(xr) {
                *o = v - mean;
            }
            let var = dot(yr, yr) / d as f32;
            let rstd = 1.0 / (var + eps).sqrt();
            match beta {
                Some(b) => {
                    for ((o, &g), &b) in yr.iter_mut().zip(gamma).zip(b) {
                        *o = *o * rstd * g + b;
                    }
                }
                None => {
                    for (o, &g) in yr.iter_mut().zip(gamma) {
                        *o = *o * rstd * g;
                    }
                }
            }
            st[0] = mean;
            st[1] = rstd;
        }
    }
}

// the input gradient of rows `x` (their `stats`) for output gradient `dy` into `dx`, and the
// rows' sums of dy x̂ (γ's gradient) and dy (β's) added into `partial` (`[2, d]`)
multiversion! {
    fn backward_rows(
        x: &[f32],
        dy: &[f32],
        stats: &[f32],
        gamma: &[f32],
        dx: &mut [f32],
        partial: &mut [f32],
    ) {
        let d = gamma.len();
        let (dgamma, dbeta) = partial.split_at_mut(d);
        let inv_d = 1.0 / d as f32;
        for (((xr, gr), st), dxr) in x
            .chunks_exact(d)
            .zip(dy.chunks_exact(d))
            .zip(stats.chunks_exact(2))
            .zip(dx.chunks_exact_mut(d))
        {
            let (mean, rstd) = (st[0], st[1]);
            // dx holds x̂ first, then the gradient
            for (h, &v) in dxr.iter_mut().zip(xr) {
                *h = (v - mean) * rstd;
            }
            let mut a = [0f32; 16];
            let mut b = [0f32; 16];
            let n16 = d / 16 * 16;
            for j in (0..n16).step_by(16) {
                for l in 0..16 {
                    let g = gr[j + l] * gamma[j + l];
                    a[l] += g;
                    b[l] += g * dxr[j + l];
                }
            }
            let (mut sa, mut sb) = (a.iter().sum::<f32>(), b.iter().sum::<f32>());
            for j in n16..d {
                let g = gr[j] * gamma[j];
                sa += g;
                sb += g * dxr[j];
            }
            let (ma, mb) = (sa * inv_d, sb * inv_d);
            for j in 0..d {
                let h = dxr[j];
                dgamma[j] += gr[j] * h;
                dbeta[j] += gr[j];
                dxr[j] = rstd * (gr[j] * gamma[j] - ma - h * mb);
            }
        }
    }
}

/// The forward on flex tensors: `y` and the rows' statistics.
fn forward(x: &FlexTensor, gamma: &[f32], beta: Option<&[f32]>, eps: f64) -> (Vec<f32>, Vec<f32>) {
    let xs = dense::values(x);
    let d = gamma.len();
    let rows = xs.len() / d.max(1);
    let mut y = dense::for_output(xs.len());
    let mut stats = dense::for_output(2 * rows);
    dense::for_rows2(&mut y, d, &mut stats, 2, |first, yc, sc| {
        let x = &xs[first * d..first * d + yc.len()];
        forward_rows(x, gamma, beta, eps as f32, yc, sc);
    });
    (y, stats)
}

/// What the backward keeps: the input (contiguous), γ (or its unit's slot while resharded) and
/// the statistics.
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    gamma: Kept,
    stats: Arc<Vec<f32>>,
}

#[derive(Debug)]
struct LayerNormBackward<const N: usize>;

impl<const N: usize> Backward<Flex, N> for LayerNormBackward<N> {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let s = ops.state;
        let gamma = dense::contiguous(s.gamma.get());
        let (xs, gamma, dys) = (
            dense::values(&s.x),
            dense::values(&gamma),
            dense::values(&dy),
        );
        let d = gamma.len();
        let mut dx = dense::for_output(xs.len());
        let stats = &s.stats;
        let partial = dense::sum_rows_writing(&mut dx, d, 2 * d, |first, n, dxc, partial| {
            let (a, b) = (first * d, (first + n) * d);
            let st = &stats[2 * first..2 * (first + n)];
            backward_rows(&xs[a..b], &dys[a..b], st, gamma, dxc, partial);
        });
        let shape = dense::dims(&s.x);
        let [px, pg, pb] = parents3(&ops.parents);
        if let Some(p) = px {
            grads.register::<Flex>(p.id, dense::tensor(dx, &shape));
        }
        if let Some(p) = pg {
            grads.register::<Flex>(p.id, dense::tensor(partial[..d].to_vec(), &[d]));
        }
        if let Some(p) = pb {
            grads.register::<Flex>(p.id, dense::tensor(partial[d..].to_vec(), &[d]));
        }
    }
}

/// The parents of an op with 2 or 3 of them as three options.
fn parents3<T: Clone, const N: usize>(p: &[Option<T>; N]) -> [Option<T>; 3] {
    [0, 1, 2].map(|i| p.get(i).cloned().flatten())
}

/// The op with autodiff: parents x, γ (and β).
fn autodiff(x: AdTensor, gamma: AdTensor, beta: Option<AdTensor>, eps: f64) -> AdTensor {
    let xc = dense::contiguous(x.primitive.clone());
    let g = dense::contiguous(gamma.primitive.clone());
    let b = beta
        .as_ref()
        .map(|b| dense::contiguous(b.primitive.clone()));
    let (y, stats) = forward(&xc, dense::values(&g), b.as_ref().map(dense::values), eps);
    let out = dense::tensor(y, &dense::dims(&xc));
    let saved = || Saved {
        x: xc.clone(),
        gamma: Kept::of(&g),
        stats: Arc::new(stats.clone()),
    };
    match beta {
        Some(beta) => {
            let nodes = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
            match LayerNormBackward::<3>
                .prepare::<NoCheckpointing>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(saved(), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
        None => {
            let nodes = [x.node.clone(), gamma.node.clone()];
            match LayerNormBackward::<2>
                .prepare::<NoCheckpointing>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(saved(), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            }
        }
    }
}

/// LayerNorm of `x` over its last dimension with scale `gamma` and shift `beta` (Burn's
/// `LayerNorm::forward` with epsilon `eps`): fused on flex in f32, Burn's op elsewhere.
pub fn layer_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
) -> Tensor<B, D> {
    if let Some(y) = fused(x.clone(), gamma.clone(), beta.clone(), eps) {
        return y;
    }
    Tensor::from_primitive(TensorPrimitive::Float(B::layer_norm(
        x.into_primitive().tensor(),
        gamma.into_primitive().tensor(),
        beta.map(|b| b.into_primitive().tensor()),
        eps,
    )))
}

fn fused<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
) -> Option<Tensor<B, D>> {
    let x = route::route1(x).ok()?;
    let gamma = route::route1(gamma).ok()?;
    let beta = match beta {
        Some(b) => Some(route::route1(b).ok()?),
        None => None,
    };
    match (x, gamma, beta) {
        (Routes::Autodiff([x]), Routes::Autodiff([g]), b) => {
            let b = match b {
                Some(Routes::Autodiff([b])) => Some(b),
                None => None,
                Some(Routes::Plain(_)) => return None,
            };
            route::back::<B, _, D>(autodiff(x, g, b, eps))
        }
        (Routes::Plain([x]), Routes::Plain([g]), b) => {
            let b = match b {
                Some(Routes::Plain([b])) => Some(dense::contiguous(b)),
                None => None,
                Some(Routes::Autodiff(_)) => return None,
            };
            let xc = dense::contiguous(x);
            let g = dense::contiguous(g);
            let (y, _) = forward(&xc, dense::values(&g), b.as_ref().map(dense::values), eps);
            route::back::<B, _, D>(dense::tensor(y, &dense::dims(&xc)))
        }
        _ => None,
    }
}
