//! RMSNorm over the last dimension, `x / sqrt(mean(x²) + eps) * (offset + weight)` (offset 0:
//! Llama's; 1: Gemma's `1 + weight`), in one pass per row forward and one backward (dx = r (g -
//! x̂ mean(g x̂)) with g = dy (offset + w), x̂ = x r), saving only each row's 1/rms besides the
//! input.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use super::dense;
use super::math::{dot, multiversion};
use super::reshard::Kept;
use super::route::{self, AdTensor, Routes};

// each row's 1/rms (`rstd`, one value per row) and the normalised, scaled rows `y`
multiversion! {
    fn forward_rows(x: &[f32], w: &[f32], offset: f32, eps: f32, y: &mut [f32], rstd: &mut [f32]) {
        let d = w.len();
        for ((xr, yr), r) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(rstd.iter_mut()) {
            let ms = dot(xr, xr) / d as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                *o = v * inv * (offset + g);
            }
            *r = inv;
        }
    }
}

// the input gradient of rows `x` (their `rstd`) for output gradient `dy` into `dx`, and the
// rows' sums of dy x̂ (the weight's gradient) added into `dw`
multiversion! {
    fn backward_rows(
        x: &[f32],
        dy: &[f32],
        rstd: &[f32],
        w: &[f32],
        offset: f32,
        dx: &mut [f32],
        dw: &mut [f32],
    ) {
        let d = w.len();
        let inv_d = 1.0 / d as f32;
        for (((xr, gr), &r), dxr) in x
            .chunks_exact(d)
            .zip(dy.chunks_exact(d))
            .zip(rstd)
            .zip(dx.chunks_exact_mut(d))
        {
            // dx holds x̂ first, then the gradient
            for (h, &v) in dxr.iter_mut().zip(xr) {
                *h = v * r;
            }
            let mut acc = [0f32; 16];
            let n16 = d / 16 * 16;
            for j in (0..n16).step_by(16) {
                for l in 0..16 {
                    acc[l] += gr[j + l] * (offset + w[j + l]) * dxr[j + l];
                }
            }
            let mut s = acc.iter().sum::<f32>();
            for j in n16..d {
                s += gr[j] * (offset + w[j]) * dxr[j];
            }
            let m = s * inv_d;
            for j in 0..d {
                let h = dxr[j];
                dw[j] += gr[j] * h;
                dxr[j] = r * (gr[j] * (offset + w[j]) - h * m);
            }
        }
    }
}

/// The forward on a contiguous `x`: `y` and each row's 1/rms.
fn forward(x: &FlexTensor, w: &[f32], offset: f32, eps: f64) -> (Vec<f32>, Vec<f32>) {
    let xs = dense::values(x);
    let d = w.len();
    let rows = xs.len() / d.max(1);
    let mut y = dense::for_output(xs.len());
    let mut rstd = dense::for_output(rows);
    dense::for_rows2(&mut y, d, &mut rstd, 1, |first, yc, rc| {
        let x = &xs[first * d..first * d + yc.len()];
        forward_rows(x, w, offset, eps as f32, yc, rc);
    });
    (y, rstd)
}

/// What the backward keeps: the input (contiguous), the weight (or its unit's slot while
/// resharded), the rows' 1/rms and the offset.
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    w: Kept,
    rstd: Arc<Vec<f32>>,
    offset: f32,
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Flex, 2> for RmsNormBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let s = ops.state;
        let w = dense::contiguous(s.w.get());
        let (xs, w, dys) = (dense::values(&s.x), dense::values(&w), dense::values(&dy));
        let d = w.len();
        let mut dx = dense::for_output(xs.len());
        let (rstd, offset) = (&s.rstd, s.offset);
        let dw = dense::sum_rows_writing(&mut dx, d, d, |first, n, dxc, partial| {
            let (a, b) = (first * d, (first + n) * d);
            let r = &rstd[first..first + n];
            backward_rows(&xs[a..b], &dys[a..b], r, w, offset, dxc, partial);
        });
        let [px, pw] = ops.parents;
        if let Some(p) = px {
            grads.register::<Flex>(p.id, dense::tensor(dx, &dense::dims(&s.x)));
        }
        if let Some(p) = pw {
            grads.register::<Flex>(p.id, dense::tensor(dw, &[d]));
        }
    }
}

fn autodiff(x: AdTensor, w: AdTensor, offset: f32, eps: f64) -> AdTensor {
    let xc = dense::contiguous(x.primitive.clone());
    let wc = dense::contiguous(w.primitive.clone());
    let (y, rstd) = forward(&xc, dense::values(&wc), offset, eps);
    let out = dense::tensor(y, &dense::dims(&xc));
    match RmsNormBackward
        .prepare::<NoCheckpointing>([x.node.clone(), w.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let saved = Saved {
                x: xc,
                w: Kept::of(&wc),
                rstd: Arc::new(rstd),
                offset,
            };
            prep.finish(saved, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

/// RMSNorm of `x` over its last dimension with weight `w` and epsilon `eps`: `x / sqrt(mean(x²)
/// + eps) * (offset + w)` (Burn's `RmsNorm::forward` with offset 0; Gemma's with 1) in one pass
/// on flex in f32; `None` elsewhere (the caller runs Burn's ops).
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 1>,
    offset: f32,
    eps: f64,
) -> Option<Tensor<B, D>> {
    if x.dims()[D - 1] != w.dims()[0] {
        return None;
    }
    match (route::route1(x).ok()?, route::route1(w).ok()?) {
        (Routes::Autodiff([x]), Routes::Autodiff([w])) => {
            route::back::<B, _, D>(autodiff(x, w, offset, eps))
        }
        (Routes::Plain([x]), Routes::Plain([w])) => {
            let xc = dense::contiguous(x);
            let wc = dense::contiguous(w);
            let (y, _) = forward(&xc, dense::values(&wc), offset, eps);
            route::back::<B, _, D>(dense::tensor(y, &dense::dims(&xc)))
        }
        _ => None,
    }
}
