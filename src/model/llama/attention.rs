//! One llama-family block's forward: the attention (grouped-query, rotary, the q/k norms of
//! Qwen3 and Gemma 3, Phi-3's fused q/k/v, sliding windows) and the MLP (SwiGLU, Gemma 3's
//! GeGLU, Phi-3's fused gate/up, Mixtral's experts), as transformers computes each.

use burn::nn::RmsNorm;
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::moe::RouterStats;
use super::{Arch, Block, Llama, RopeType};
use crate::kernels::{self, Starts};
use crate::model::api::{starts_mask, Forward};
use crate::model::decode::{At, Kv};
use crate::model::gpt::gelu_tanh;
use crate::model::lora::adapted;

impl Llama {
    /// The rotary inverse frequencies of base `theta`, `head_dim / 2` of them (transformers'
    /// `_compute_default_rope_parameters`; with `scaled`, the global layers', its
    /// `_compute_llama3_parameters` or `_compute_linear_scaling_rope_parameters`).
    pub fn inv_freq_of(&self, theta: f64, scaled: bool) -> Vec<f64> {
        let hd = self.head_dim;
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / hd as f64))
            .collect();
        let Some(s) = self.rope_scaling.filter(|_| scaled) else {
            return base;
        };
        if s.rope_type == RopeType::Linear {
            return base.into_iter().map(|f| f / s.factor).collect();
        }
        // (`check` refuses llama3 without all four numbers)
        let (Some(old), Some(low), Some(high)) = (
            s.original_max_position_embeddings,
            s.low_freq_factor,
            s.high_freq_factor,
        ) else {
            return base;
        };
        let old = old as f64;
        let (low_wavelen, high_wavelen) = (old / low, old / high);
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen > low_wavelen {
                    f / s.factor
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let smooth = (old / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }

    /// The global layers' rotary inverse frequencies.
    pub fn inv_freq(&self) -> Vec<f64> {
        self.inv_freq_of(self.rope_theta, true)
    }

    /// cos (or `sin`) of every position's angles, `[block, head_dim]` row by row (each frequency
    /// twice, halves side by side as transformers' `cat((freqs, freqs))`). `local`: Gemma 3's
    /// sliding layers' base.
    fn rope_table(&self, local: bool, sin: bool) -> Vec<f32> {
        let hd = self.head_dim;
        let inv = if local {
            self.inv_freq_of(self.rope_local_theta, false)
        } else {
            self.inv_freq()
        };
        let mut v = Vec::with_capacity(self.block * hd);
        for p in 0..self.block {
            for _ in 0..2 {
                for f in &inv {
                    // f32 angles, as transformers computes them
                    let a = (p as f32) * (*f as f32);
                    v.push(if sin { a.sin() } else { a.cos() });
                }
            }
        }
        v
    }

    /// The names of the rotary tables in the cache.
    fn table_names(local: bool) -> (&'static str, &'static str) {
        if local {
            ("rope_local_cos", "rope_local_sin")
        } else {
            ("rope_cos", "rope_sin")
        }
    }

    /// cos and sin of every position's angles (`rope_table`), positions `from..from + t` of
    /// them as `[1, t, 1, head_dim]`; over packed rows (`ctx.positions`), each position's place
    /// in its document, `[n, t, 1, head_dim]`.
    pub(super) fn rotary<B: Backend>(
        &self,
        from: usize,
        (n, t): (usize, usize),
        ctx: &Forward,
        device: &B::Device,
        local: bool,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let hd = self.head_dim;
        let table = |sin: bool| TensorData::new(self.rope_table(local, sin), [self.block, hd]);
        let (cn, sn) = Self::table_names(local);
        let cos: Tensor<B, 2> = self.cache.cached(cn, self.block, device, || table(false));
        let sin: Tensor<B, 2> = self.cache.cached(sn, self.block, device, || table(true));
        // packed rows: each document's positions start at 0, the angles picked per position
        if let Some(p) = ctx.positions(n, t).filter(|_| from == 0) {
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(p, [n * t]), device);
            let at = |x: Tensor<B, 2>| x.select(0, idx.clone()).reshape([n, t, 1, hd]);
            return (at(cos), at(sin));
        }
        let at = |x: Tensor<B, 2>| x.slice([from..from + t, 0..hd]).reshape([1, t, 1, hd]);
        (at(cos), at(sin))
    }

    /// The rotation of the fused attention kernel for rows `[n, t]` from position 0 (each
    /// document's positions from 0 over packed rows), its tables made once.
    fn rope(&self, (n, t): (usize, usize), ctx: &Forward, local: bool) -> kernels::Rope {
        let (cn, sn) = Self::table_names(local);
        let positions = ctx
            .positions(n, t)
            .map(|p| p.into_iter().map(|v| v as u32).collect::<Vec<u32>>().into());
        kernels::Rope {
            cos: self
                .cache
                .values(cn, self.block, || self.rope_table(local, false)),
            sin: self
                .cache
                .values(sn, self.block, || self.rope_table(local, true)),
            positions,
        }
    }

    /// `x` `[n, t, heads, head_dim]` rotated: `x cos + rotate_half(x) sin`.
    pub(super) fn rotate<B: Backend>(
        x: Tensor<B, 4>,
        cos: &Tensor<B, 4>,
        sin: &Tensor<B, 4>,
    ) -> Tensor<B, 4> {
        let [n, t, h, hd] = x.dims();
        let x1 = x.clone().slice([0..n, 0..t, 0..h, 0..hd / 2]);
        let x2 = x.clone().slice([0..n, 0..t, 0..h, hd / 2..hd]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * cos.clone() + rotated * sin.clone()
    }

    /// `kv` `[n, kv_heads, p, hd]` repeated for the query heads: `[n, heads, p, hd]` (head j
    /// reads key/value head j / (heads / kv_heads), transformers' `repeat_kv`).
    fn repeat_kv<B: Backend>(&self, kv: Tensor<B, 4>) -> Tensor<B, 4> {
        let rep = self.heads / self.kv_heads;
        if rep == 1 {
            return kv;
        }
        let [n, g, p, hd] = kv.dims();
        kv.reshape([n, g, 1, p, hd])
            .repeat_dim(2, rep)
            .reshape([n, g * rep, p, hd])
    }

    /// An RMSNorm as the architecture computes it: `x / rms(x) * weight`, Gemma's
    /// `x / rms(x) * (1 + weight)` (its weights start at 0); in one pass when `fused`.
    pub(super) fn norm<B: Backend, const D: usize>(
        &self,
        n: &RmsNorm<B>,
        x: Tensor<B, D>,
        fused: bool,
    ) -> Tensor<B, D> {
        let gemma = self.arch == Arch::Gemma3;
        if fused {
            let offset = if gemma { 1.0 } else { 0.0 };
            if let Some(y) = kernels::rms_norm(x.clone(), n.gamma.val(), offset, n.epsilon) {
                return y;
            }
        }
        if !gemma {
            return n.forward(x);
        }
        let rms = (x.clone().powf_scalar(2.0).mean_dim(D - 1) + n.epsilon).sqrt();
        let w = n.gamma.val().add_scalar(1.0);
        let mut shape = [1usize; D];
        shape[D - 1] = w.dims()[0];
        (x / rms) * w.reshape(shape)
    }

    /// Whether layer `i` is a sliding one (`model.layer_types`).
    fn slides(&self, i: usize) -> bool {
        self.sliding.get(i).copied().unwrap_or(false)
    }

    /// Whether layer `i` rotates by Gemma 3's sliding layers' base (`rope_local_theta`).
    fn local_rope(&self, i: usize) -> bool {
        self.arch == Arch::Gemma3 && self.slides(i)
    }

    /// A gated MLP's `act(gate) * up` (Gemma 3's GeGLU, SwiGLU otherwise: the dense MLP's and
    /// each Mixtral expert's), in one pass when fused.
    pub(super) fn gated<B: Backend, const D: usize>(
        &self,
        g: Tensor<B, D>,
        u: Tensor<B, D>,
        fused: bool,
    ) -> Tensor<B, D> {
        let act = if self.arch == Arch::Gemma3 {
            kernels::Gate::GeluTanh
        } else {
            kernels::Gate::Silu
        };
        if fused {
            if let Some(y) = kernels::glu(g.clone(), u.clone(), act) {
                return y;
            }
        }
        match act {
            kernels::Gate::GeluTanh => gelu_tanh(g) * u,
            kernels::Gate::Silu => silu(g) * u,
        }
    }

    /// Layer `i`'s sliding window, if it slides.
    fn window(&self, i: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.slides(i))
    }

    pub(super) fn block<B: Backend>(
        &self,
        i: usize,
        b: &Block<B>,
        x: Tensor<B, 3>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<RouterStats<B>>) {
        let at = At {
            from: 0,
            past: None,
            keep: false,
        };
        let (x, _, stats) = self.block_kv(i, b, x, at, ctx);
        (x, stats)
    }

    /// The query, key and value heads of `hx`, q and k normed (Qwen3, Gemma 3), not rotated.
    fn projections<B: Backend>(
        &self,
        b: &Block<B>,
        hx: Tensor<B, 3>,
        fused: bool,
        ctx: &mut Forward,
    ) -> Qkv<B> {
        let [n, t, _] = hx.dims();
        let (h, g, hd) = (self.heads, self.kv_heads, self.head_dim);
        let a = &b.self_attn;
        let proj = |l: &Option<burn::nn::Linear<B>>,
                    pick: fn(&super::BlockLora<B>) -> &Option<crate::model::lora::Lora<B>>,
                    x: Tensor<B, 3>,
                    ctx: &mut Forward| {
            l.as_ref()
                .map(|l| adapted(l, self.adapter(b, pick), x, None, fused, ctx))
        };
        let qkv = match &a.qkv_proj {
            // Phi-3: q, k and v side by side in one projection
            Some(l) => Qkv::Whole(crate::model::gpt::dense(l, hx, None, fused)),
            None => {
                let q = proj(&a.q_proj, |l| &l.q_proj, hx.clone(), ctx);
                let k = proj(&a.k_proj, |l| &l.k_proj, hx.clone(), ctx);
                let v = proj(&a.v_proj, |l| &l.v_proj, hx, ctx);
                match (q, k, v) {
                    (Some(q), Some(k), Some(v)) => Qkv::Parts([q, k, v]),
                    _ => unreachable!("a llama block without q/k/v projections"),
                }
            }
        };
        let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) else {
            return qkv;
        };
        let [q, k, v] = qkv.parts(h * hd, g * hd);
        let q = self.norm(qn, q.reshape([n, t, h, hd]), fused);
        let k = self.norm(kn, k.reshape([n, t, g, hd]), fused);
        Qkv::Parts([q.reshape([n, t, h * hd]), k.reshape([n, t, g * hd]), v])
    }

    /// q `[n, t, heads, hd]`, k and v `[n, t, kv_heads, hd]` of the projections, q and k
    /// rotated (Burn's ops) for positions from `from`, q scaled for the scores.
    fn rotated<B: Backend>(
        &self,
        i: usize,
        qkv: Qkv<B>,
        from: usize,
        ctx: &mut Forward,
    ) -> [Tensor<B, 4>; 3] {
        let (h, g, hd) = (self.heads, self.kv_heads, self.head_dim);
        let [q, k, v] = qkv.parts(h * hd, g * hd);
        let [n, t, _] = q.dims();
        let (q, k) = (q.reshape([n, t, h, hd]), k.reshape([n, t, g, hd]));
        let local = self.local_rope(i);
        let (cos, sin) = self.rotary::<B>(from, (n, t), ctx, &q.device(), local);
        let q = Self::rotate(q, &cos, &sin);
        // Gemma 3 scales the scores by query_pre_attn_scalar^-0.5, not head_dim^-0.5
        let q = if self.query_scale != 1.0 / (hd as f64).sqrt() {
            q.mul_scalar(self.query_scale * (hd as f64).sqrt())
        } else {
            q
        };
        [q, Self::rotate(k, &cos, &sin), v.reshape([n, t, g, hd])]
    }

    /// Block `i` (`b`) on `x` `[n, t, dim]` at positions `from..from + t`, after the positions
    /// whose keys and values `past` holds (none: `x` starts the sequence and attends causally
    /// within itself; with `past`, `x` is one position that attends to all, or to its window).
    /// With `keep`, also the keys and values of every position so far, `kv_heads` of them (a
    /// decoder's cache); a mixture of experts' router statistics (`moe`).
    pub(super) fn block_kv<B: Backend>(
        &self,
        i: usize,
        b: &Block<B>,
        x: Tensor<B, 3>,
        At { from, past, keep }: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>, Option<RouterStats<B>>) {
        let fused = ctx.fused() && !ctx.drops(self.dropout);
        let [n, t, _] = x.dims();
        let hx = self.norm(&b.input_layernorm, x.clone(), fused);
        let qkv = self.projections(b, hx, fused, ctx);
        let window = self.window(i).filter(|&w| w < from + t);
        let starts = window.map(|w| window_starts(ctx, (n, t), w));
        let whole = if fused && past.is_none() && !keep && from == 0 {
            // kiln's fused attention reads the heads where the projections put them, each
            // query head its key/value head, rotating q and k as it reads them
            let heads = kernels::Heads {
                heads: self.heads,
                kv_heads: self.kv_heads,
                scale: Some(self.query_scale),
            };
            let rope = self.rope((n, t), ctx, self.local_rope(i));
            let segments = starts.clone().or_else(|| ctx.segments().cloned());
            let all = qkv.clone().whole();
            kernels::grouped_attention(all, heads, Some(rope), segments)
        } else {
            None
        };
        let (y, kv) = match whole {
            Some(y) => (y, None),
            None => {
                let qkv = self.rotated(i, qkv, from, ctx);
                let (y, kv) = self.attention(qkv, past, (window, starts), &x.device(), ctx);
                (y, keep.then_some(kv))
            }
        };
        // `x + o_proj(y)` (the residual folded into the projection), or Gemma 3's
        // `x + norm(o_proj(y))`: the branch's output normed before the residual
        let gemma = b.pre_feedforward_layernorm.is_some();
        let o = adapted(
            &b.self_attn.o_proj,
            self.adapter(b, |l| &l.o_proj),
            y,
            (!gemma).then(|| x.clone()),
            fused,
            ctx,
        );
        let x = if gemma {
            x + self.norm(&b.post_attention_layernorm, o, fused)
        } else {
            o
        };
        let hx = match &b.pre_feedforward_layernorm {
            Some(pre) => self.norm(pre, x.clone(), fused),
            None => self.norm(&b.post_attention_layernorm, x.clone(), fused),
        };
        let (y, stats) = self.mlp(b, hx, fused, ctx);
        let x = match &b.post_feedforward_layernorm {
            Some(post) => x + self.norm(post, y, fused),
            None => x + y,
        };
        (x, kv, stats)
    }

    /// The MLP of block `b` on the normed `hx`: its output (without the residual), and a
    /// mixture of experts' router statistics.
    fn mlp<B: Backend>(
        &self,
        b: &Block<B>,
        hx: Tensor<B, 3>,
        fused: bool,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<RouterStats<B>>) {
        let m = match (&b.mlp, &b.block_sparse_moe) {
            (_, Some(moe)) => {
                let [n, t, _] = hx.dims();
                let (y, stats) = self.experts(moe, hx, fused, ctx.padding(n * t));
                return (y, Some(stats));
            }
            (Some(m), None) => m,
            (None, None) => unreachable!("a llama block without an MLP"),
        };
        let glu = |g: Tensor<B, 3>, u: Tensor<B, 3>| self.gated(g, u, fused);
        let down = &m.down_proj;
        let inner = match (&m.gate_up_proj, &m.gate_proj, &m.up_proj) {
            // Phi-3: gate and up side by side in one projection
            (Some(gu), _, _) => {
                let [n, t, _] = hx.dims();
                let y = crate::model::gpt::dense(gu, hx, None, fused);
                let f = self.ffn_dim;
                let gate = y.clone().slice([0..n, 0..t, 0..f]);
                glu(gate, y.slice([0..n, 0..t, f..2 * f]))
            }
            (None, Some(g), Some(u)) => {
                let gate = adapted(
                    g,
                    self.adapter(b, |l| &l.gate_proj),
                    hx.clone(),
                    None,
                    fused,
                    ctx,
                );
                let up = adapted(u, self.adapter(b, |l| &l.up_proj), hx, None, fused, ctx);
                glu(gate, up)
            }
            _ => unreachable!("a dense llama MLP without gate and up projections"),
        };
        let y = adapted(
            down,
            self.adapter(b, |l| &l.down_proj),
            inner,
            None,
            fused,
            ctx,
        );
        (y, None)
    }

    /// The attention in Burn's ops from rotated `q` `[n, t, heads, hd]` and `k`, `v` `[n, t,
    /// kv_heads, hd]`: the heads' outputs side by side `[n, t, heads * hd]`, and the keys and
    /// values of every position so far (`past`'s and these), `[n, kv_heads, p, hd]`. With a
    /// `window`, a position attends to the last `window` positions up to itself only (`starts`:
    /// where each one's window begins, made by `window_starts`).
    fn attention<B: Backend>(
        &self,
        [q, k, v]: [Tensor<B, 4>; 3],
        past: Option<Kv<B>>,
        (window, starts): (Option<usize>, Option<Starts>),
        device: &B::Device,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Kv<B>) {
        let [n, t, h, hd] = q.dims();
        let (q, k, v) = (q.swap_dims(1, 2), k.swap_dims(1, 2), v.swap_dims(1, 2));
        let (k, v, causal) = match past {
            Some((pk, pv)) => (
                Tensor::cat(vec![pk, k], 2),
                Tensor::cat(vec![pv, v], 2),
                false,
            ),
            None => (k, v, true),
        };
        // one position after the past: the window's last keys only
        let p = k.dims()[2];
        let (ka, va) = match window.filter(|&w| !causal && p > w) {
            Some(w) => {
                let g = k.dims()[1];
                (
                    k.clone().slice([0..n, 0..g, p - w..p, 0..hd]),
                    v.clone().slice([0..n, 0..g, p - w..p, 0..hd]),
                )
            }
            None => (k.clone(), v.clone()),
        };
        let att = q
            .matmul(self.repeat_kv(ka).swap_dims(2, 3))
            .div_scalar((hd as f64).sqrt());
        let att = if causal {
            let mask = match starts {
                Some(s) => starts_mask::<B>(&s, (n, t), device),
                None => self.cache.attention_mask::<B>(ctx, (n, t), device),
            };
            att + mask
        } else {
            att
        };
        let att = ctx.dropout(softmax(att, 3), self.dropout);
        let y = att
            .matmul(self.repeat_kv(va))
            .swap_dims(1, 2)
            .reshape([n, t, h * hd]);
        (y, (k, v))
    }
}

/// Where each position's attention begins in a sliding window of `w` positions: the later of
/// its document's start (packed rows) and `i + 1 - w`, `[n * t]` as `Forward::segments`.
fn window_starts(ctx: &Forward, (n, t): (usize, usize), w: usize) -> Starts {
    let docs = ctx.segments().filter(|s| s.len() == n * t);
    (0..n * t)
        .map(|j| {
            let i = j % t;
            let doc = docs.map_or(0, |s| (s[j] as usize).min(i));
            doc.max((i + 1).saturating_sub(w)) as u32
        })
        .collect::<Vec<u32>>()
        .into()
}

/// A block's query, key and value heads as the projections made them: side by side in one
/// tensor `[n, t, (heads + 2 kv_heads) hd]` (Phi-3's `qkv_proj`; what the fused attention
/// reads), or three.
#[derive(Clone)]
enum Qkv<B: Backend> {
    Whole(Tensor<B, 3>),
    Parts([Tensor<B, 3>; 3]),
}

impl<B: Backend> Qkv<B> {
    /// Side by side.
    fn whole(self) -> Tensor<B, 3> {
        match self {
            Qkv::Whole(x) => x,
            Qkv::Parts(p) => Tensor::cat(p.to_vec(), 2),
        }
    }

    /// q, k and v of `q_width`, `kv_width` channels.
    fn parts(self, q_width: usize, kv_width: usize) -> [Tensor<B, 3>; 3] {
        match self {
            Qkv::Parts(p) => p,
            Qkv::Whole(y) => {
                let [n, t, _] = y.dims();
                let k_end = q_width + kv_width;
                [
                    y.clone().slice([0..n, 0..t, 0..q_width]),
                    y.clone().slice([0..n, 0..t, q_width..k_end]),
                    y.slice([0..n, 0..t, k_end..k_end + kv_width]),
                ]
            }
        }
    }
}
