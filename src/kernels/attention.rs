//! Causal multi-head self-attention in one op, straight from the fused q/k/v projection
//! `qkv` `[n, t, 3 dim]` to the heads' outputs side by side `[n, t, dim]` (what the output
//! projection reads): each (sample, head) pair reads its q, k and v through strides (no head
//! split, no mask tensor; kᵀ and Vᵀ are copied to rows once a head when several blocks read
//! them), takes `softmax(q kᵀ / sqrt(hd))` over the positions
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
use super::math::{dot, exp, map32_in_place, max, multiversion, sum};
use super::rope::Rope;
use super::route::{self, AdTensor, Routes};

/// The shape of one call: samples, positions, query heads, key/value heads (grouped-query
/// attention: query head h reads key/value head h / (heads / kv_heads)), channels per head and
/// the scores' scale.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub n: usize,
    pub t: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub hd: usize,
    pub scale: f32,
}

impl Dims {
    /// The output's width: the query heads' channels.
    pub fn dim(&self) -> usize {
        self.heads * self.hd
    }
    /// A row of `qkv`: the query heads, then the key heads, then the value heads.
    pub fn width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.hd
    }
    /// Pair `p`'s sample and head.
    fn pair(&self, p: usize) -> (usize, usize) {
        (p / self.heads, p % self.heads)
    }
    /// Where pair `p`'s q starts in `qkv` (rows `width` apart).
    fn q_at(&self, p: usize) -> usize {
        let (b, h) = self.pair(p);
        b * self.t * self.width() + h * self.hd
    }
    /// Where pair `p`'s k starts in `qkv` (its v: `kv_heads * hd` further).
    fn k_at(&self, p: usize) -> usize {
        let (b, h) = self.pair(p);
        let kv = h / (self.heads / self.kv_heads);
        b * self.t * self.width() + (self.heads + kv) * self.hd
    }
    /// Where pair `p`'s output columns start in `y` (rows `dim` apart).
    fn y_at(&self, p: usize) -> usize {
        let (b, h) = self.pair(p);
        b * self.t * self.dim() + h * self.hd
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

/// Values of the buffer that `transposed` copies a `[t, hd]` operand into: none when one block
/// reads it (its one gemm packs it, copying it to rows itself when it is large: `dense::gemm`).
fn transposed_len(t: usize, hd: usize) -> usize {
    if t > BLOCK {
        t * hd
    } else {
        0
    }
}

/// `x`ᵀ (`x` `[t, hd]`, rows `x.rs` apart) as a gemm operand `[hd, t]`: copied to rows in `buf`
/// when several blocks read it (gemm would gather it value by value for each), else `x`
/// through transposed strides (`buf` empty, see `transposed_len`).
///
/// # Safety
/// `x` must be valid for `[t, hd]` values with `x.cs` 1; `buf` holds `transposed_len(t, hd)`.
unsafe fn transposed(x: Mat, t: usize, hd: usize, buf: &mut [f32]) -> Mat {
    if buf.is_empty() {
        return x.t();
    }
    // SAFETY: the caller's contract
    unsafe { dense::transpose(x.ptr, x.rs as usize, t, hd, buf) };
    Mat::rows(buf, t)
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
            // the exponentials, then their sum (as the loss does): a running total kept the
            // exponentials to one lane at a time
            map32_in_place(live, |v| exp(v - m));
            let inv = 1.0 / sum(live);
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
    let (t, hd, dim, w) = (d.t, d.hd, d.dim(), d.width());
    let at = Mat {
        ptr: qkv.as_ptr(),
        rs: w as isize,
        cs: 1,
    };
    let (q, k) = (at.at(d.q_at(p)), at.at(d.k_at(p)));
    let v = k.at(d.kv_heads * hd);
    let out = MatMut {
        ptr: y.0,
        rs: dim as isize,
        cs: 1,
    }
    .at(d.y_at(p));
    // rows r0..r1 see the keys before r1 only: their scores (and, below, their weighted sum)
    // skip the columns the mask would zero
    dense::with_scratch(transposed_len(t, hd), |buf| {
        // SAFETY: k is [t, hd] inside qkv, rows w apart
        let kt = unsafe { transposed(k, t, hd, buf) };
        for (r0, r1) in blocks(t) {
            // SAFETY: q is [t, hd] inside qkv, kᵀ [hd, t]; rows r0..r1, columns ..r1 of prob
            unsafe {
                dense::gemm(
                    dense::Product {
                        m: r1 - r0,
                        n: r1,
                        k: hd,
                        accumulate: false,
                        scale: d.scale,
                    },
                    MatMut::rows(prob, t).at(r0 * t),
                    q.at(r0 * w),
                    kt,
                    false,
                )
            };
        }
    });
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

/// The backward of pair `p` into its q columns of `dqkv` and its key/value head's k and v
/// columns (added to what the group's earlier heads wrote there unless `first`), with `dp`
/// (`[t, t]`) as scratch.
///
/// # Safety
/// `dqkv` must be valid for `[n, t, width]` values, with no one else writing pair `p`'s q
/// columns or its key/value head's columns meanwhile.
unsafe fn backward_pair(
    d: Dims,
    (qkv, starts): (&[f32], Option<&[u32]>),
    (prob, dy): (&[f32], &[f32]),
    dqkv: Shared,
    (p, first): (usize, bool),
    dp: &mut [f32],
) {
    let (t, hd, dim, w) = (d.t, d.hd, d.dim(), d.width());
    let at = Mat {
        ptr: qkv.as_ptr(),
        rs: w as isize,
        cs: 1,
    };
    let (q, k) = (at.at(d.q_at(p)), at.at(d.k_at(p)));
    let v = k.at(d.kv_heads * hd);
    let g = Mat {
        ptr: dy.as_ptr(),
        rs: dim as isize,
        cs: 1,
    }
    .at(d.y_at(p));
    let dat = MatMut {
        ptr: dqkv.0,
        rs: w as isize,
        cs: 1,
    };
    let (dq, dk) = (dat.at(d.q_at(p)), dat.at(d.k_at(p)));
    let dv = dk.at(d.kv_heads * hd);
    // the causal zeros of P and dS are skipped: a row block of dP, dS and dQ reads the keys
    // before its end; a key block of dV and dK reads the rows from its start
    dense::with_scratch(transposed_len(t, hd), |buf| {
        // SAFETY: v is [t, hd] inside qkv, rows w apart
        let vt = unsafe { transposed(v, t, hd, buf) };
        for (r0, r1) in blocks(t) {
            // SAFETY (all): operands inside qkv, dy, prob and dp by the dims; dq, dk, dv are this
            // pair's columns of dqkv (the caller's contract)
            unsafe {
                // dV (+)= Pᵀ dY: keys r0..r1 from rows r0..t
                let pt = Mat::rows(prob, t).at(r0 * t + r0).t();
                dense::gemm(
                    dense::Product {
                        m: r1 - r0,
                        n: hd,
                        k: t - r0,
                        accumulate: !first,
                        scale: 1.0,
                    },
                    dv.at(r0 * w),
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
                    vt,
                    false,
                );
            }
        }
    });
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
                    scale: d.scale,
                },
                dq.at(r0 * w),
                ds,
                k,
                false,
            );
            // dK (+)= dSᵀ Q scale: keys r0..r1 from rows r0..t
            let dst = Mat::rows(dp, t).at(r0 * t + r0).t();
            dense::gemm(
                dense::Product {
                    m: r1 - r0,
                    n: hd,
                    k: t - r0,
                    accumulate: !first,
                    scale: d.scale,
                },
                dk.at(r0 * w),
                dst,
                q.at(r0 * w),
                false,
            );
        }
    }
}

/// The gradient of `qkv` (as the forward read it) from the kept probabilities and `dy`: the
/// (sample, key/value head) groups run on the rank's threads, each one's query heads in order
/// (their k and v gradients added in that order, whatever the thread count).
fn backward(
    d: Dims,
    (qkv, starts): (&[f32], Option<&[u32]>),
    probs: &[f32],
    dy: &[f32],
) -> Vec<f32> {
    let tt = d.t * d.t;
    let rep = d.heads / d.kv_heads;
    let mut dqkv = dense::for_output(d.n * d.t * d.width());
    let out = Shared(dqkv.as_mut_ptr());
    (0..d.n * d.kv_heads).into_par_iter().for_each_init(
        || dense::for_output(tt),
        |dp, group| {
            let (b, kv) = (group / d.kv_heads, group % d.kv_heads);
            for j in 0..rep {
                let p = b * d.heads + kv * rep + j;
                let prob = &probs[p * tt..(p + 1) * tt];
                // SAFETY: each group writes its own heads' columns of dqkv
                unsafe { backward_pair(d, (qkv, starts), (prob, dy), out, (p, j == 0), dp) }
            }
        },
    );
    dqkv
}

/// What the backward keeps: the projection as the products read it (contiguous, q and k
/// rotated), the probabilities, the shape, the documents' starts and the rotation (to take
/// the gradient back through it).
#[derive(Debug, Clone)]
struct Saved {
    qkv: FlexTensor,
    probs: FlexTensor,
    dims: Dims,
    starts: Option<Starts>,
    rope: Option<Rope>,
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Flex, 1> for AttentionBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let s = ops.state;
        let d = s.dims;
        let [parent] = ops.parents;
        if let Some(p) = parent {
            let mut g = backward(
                d,
                (dense::values(&s.qkv), s.starts.as_deref()),
                dense::values(&s.probs),
                dense::values(&dy),
            );
            if let Some(r) = &s.rope {
                r.apply(&mut g, &d, true);
            }
            grads.register::<Flex>(p.id, dense::tensor(g, &[d.n, d.t, d.width()]));
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
    let heads = Heads {
        heads,
        kv_heads: heads,
        scale: None,
    };
    grouped_attention(qkv, heads, None, starts)
}

/// The heads of `grouped_attention`: query heads, key/value heads (a divisor of `heads`) and
/// the scores' scale (`None`: 1 / sqrt(head_dim)).
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub scale: Option<f64>,
}

/// `document_attention` with grouped-query heads and rotary embeddings, as a llama computes
/// it: `qkv` `[n, t, (heads + 2 kv_heads) head_dim]` holds the query heads, then the key
/// heads, then the value heads, as the projections make them (before any rotation); query
/// head h reads key/value head h / (heads / kv_heads) where it lies (never a repeated copy),
/// and with `rope` the q and k heads are rotated in the same pass that makes the projection
/// contiguous. `None` elsewhere than flex in f32, and for shapes, starts or tables that do
/// not fit.
pub fn grouped_attention<B: Backend>(
    qkv: Tensor<B, 3>,
    heads: Heads,
    rope: Option<Rope>,
    starts: Option<Starts>,
) -> Option<Tensor<B, 3>> {
    let [n, t, width] = qkv.dims();
    let Heads {
        heads,
        kv_heads,
        scale,
    } = heads;
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return None;
    }
    if width % (heads + 2 * kv_heads) != 0 {
        return None;
    }
    let hd = width / (heads + 2 * kv_heads);
    if let Some(s) = &starts {
        let fits = s.len() == n * t
            && s.iter()
                .enumerate()
                .all(|(j, &v)| v as usize <= j % t.max(1));
        if !fits {
            return None;
        }
    }
    let d = Dims {
        n,
        t,
        heads,
        kv_heads,
        hd,
        scale: scale.map_or(1.0 / (hd as f32).sqrt(), |s| s as f32),
    };
    if rope.as_ref().is_some_and(|r| !r.fits(&d)) {
        return None;
    }
    let st = starts.as_deref();
    // the projection as the products read it: contiguous, q and k rotated
    let prepare = |x: FlexTensor| match &rope {
        Some(r) => {
            let mut v = dense::values(&dense::contiguous(x)).to_vec();
            r.apply(&mut v, &d, false);
            dense::tensor(v, &[n, t, width])
        }
        None => dense::contiguous(x),
    };
    let out = |y: Vec<f32>| dense::tensor(y, &[n, t, d.dim()]);
    match route::route1(qkv).ok()? {
        Routes::Autodiff([a]) => {
            let x = prepare(a.primitive.clone());
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
                        dims: d,
                        starts: starts.clone(),
                        rope,
                    };
                    prep.finish(saved, out(y))
                }
                OpsKind::UnTracked(prep) => {
                    let (y, _) = forward(d, dense::values(&x), st, false);
                    prep.finish(out(y))
                }
            };
            route::back::<B, _, 3>(y)
        }
        Routes::Plain([f]) => {
            let x = prepare(f);
            let (y, _) = forward(d, dense::values(&x), st, false);
            route::back::<B, _, 3>(out(y))
        }
    }
}
