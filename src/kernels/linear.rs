//! A linear layer `y = x W (+ b) (+ r)` as one gemm over all rows of `x` (`[..., in]` taken as
//! `[rows, in]`), with an optional residual `r` added in the same pass (the gemm accumulates
//! into it). The weight is read through its strides, so a transposed view (the tied output
//! layer's `wte^T`) is not made contiguous first (`dense::gemm` copies such an operand to rows
//! where gemm would gather it value by value, a bounded size); the backward is two more gemms whose operands are
//! transposed the same way (dx = dy Wᵀ, dW = xᵀ dy) and a sum of dy's rows for the bias.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use super::dense::{self, Mat, MatMut};
use super::reshard::Kept;
use super::route::{self, AdTensor, Routes};

/// A 2-D tensor as a gemm operand (its strides as they are).
fn operand(w: &FlexTensor) -> Mat {
    let l = w.layout();
    let s = l.strides();
    Mat {
        ptr: w.storage::<f32>()[l.start_offset()..].as_ptr(),
        rs: s[0],
        cs: s[1],
    }
}

/// Whether `w` can be read as a gemm operand: 2-D, f32, with non-negative strides.
fn readable(w: &FlexTensor) -> bool {
    let l = w.layout();
    l.num_dims() == 2 && l.strides().iter().all(|&s| s >= 0)
}

/// `x W + b + r` on flex tensors (`x` contiguous `[rows, in]`).
fn forward(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    r: Option<&FlexTensor>,
) -> FlexTensor {
    let xd = dense::dims(x);
    let wd = dense::dims(w);
    let (i, o) = (wd[0], wd[1]);
    let rows = x.layout().num_elements() / i.max(1);
    let mut y = match (r, b) {
        (Some(r), _) => dense::values(r).to_vec(),
        (None, Some(b)) => dense::values(b).repeat(rows),
        (None, None) => dense::for_output(rows * o),
    };
    if let (Some(_), Some(b)) = (r, b) {
        let b = dense::values(b);
        for row in y.chunks_exact_mut(o) {
            for (v, &bb) in row.iter_mut().zip(b) {
                *v += bb;
            }
        }
    }
    // SAFETY: x is [rows, i] contiguous, w is [i, o] with its strides, y is [rows, o]
    unsafe {
        dense::gemm(
            dense::Product {
                m: rows,
                n: o,
                k: i,
                accumulate: r.is_some() || b.is_some(),
                scale: 1.0,
            },
            MatMut::rows(&mut y, o),
            Mat::rows(dense::values(x), i),
            operand(w),
            true,
        );
    }
    let mut dims = xd;
    if let Some(last) = dims.last_mut() {
        *last = o;
    }
    dense::tensor(y, &dims)
}

/// What the backward keeps: the input (contiguous) and the weight (as it was, or its unit's
/// slot while resharded), and which of
/// the optional parents there are.
#[derive(Debug, Clone)]
struct Saved {
    x: FlexTensor,
    w: Kept,
    bias: bool,
    residual: bool,
}

#[derive(Debug)]
struct LinearBackward<const N: usize>;

impl<const N: usize> Backward<Flex, N> for LinearBackward<N> {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let s = ops.state;
        let w = s.w.get();
        let wd = dense::dims(&w);
        let (i, o) = (wd[0], wd[1]);
        let dys = dense::values(&dy);
        let rows = dys.len() / o.max(1);
        let mut parents = ops.parents.iter();
        let (px, pw) = (
            parents.next().cloned().flatten(),
            parents.next().cloned().flatten(),
        );
        let pb = if s.bias {
            parents.next().cloned().flatten()
        } else {
            None
        };
        let pr = if s.residual {
            parents.next().cloned().flatten()
        } else {
            None
        };
        if let Some(p) = px {
            let mut dx = dense::for_output(rows * i);
            // SAFETY: dy [rows, o], wᵀ [o, i] through w's strides, dx [rows, i]
            unsafe {
                dense::gemm(
                    dense::Product {
                        m: rows,
                        n: i,
                        k: o,
                        accumulate: false,
                        scale: 1.0,
                    },
                    MatMut::rows(&mut dx, i),
                    Mat::rows(dys, o),
                    operand(&w).t(),
                    true,
                );
            }
            grads.register::<Flex>(p.id, dense::tensor(dx, &dense::dims(&s.x)));
        }
        if let Some(p) = pw {
            let mut dw = dense::for_output(i * o);
            // SAFETY: xᵀ [i, rows] through x's strides, dy [rows, o], dw [i, o]
            unsafe {
                dense::gemm(
                    dense::Product {
                        m: i,
                        n: o,
                        k: rows,
                        accumulate: false,
                        scale: 1.0,
                    },
                    MatMut::rows(&mut dw, o),
                    Mat::rows(dense::values(&s.x), i).t(),
                    Mat::rows(dys, o),
                    true,
                );
            }
            grads.register::<Flex>(p.id, dense::tensor(dw, &[i, o]));
        }
        if let Some(p) = pb {
            let db = dense::sum_rows(rows, o, o, |first, n, acc| {
                for row in dys[first * o..(first + n) * o].chunks_exact(o) {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v;
                    }
                }
            });
            grads.register::<Flex>(p.id, dense::tensor(db, &[o]));
        }
        if let Some(p) = pr {
            grads.register::<Flex>(p.id, dy);
        }
    }
}

/// Records the op on `parents` (x, w, then b and r where given).
fn record<const N: usize>(parents: [&AdTensor; N], saved: Saved, out: FlexTensor) -> AdTensor {
    let nodes = parents.map(|t| t.node.clone());
    match LinearBackward::<N>
        .prepare::<NoCheckpointing>(nodes)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(saved, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

fn autodiff(
    x: AdTensor,
    w: AdTensor,
    b: Option<AdTensor>,
    r: Option<AdTensor>,
) -> Option<AdTensor> {
    let xc = dense::contiguous(x.primitive.clone());
    if !readable(&w.primitive) {
        return None;
    }
    let bc = b.as_ref().map(|b| dense::contiguous(b.primitive.clone()));
    let rc = r.as_ref().map(|r| dense::contiguous(r.primitive.clone()));
    let out = forward(&xc, &w.primitive, bc.as_ref(), rc.as_ref());
    let saved = Saved {
        x: xc,
        w: Kept::of(&w.primitive),
        bias: b.is_some(),
        residual: r.is_some(),
    };
    Some(match (&b, &r) {
        (None, None) => record([&x, &w], saved, out),
        (Some(b), None) => record([&x, &w, b], saved, out),
        (None, Some(r)) => record([&x, &w, r], saved, out),
        (Some(b), Some(r)) => record([&x, &w, b, r], saved, out),
    })
}

/// `x W + b` (Burn's `Linear::forward`: `W` is `[in, out]`), plus `residual` when given (as
/// `residual + linear(x)`): one gemm on flex in f32 (any strides of `W`, a transposed view
/// included), Burn's ops elsewhere.
pub fn linear<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    residual: Option<Tensor<B, D>>,
) -> Tensor<B, D> {
    if let Some(y) = fused(x.clone(), w.clone(), b.clone(), residual.clone()) {
        return y;
    }
    let y = burn::tensor::module::linear(x, w, b);
    match residual {
        Some(r) => r + y,
        None => y,
    }
}

fn fused<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    w: Tensor<B, 2>,
    b: Option<Tensor<B, 1>>,
    r: Option<Tensor<B, D>>,
) -> Option<Tensor<B, D>> {
    if D < 2 {
        return None;
    }
    let x = route::route1(x).ok()?;
    let w = route::route1(w).ok()?;
    let b = b
        .map(|b| route::route1(b).ok())
        .map_or(Some(None), |b| b.map(Some))?;
    let r = r
        .map(|r| route::route1(r).ok())
        .map_or(Some(None), |r| r.map(Some))?;
    match (x, w) {
        (Routes::Autodiff([x]), Routes::Autodiff([w])) => {
            let b = match b {
                Some(Routes::Autodiff([b])) => Some(b),
                None => None,
                Some(Routes::Plain(_)) => return None,
            };
            let r = match r {
                Some(Routes::Autodiff([r])) => Some(r),
                None => None,
                Some(Routes::Plain(_)) => return None,
            };
            route::back::<B, _, D>(autodiff(x, w, b, r)?)
        }
        (Routes::Plain([x]), Routes::Plain([w])) => {
            if !readable(&w) {
                return None;
            }
            let b = match b {
                Some(Routes::Plain([b])) => Some(dense::contiguous(b)),
                None => None,
                Some(Routes::Autodiff(_)) => return None,
            };
            let r = match r {
                Some(Routes::Plain([r])) => Some(dense::contiguous(r)),
                None => None,
                Some(Routes::Autodiff(_)) => return None,
            };
            let xc = dense::contiguous(x);
            route::back::<B, _, D>(forward(&xc, &w, b.as_ref(), r.as_ref()))
        }
        _ => None,
    }
}
