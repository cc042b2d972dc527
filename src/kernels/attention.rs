//! Causal multi-head self-attention in one op, straight from the fused q/k/v projection
//! `qkv` `[n, t, 3 dim]` to the heads' outputs side by side `[n, t, dim]` (what the output
//! projection reads): each (sample, head) pair reads its q, k and v through strides (no head
//! split, no transposes, no mask tensor), takes `softmax(q kᵀ / sqrt(hd))` over the positions
//! up to its own with two gemms around one pass per row, and writes its output columns in
//! place. The products go by blocks of 64 rows, each with the keys before its end only, so
//! the half that the causal mask zeroes is mostly not computed (forward and backward). The
//! pairs run on the rank's threads, each on its own rows and columns, so the result does not
//! depend on the thread count.
//!
//! The backward keeps the probabilities (`n x heads x t x t` values) rather than recomputing
//! them from a saved log-sum-exp: at the context lengths a CPU trains (nanoGPT's 64 and 256)
//! they are smaller than the block's MLP activations, and keeping them saves the backward a
//! third gemm per pair. The gradient is the usual one: dV = Pᵀ dY, dP = dY Vᵀ,
//! dS = P ⊙ (dP - rowsum(P ⊙ dP)), dQ = dS K / sqrt(hd), dK = dSᵀ Q / sqrt(hd).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};
use rayon::prelude::*;

use super::dense::{self, Mat, MatMut, Shared};
use super::math::{dot, exp, max, multiversion};
use super::route::{self, AdTensor, Routes};

/// The shape of one call: samples, positions, heads and channels per head.
#[derive(Debug, Clone, Copy)]
struct Dims {
    n: usize,
    t: usize,
    heads: usize,
    hd: usize,
}

impl Dims {
    fn dim(&self) -> usize {
        self.heads * self.hd
    }
    /// Pair `p`'s sample and head.
    fn pair(&self, p: usize) -> (usize, usize) {
        (p / self.heads, p % self.heads)
    }
    /// Where pair `p`'s q (then k at + dim, v at + 2 dim) starts in `qkv`, rows `3 dim` apart.
    fn q_at(&self, p: usize) -> usize {
        let (b, h) = self.pair(p);
        b * self.t * 3 * self.dim() + h * self.hd
    }
    /// Where pair `p`'s output columns start in `y` (rows `dim` apart).
    fn y_at(&self, p: usize) -> usize {
        let (b, h) = self.pair(p);
        b * self.t * self.dim() + h * self.hd
    }
    fn scale(&self) -> f32 {
        1.0 / (self.hd as f32).sqrt()
    }
    /// Pair `p`'s row of document starts.
    fn row_starts<'a>(&self, starts: Option<&'a [u32]>, p: usize) -> Option<&'a [u32]> {
        let b = self.pair(p).0;
        starts.map(|s| &s[b * self.t..(b + 1) * self.t])
    }
}

/// Rows (or keys) per block of the causal products: a block of rows is multiplied with the keys
/// before its end only, skipping the products the mask would zero (62% of the full products
/// are left at t = 256; none are skipped at t <= 64).
const BLOCK: usize = 64;

/// The blocks `(start, end)` that cover `0..t`.
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t.div_ceil(BLOCK)).map(move |b| (b * BLOCK, ((b + 1) * BLOCK).min(t)))
}

/// Where row `i`'s document starts (0 without documents).
#[inline(always)]
fn start_of(starts: Option<&[u32]>, i: usize) -> usize {
    starts.map_or(0, |s| (s[i] as usize).min(i))
}

// row i of `s` (t values) becomes the softmax of its values from its document's start to i,
// zeros elsewhere
multiversion! {
    fn causal_softmax(s: &mut [f32], t: usize, starts: Option<&[u32]>) {
        for (i, row) in s.chunks_exact_mut(t).enumerate() {
            let (upto, masked) = row.split_at_mut(i + 1);
            let (before, live) = upto.split_at_mut(start_of(starts, i));
            before.fill(0.0);
            let m = max(live);
            let mut total = 0.0;
            for v in live.iter_mut() {
                *v = exp(*v - m);
                total += *v;
            }
            let inv = 1.0 / total;
            for v in live.iter_mut() {
                *v *= inv;
            }
            masked.fill(0.0);
        }
    }
}

// dP (in `dp`) becomes dS = P ⊙ (dP - rowsum(P ⊙ dP)), row by row over the causal part of
// the row's document
multiversion! {
    fn softmax_grad(p: &[f32], dp: &mut [f32], t: usize, starts: Option<&[u32]>) {
        for (i, (pr, dr)) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)).enumerate() {
            let (lo, n) = (start_of(starts, i), i + 1);
            let c = dot(&pr[lo..n], &dr[lo..n]);
            for (d, &pv) in dr[lo..n].iter_mut().zip(&pr[lo..n]) {
                *d = pv * (*d - c);
            }
            dr[..lo].fill(0.0);
            dr[n..].fill(0.0);
        }
    }
}

/// The forward of pair `p`: its probabilities into `prob` (`[t, t]`) and its output columns
/// into `y`.
///
/// # Safety
/// `y` must be valid for `[n, t, dim]` values, with no one else writing pair `p`'s columns.
unsafe fn forward_pair(
    d: Dims,
    qkv: &[f32],
    starts: Option<&[u32]>,
    y: Shared,
    p: usize,
    prob: &mut [f32],
) {
    let (t, hd, dim) = (d.t, d.hd, d.dim());
    let q = Mat {
        ptr: qkv.as_ptr(),
        rs: 3 * dim as isize,
        cs: 1,
    }
    .at(d.q_at(p));
    let (k, v) = (q.at(dim), q.at(2 * dim));
    let out = MatMut {
        ptr: y.0,
        rs: dim as isize,
        cs: 1,
    }
    .at(d.y_at(p));
    // rows r0..r1 see the keys before r1 only: their scores (and, below, their weighted sum)
    // skip the columns the mask would zero
    for (r0, r1) in blocks(t) {
        // SAFETY: q and k are [t, hd] inside qkv; rows r0..r1, columns ..r1 of prob [t, t]
        unsafe {
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: r1,
                    k: hd,
                    accumulate: false,
                    scale: d.scale(),
                },
                MatMut::rows(prob, t).at(r0 * t),
                q.at(r0 * 3 * dim),
                k.t(),
                false,
            )
        };
    }
    // every row's first i + 1 values were written above; the rest become zeros here
    causal_softmax(prob, t, d.row_starts(starts, p));
    for (r0, r1) in blocks(t) {
        // SAFETY: prob [t, t], v [t, hd] inside qkv, out: pair p's columns (the caller's
        // contract), rows r0..r1
        unsafe {
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: hd,
                    k: r1,
                    accumulate: false,
                    scale: 1.0,
                },
                out.at(r0 * dim),
                Mat::rows(prob, t).at(r0 * t),
                v,
                false,
            )
        };
    }
}

/// The attention of every pair: `y` `[n, t, dim]` and, with `keep`, the probabilities
/// `[n * heads, t, t]`.
fn forward(d: Dims, qkv: &[f32], starts: Option<&[u32]>, keep: bool) -> (Vec<f32>, Vec<f32>) {
    let tt = d.t * d.t;
    let pairs = d.n * d.heads;
    let mut y = dense::for_output(d.n * d.t * d.dim());
    let out = Shared(y.as_mut_ptr());
    let mut probs = if keep {
        dense::for_output(pairs * tt)
    } else {
        Vec::new()
    };
    if keep {
        probs
            .par_chunks_mut(tt.max(1))
            .enumerate()
            // SAFETY: each pair writes its own columns of y
            .for_each(|(p, prob)| unsafe { forward_pair(d, qkv, starts, out, p, prob) });
    } else {
        (0..pairs).into_par_iter().for_each_init(
            || dense::for_output(tt),
            // SAFETY: each pair writes its own columns of y
            |prob, p| unsafe { forward_pair(d, qkv, starts, out, p, prob) },
        );
    }
    (y, probs)
}

/// The backward of pair `p` into its q, k and v columns of `dqkv`, with `dp` (`[t, t]`) as
/// scratch.
///
/// # Safety
/// `dqkv` must be valid for `[n, t, 3 dim]` values, with no one else writing pair `p`'s
/// columns.
unsafe fn backward_pair(
    d: Dims,
    (qkv, starts): (&[f32], Option<&[u32]>),
    prob: &[f32],
    dy: &[f32],
    dqkv: Shared,
    p: usize,
    dp: &mut [f32],
) {
    let (t, hd, dim) = (d.t, d.hd, d.dim());
    let rows3 = 3 * dim as isize;
    let q = Mat {
        ptr: qkv.as_ptr(),
        rs: rows3,
        cs: 1,
    }
    .at(d.q_at(p));
    let (k, v) = (q.at(dim), q.at(2 * dim));
    let g = Mat {
        ptr: dy.as_ptr(),
        rs: dim as isize,
        cs: 1,
    }
    .at(d.y_at(p));
    let dq = MatMut {
        ptr: dqkv.0,
        rs: rows3,
        cs: 1,
    }
    .at(d.q_at(p));
    let (dk, dv) = (dq.at(dim), dq.at(2 * dim));
    // the causal zeros of P and dS are skipped: a row block of dP, dS and dQ reads the keys
    // before its end; a key block of dV and dK reads the rows from its start
    for (r0, r1) in blocks(t) {
        // SAFETY (all): operands inside qkv, dy, prob and dp by the dims; dq, dk, dv are this
        // pair's columns of dqkv (the caller's contract)
        unsafe {
            // dV = Pᵀ dY: keys r0..r1 from rows r0..t
            let pt = Mat::rows(prob, t).at(r0 * t + r0).t();
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: hd,
                    k: t - r0,
                    accumulate: false,
                    scale: 1.0,
                },
                dv.at(r0 * 3 * dim),
                pt,
                g.at(r0 * dim),
                false,
            );
            // dP = dY Vᵀ: rows r0..r1, keys ..r1
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: r1,
                    k: hd,
                    accumulate: false,
                    scale: 1.0,
                },
                MatMut::rows(dp, t).at(r0 * t),
                g.at(r0 * dim),
                v.t(),
                false,
            );
        }
    }
    // every row's first i + 1 values were written above; the rest become zeros here
    softmax_grad(prob, dp, t, d.row_starts(starts, p));
    for (r0, r1) in blocks(t) {
        // SAFETY (both): as above
        unsafe {
            // dQ = dS K scale: rows r0..r1, keys ..r1
            let ds = Mat::rows(dp, t).at(r0 * t);
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: hd,
                    k: r1,
                    accumulate: false,
                    scale: d.scale(),
                },
                dq.at(r0 * 3 * dim),
                ds,
                k,
                false,
            );
            // dK = dSᵀ Q scale: keys r0..r1 from rows r0..t
            let dst = Mat::rows(dp, t).at(r0 * t + r0).t();
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: hd,
                    k: t - r0,
                    accumulate: false,
                    scale: d.scale(),
                },
                dk.at(r0 * 3 * dim),
                dst,
                q.at(r0 * 3 * dim),
                false,
            );
        }
    }
}

fn backward(
    d: Dims,
    (qkv, starts): (&[f32], Option<&[u32]>),
    probs: &[f32],
    dy: &[f32],
) -> Vec<f32> {
    let tt = d.t * d.t;
    let mut dqkv = dense::for_output(d.n * d.t * 3 * d.dim());
    let out = Shared(dqkv.as_mut_ptr());
    (0..d.n * d.heads).into_par_iter().for_each_init(
        || dense::for_output(tt),
        |dp, p| {
            let prob = &probs[p * tt..(p + 1) * tt];
            // SAFETY: each pair writes its own columns of dqkv
            unsafe { backward_pair(d, (qkv, starts), prob, dy, out, p, dp) }
        },
    );
    dqkv
}

/// What the backward keeps: the projection (contiguous), the probabilities, the shape and
/// the documents' starts.
#[derive(Debug, Clone)]
struct Saved {
    qkv: FlexTensor,
    probs: FlexTensor,
    dims: (usize, usize, usize, usize),
    starts: Option<Starts>,
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Flex, 1> for AttentionBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let s = ops.state;
        let (n, t, heads, hd) = s.dims;
        let d = Dims { n, t, heads, hd };
        let [parent] = ops.parents;
        if let Some(p) = parent {
            let g = backward(
                d,
                (dense::values(&s.qkv), s.starts.as_deref()),
                dense::values(&s.probs),
                dense::values(&dy),
            );
            grads.register::<Flex>(p.id, dense::tensor(g, &[n, t, 3 * d.dim()]));
        }
    }
}

/// Causal self-attention of `heads` heads from `qkv` `[n, t, 3 dim]` (q, k and v side by side,
/// as one projection makes them): `[n, t, dim]`, the heads' outputs side by side. On flex in
/// f32 only; `None` elsewhere (the caller runs Burn's ops).
pub fn causal_attention<B: Backend>(qkv: Tensor<B, 3>, heads: usize) -> Option<Tensor<B, 3>> {
    document_attention(qkv, heads, None)
}

/// Where each token's document starts in its row, `[n * t]` (row b's position i at
/// `b * t + i`, the value at most i): packed rows of several documents.
pub type Starts = std::sync::Arc<[u32]>;

/// `causal_attention` inside documents (flash-attention's varlen): with `starts`, a position
/// attends to the positions of its own document up to itself only, so each document of a
/// packed row gets the attention it has alone. `None` for starts of another shape.
pub fn document_attention<B: Backend>(
    qkv: Tensor<B, 3>,
    heads: usize,
    starts: Option<Starts>,
) -> Option<Tensor<B, 3>> {
    let [n, t, three] = qkv.dims();
    if heads == 0 || three % (3 * heads) != 0 {
        return None;
    }
    if let Some(s) = &starts {
        let fits = s.len() == n * t
            && s.iter()
                .enumerate()
                .all(|(j, &v)| v as usize <= j % t.max(1));
        if !fits {
            return None;
        }
    }
    let st = starts.as_deref();
    let d = Dims {
        n,
        t,
        heads,
        hd: three / (3 * heads),
    };
    match route::route1(qkv).ok()? {
        Routes::Autodiff([a]) => {
            let x = dense::contiguous(a.primitive.clone());
            let y: AdTensor = match AttentionBackward
                .prepare::<NoCheckpointing>([a.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, probs) = forward(d, dense::values(&x), st, true);
                    let saved = Saved {
                        qkv: x,
                        probs: dense::tensor(probs, &[n * heads, t, t]),
                        dims: (n, t, heads, d.hd),
                        starts: starts.clone(),
                    };
                    prep.finish(saved, dense::tensor(y, &[n, t, d.dim()]))
                }
                OpsKind::UnTracked(prep) => {
                    let (y, _) = forward(d, dense::values(&x), st, false);
                    prep.finish(dense::tensor(y, &[n, t, d.dim()]))
                }
            };
            route::back::<B, _, 3>(y)
        }
        Routes::Plain([f]) => {
            let x = dense::contiguous(f);
            let (y, _) = forward(d, dense::values(&x), st, false);
            route::back::<B, _, 3>(dense::tensor(y, &[n, t, d.dim()]))
        }
    }
}
