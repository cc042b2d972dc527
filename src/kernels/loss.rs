//! Softmax cross-entropy over the classes in one pass per row: the row's log-sum-exp, its
//! loss, and its gradient ((softmax - one-hot) / rows) all at once, so the backward is the
//! saved gradient times the incoming scalar and no log-softmax of the logits' size is kept.
//! A target of [`IGNORE`] (torch's `ignore_index = -100`) has no loss and no gradient, and the
//! mean is over the other rows.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use rayon::prelude::*;

use super::dense::{self, Shared};
use super::math::{exp, max, multiversion, sum};
use super::route::{self, AdTensor, Routes};

// `g` gets e^(x - m), the row's sum of which is returned
multiversion! {
    fn exp_shifted(x: &[f32], m: f32, g: &mut [f32]) -> f32 {
        for (o, &v) in g.iter_mut().zip(x) {
            *o = exp(v - m);
        }
        sum(g)
    }
}

multiversion! {
    fn scale(g: &mut [f32], by: f32) {
        for v in g.iter_mut() {
            *v *= by;
        }
    }
}

/// The target of a row that has no loss (padding, the last token of a document): torch's
/// `ignore_index`.
pub const IGNORE: u32 = u32::MAX;

/// The mean loss of rows `x` (`[rows, classes]`) for `targets`, and with `grad` the
/// gradient of that mean (NaN loss for a target outside the classes). Rows whose target is
/// `IGNORE` add nothing and count for nothing. Rows go in chunks of a size fixed by the shape,
/// their losses summed in f64 in chunk order.
fn forward(x: &[f32], classes: usize, targets: &[u32], grad: bool) -> (f64, Vec<f32>) {
    let rows = targets.len();
    let counted = targets.iter().filter(|&&t| t != IGNORE).count();
    let inv = 1.0 / counted.max(1) as f32;
    let mut g = if grad {
        dense::for_output(x.len())
    } else {
        Vec::new()
    };
    let out = Shared(g.as_mut_ptr());
    let per = dense::chunk_rows(classes);
    let chunk = |c: usize| -> f64 {
        let mut scratch = if grad {
            Vec::new()
        } else {
            dense::zeros(classes)
        };
        let mut total = 0f64;
        for r in c * per..((c + 1) * per).min(rows) {
            let row = &x[r * classes..(r + 1) * classes];
            let g = if grad {
                // SAFETY: row r of `g` (rows x classes values), written by this chunk only
                unsafe { std::slice::from_raw_parts_mut(out.ptr().add(r * classes), classes) }
            } else {
                &mut scratch[..]
            };
            if targets[r] == IGNORE {
                if grad {
                    g.fill(0.0);
                }
                continue;
            }
            let m = max(row);
            let s = exp_shifted(row, m, g);
            let lse = m + s.ln();
            let t = targets[r] as usize;
            total += match row.get(t) {
                Some(&xt) => f64::from(lse - xt),
                None => f64::NAN,
            };
            if grad {
                scale(g, inv / s);
                if let Some(v) = g.get_mut(t) {
                    *v -= inv;
                }
            }
        }
        total
    };
    let chunks = rows.div_ceil(per);
    let losses: Vec<f64> = if chunks > 1 {
        (0..chunks).into_par_iter().map(chunk).collect()
    } else {
        (0..chunks).map(chunk).collect()
    };
    (losses.iter().sum::<f64>() / counted.max(1) as f64, g)
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl Backward<Flex, 1> for CrossEntropyBackward {
    /// The gradient of the mean loss with respect to the logits.
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let by = dense::values(&dy).first().copied().unwrap_or(1.0);
        let [parent] = ops.parents;
        if let Some(p) = parent {
            let g = ops.state;
            let g = if by == 1.0 {
                g
            } else {
                let mut v = dense::values(&g).to_vec();
                let cols = dense::dims(&g).last().copied().unwrap_or(1);
                dense::for_rows(&mut v, cols, |_, c| scale(c, by));
                dense::tensor(v, &dense::dims(&g))
            };
            grads.register::<Flex>(p.id, g);
        }
    }
}

/// The mean cross-entropy of `logits` `[rows, classes]` for the class `targets` of their rows,
/// fused on flex in f32; `None` elsewhere (the caller runs Burn's ops).
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, targets: &[u32]) -> Option<Tensor<B, 1>> {
    let [rows, classes] = logits.dims();
    if rows != targets.len() || classes == 0 {
        return None;
    }
    match route::route1(logits).ok()? {
        Routes::Autodiff([a]) => {
            let x = dense::contiguous(a.primitive.clone());
            let (loss, g) = forward(dense::values(&x), classes, targets, true);
            drop(x);
            let out = dense::tensor(vec![loss as f32], &[1]);
            let y: AdTensor = match CrossEntropyBackward
                .prepare::<NoCheckpointing>([a.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(dense::tensor(g, &[rows, classes]), out),
                OpsKind::UnTracked(prep) => prep.finish(out),
            };
            route::back::<B, _, 1>(y)
        }
        Routes::Plain([f]) => {
            let x = dense::contiguous(f);
            let (loss, _) = forward(dense::values(&x), classes, targets, false);
            route::back::<B, _, 1>(dense::tensor(vec![loss as f32], &[1]))
        }
    }
}
