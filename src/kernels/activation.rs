//! GELU, exact (x Φ(x)) and tanh-approximated (GPT-2's `gelu_new`), vectorized with the
//! polynomial erfc and exp of `math` instead of one `libm` call per value, forward and backward.

use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use super::dense;
use super::math::{exp, map32, multiversion, normal_cdf, sigmoid, zip32, INV_SQRT_2PI};
use super::route::{self, AdTensor, Routes};

/// sqrt(2 / pi), the tanh approximation's scale.
const C: f32 = 0.797_884_6;
const A: f32 = 0.044_715;

multiversion! {
    fn forward_exact(x: &[f32], y: &mut [f32]) {
        map32(x, y, |v| v * normal_cdf(v));
    }
}

// the forward that keeps Φ(x) for the backward (which then needs one exp, not Φ again)
multiversion! {
    fn forward_exact_keep(x: &[f32], y: &mut [f32], cdf: &mut [f32]) {
        map32(x, cdf, normal_cdf);
        zip32(x, cdf, y, |v, c| v * c);
    }
}

multiversion! {
    fn backward_exact_kept(x: &[f32], cdf: &[f32], dy: &[f32], dx: &mut [f32]) {
        let n = dx.len();
        let (x, cdf, dy) = (&x[..n], &cdf[..n], &dy[..n]);
        for i in 0..n {
            let v = x[i];
            dx[i] = dy[i] * (cdf[i] + v * exp(-0.5 * v * v) * INV_SQRT_2PI);
        }
    }
}

// 0.5 x (1 + tanh(u)) = x σ(2u), u = C (x + A x^3): no cancellation in either tail
multiversion! {
    fn forward_tanh(x: &[f32], y: &mut [f32]) {
        map32(x, y, |v| v * sigmoid(2.0 * C * (v + A * v * v * v)));
    }
}

multiversion! {
    fn backward_tanh(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        zip32(x, dy, dx, |v, g| {
            let s = sigmoid(2.0 * C * (v + A * v * v * v));
            let du = 2.0 * C * (1.0 + 3.0 * A * v * v);
            g * (s + v * s * (1.0 - s) * du)
        });
    }
}

/// `f` over `x` into a new buffer, chunks on the rank's threads.
fn map(x: &[f32], f: fn(&[f32], &mut [f32])) -> Vec<f32> {
    let mut y = dense::for_output(x.len());
    dense::for_rows(&mut y, 1, |first, c| f(&x[first..first + c.len()], c));
    y
}

fn forward(x: &FlexTensor, tanh: bool) -> FlexTensor {
    let f = if tanh { forward_tanh } else { forward_exact };
    dense::tensor(map(dense::values(x), f), &dense::dims(x))
}

#[derive(Debug)]
struct GeluBackward;

/// What the backward keeps: the input (contiguous), Φ of it for the exact form (none: the tanh
/// form).
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    cdf: Option<FlexTensor>,
}

impl Backward<Flex, 1> for GeluBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let Saved { x, cdf } = ops.state;
        let [parent] = ops.parents;
        if let Some(p) = parent {
            let (xs, dys) = (dense::values(&x), dense::values(&dy));
            let cdf = cdf.as_ref().map(dense::values);
            let mut dx = dense::for_output(xs.len());
            dense::for_rows(&mut dx, 1, |first, c| {
                let r = first..first + c.len();
                match cdf {
                    Some(cdf) => backward_exact_kept(&xs[r.clone()], &cdf[r.clone()], &dys[r], c),
                    None => backward_tanh(&xs[r.clone()], &dys[r], c),
                }
            });
            grads.register::<Flex>(p.id, dense::tensor(dx, &dense::dims(&x)));
        }
    }
}

fn autodiff(x: AdTensor, tanh: bool) -> AdTensor {
    let xc = dense::contiguous(x.primitive.clone());
    match GeluBackward
        .prepare::<NoCheckpointing>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) if !tanh => {
            let xs = dense::values(&xc);
            let mut y = dense::for_output(xs.len());
            let mut cdf = dense::for_output(xs.len());
            dense::for_rows2(&mut y, 1, &mut cdf, 1, |first, yc, cc| {
                forward_exact_keep(&xs[first..first + yc.len()], yc, cc)
            });
            let dims = dense::dims(&xc);
            let saved = Saved {
                x: xc,
                cdf: Some(dense::tensor(cdf, &dims)),
            };
            prep.finish(saved, dense::tensor(y, &dims))
        }
        OpsKind::Tracked(prep) => {
            let out = forward(&xc, tanh);
            prep.finish(Saved { x: xc, cdf: None }, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(&xc, tanh)),
    }
}

/// GELU of `x`: exact (Burn's `gelu`), or with `tanh` the tanh approximation (PyTorch's
/// `approximate="tanh"`): vectorized on flex in f32, Burn's ops elsewhere.
pub fn gelu<B: Backend, const D: usize>(x: Tensor<B, D>, tanh: bool) -> Tensor<B, D> {
    let fused = match route::route1(x.clone()) {
        Ok(Routes::Autodiff([a])) => route::back::<B, _, D>(autodiff(a, tanh)),
        Ok(Routes::Plain([f])) => route::back::<B, _, D>(forward(&dense::contiguous(f), tanh)),
        Err(_) => None,
    };
    match fused {
        Some(y) => y,
        None if tanh => gelu_tanh_ops(x),
        None => activation::gelu(x),
    }
}

/// GELU's tanh approximation in Burn's ops, `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715
/// x^3)))` (GPT-2's `gelu_new`).
pub fn gelu_tanh_ops<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let inner = (x.clone() + x.clone().powi_scalar(3).mul_scalar(0.044715)).mul_scalar(c);
    x.mul_scalar(0.5) * inner.tanh().add_scalar(1.0)
}
