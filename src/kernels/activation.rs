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

/// The activation of a gated MLP's gate: SiLU (Llama's SwiGLU) or GELU's tanh approximation
/// (Gemma's GeGLU).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Silu,
    GeluTanh,
}

// act(g) u, and act(g) kept for the backward
multiversion! {
    fn glu_forward(g: &[f32], u: &[f32], tanh: bool, y: &mut [f32]) {
        if tanh {
            zip32(g, u, y, |v, u| v * sigmoid(2.0 * C * (v + A * v * v * v)) * u);
        } else {
            zip32(g, u, y, |v, u| v * sigmoid(v) * u);
        }
    }
}

// dg = dy u act'(g), du = dy act(g)
multiversion! {
    fn glu_backward(g: &[f32], u: &[f32], dy: &[f32], tanh: bool, dg: &mut [f32], du: &mut [f32]) {
        let n = dg.len();
        let (g, u, dy, du) = (&g[..n], &u[..n], &dy[..n], &mut du[..n]);
        for i in 0..n {
            let v = g[i];
            let (act, d) = if tanh {
                let s = sigmoid(2.0 * C * (v + A * v * v * v));
                let dz = 2.0 * C * (1.0 + 3.0 * A * v * v);
                (v * s, s + v * s * (1.0 - s) * dz)
            } else {
                let s = sigmoid(v);
                (v * s, s * (1.0 + v * (1.0 - s)))
            };
            dg[i] = dy[i] * u[i] * d;
            du[i] = dy[i] * act;
        }
    }
}

fn glu_values(g: &FlexTensor, u: &FlexTensor, gate: Gate) -> FlexTensor {
    let (gs, us) = (dense::values(g), dense::values(u));
    let mut y = dense::for_output(gs.len());
    dense::for_rows(&mut y, 1, |first, c| {
        let r = first..first + c.len();
        glu_forward(&gs[r.clone()], &us[r], gate == Gate::GeluTanh, c)
    });
    dense::tensor(y, &dense::dims(g))
}

#[derive(Debug)]
struct GluBackward;

/// What the backward keeps: the gate and up projections (contiguous) and the activation.
#[derive(Debug, Clone)]
struct GluSaved {
    g: FlexTensor,
    u: FlexTensor,
    gate: Gate,
}

impl Backward<Flex, 2> for GluBackward {
    type State = GluSaved;

    fn backward(self, ops: Ops<GluSaved, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let GluSaved { g, u, gate } = ops.state;
        let (gs, us, dys) = (dense::values(&g), dense::values(&u), dense::values(&dy));
        let mut dg = dense::for_output(gs.len());
        let mut du = dense::for_output(gs.len());
        dense::for_rows2(&mut dg, 1, &mut du, 1, |first, gc, uc| {
            let r = first..first + gc.len();
            let tanh = gate == Gate::GeluTanh;
            glu_backward(&gs[r.clone()], &us[r.clone()], &dys[r], tanh, gc, uc)
        });
        let dims = dense::dims(&g);
        let [pg, pu] = ops.parents;
        if let Some(p) = pg {
            grads.register::<Flex>(p.id, dense::tensor(dg, &dims));
        }
        if let Some(p) = pu {
            grads.register::<Flex>(p.id, dense::tensor(du, &dims));
        }
    }
}

/// A gated MLP's inner activation `act(gate) * up` (SwiGLU, GeGLU) in one pass, forward and
/// backward, on flex in f32; `None` elsewhere or for tensors of different shapes (the caller
/// runs Burn's ops).
pub fn glu<B: Backend, const D: usize>(
    gate: Tensor<B, D>,
    up: Tensor<B, D>,
    act: Gate,
) -> Option<Tensor<B, D>> {
    if gate.dims() != up.dims() {
        return None;
    }
    match route::route([gate, up]).ok()? {
        Routes::Autodiff([g, u]) => {
            let gc = dense::contiguous(g.primitive.clone());
            let uc = dense::contiguous(u.primitive.clone());
            let y = glu_values(&gc, &uc, act);
            let y = match GluBackward
                .prepare::<NoCheckpointing>([g.node.clone(), u.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(
                    GluSaved {
                        g: gc,
                        u: uc,
                        gate: act,
                    },
                    y,
                ),
                OpsKind::UnTracked(prep) => prep.finish(y),
            };
            route::back::<B, _, D>(y)
        }
        Routes::Plain([g, u]) => {
            let y = glu_values(&dense::contiguous(g), &dense::contiguous(u), act);
            route::back::<B, _, D>(y)
        }
    }
}
