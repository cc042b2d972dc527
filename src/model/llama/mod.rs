//! `model.kind = "llama"`: the decoder of Llama 2/3, Mistral and Qwen2 as transformers'
//! `LlamaForCausalLM` computes it: a token embedding, blocks of RMSNorm -> grouped-query
//! attention with rotary position embeddings (transformers' half-split rotation; Llama 3's
//! rope scaling) -> residual, RMSNorm -> SwiGLU MLP -> residual, a final RMSNorm and an output
//! layer (untied, or tied to the embedding). No biases, except Qwen2's on q/k/v (`attn_bias`).
//! The module's field names are transformers' (`layers.3.self_attn.q_proj`), so PyTorch's names
//! are Burn's paths and Hugging Face's add `model.` (`hf.rs`). Each block is one unit (fsdp
//! `unit = "layer"` gathers one block at a time; checkpointing recomputes one block).
//! Initialisation: normal(0, 0.02) for every matrix and the embedding, RMSNorm weights 1.

mod adapters;
mod hf;
mod keys;

pub use adapters::BlockLora;
pub use hf::HF_LLAMA;
pub use keys::{LlamaKeys, RopeScaling, RopeType};

use crate::model::ConfigMismatch;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{silu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::api::{Act, Family, Forward, ModelError, Task, TokenDecoder};
use super::decode::{At, Incremental, Kv, KvDecoder};
use super::gpt::{dense, MaskCache};
use super::init;
use super::lora::{self, adapted, LoraSpec};
use super::portable::{External, WeightFormat};
use super::sizing::{check_token_data, sized_for_this_machine};
use crate::config::{DecayRule, Resolved};
use crate::kernels;
use crate::model::WeightAdapter;
use crate::params::ParamLayout;

/// The attention's projections (transformers' `self_attn`).
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

/// One decoder block.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub mlp: Mlp<B>,
    /// LoRA adapters of this block's modules (`[model.lora]`), after its own parameters.
    pub lora: Option<BlockLora<B>>,
}

/// The module: `embed_tokens`, `layers.<i>`, `norm` (and `lm_head` when not tied).
#[derive(Module, Debug)]
pub struct LlamaModule<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<Block<B>>,
    pub norm: RmsNorm<B>,
    pub lm_head: Option<Linear<B>>,
}

/// The llama family for one `[model]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama {
    pub vocab: usize,
    pub block: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub dim: usize,
    pub ffn_dim: usize,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub norm_eps: f64,
    pub tie: bool,
    pub attn_bias: bool,
    /// On the attention's weights (transformers' `attention_dropout`).
    pub dropout: f64,
    /// LoRA adapters (`[model.lora]` with a rank): each block's targeted modules get one.
    pub lora: Option<LoraSpec>,
    /// The causal masks and rotary tables made so far.
    pub cache: MaskCache,
}

impl Llama {
    /// The llama of `[model]`; its samples must be windows of `block_size + 1` tokens.
    pub fn for_input(r: &Resolved, input: &[usize]) -> Result<Self, ModelError> {
        let c = &r.config.model;
        let k: LlamaKeys = r.model_keys()?;
        let heads = k.heads.unwrap_or(4);
        let dim = k.dim.unwrap_or(128);
        let l = Llama {
            vocab: c.vocab_size.unwrap_or(256),
            block: c.block_size.unwrap_or(128),
            layers: k.layers.unwrap_or(4),
            heads,
            kv_heads: k.kv_heads.unwrap_or(heads),
            dim,
            ffn_dim: k
                .ffn_dim
                .unwrap_or((dim.saturating_mul(8) / 3).div_ceil(32).saturating_mul(32)),
            rope_theta: k.rope_theta.unwrap_or(10_000.0),
            rope_scaling: k.rope_scaling,
            norm_eps: k.norm_eps.unwrap_or(1e-5),
            tie: k.tie_embeddings.unwrap_or(false),
            attn_bias: k.attn_bias.unwrap_or(false),
            dropout: c.dropout,
            lora: LoraSpec::of(r, &adapters::TARGETS.map(|(m, _)| m), &adapters::DEFAULT)?,
            cache: MaskCache::default(),
        };
        l.check(r, input)?;
        if let Some(s) = &l.lora {
            s.check(r, &l.adaptable())?;
        }
        Ok(l)
    }

    /// Every size in range and consistent, the data token windows of `block + 1`.
    fn check(&self, r: &Resolved, input: &[usize]) -> Result<(), ModelError> {
        let err = |key: &str, message: String, help: &str| -> ModelError {
            r.key_error(key, message, Some(help.to_string())).into()
        };
        let range = |key: &str, message: String, help: &str| -> ModelError {
            r.range_error(key, message, Some(help.to_string())).into()
        };
        for (key, v) in [
            ("model.block_size", self.block),
            ("model.layers", self.layers),
            ("model.heads", self.heads),
            ("model.kv_heads", self.kv_heads),
            ("model.dim", self.dim),
            ("model.ffn_dim", self.ffn_dim),
            ("model.vocab_size", self.vocab),
        ] {
            if v == 0 {
                return Err(range(
                    key,
                    format!("`{key}` = 0 is out of range: must be at least 1"),
                    "a llama needs at least one of each",
                ));
            }
        }
        sized_for_this_machine(
            r,
            "llama",
            self.param_count(),
            &[
                ("model.layers", self.layers, 4),
                ("model.dim", self.dim, 128),
                ("model.ffn_dim", self.ffn_dim, 352),
                ("model.vocab_size", self.vocab, 256),
            ],
        )?;
        let pairs = [
            (
                "model.dim",
                self.dim,
                "model.heads",
                self.heads,
                "every head gets dim / heads channels",
            ),
            (
                "model.heads",
                self.heads,
                "model.kv_heads",
                self.kv_heads,
                "each key/value head serves heads / kv_heads query heads",
            ),
        ];
        for (a, va, b, vb, why) in pairs {
            if va % vb != 0 {
                return Err(err(
                    a,
                    format!("`{a}` = {va} is not a multiple of `{b}` = {vb}"),
                    &format!("{why}; change one of them"),
                ));
            }
        }
        if !(self.dim / self.heads).is_multiple_of(2) {
            return Err(err(
                "model.heads",
                format!(
                    "`model.dim` / `model.heads` = {} / {} = {} is odd, but rotary embeddings rotate channel pairs",
                    self.dim,
                    self.heads,
                    self.dim / self.heads
                ),
                "choose heads so that dim / heads is even",
            ));
        }
        for (key, v) in [
            ("model.rope_theta", self.rope_theta),
            ("model.norm_eps", self.norm_eps),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(range(
                    key,
                    format!("`{key}` = {v} is out of range: must be above 0"),
                    "Llama's are 10000 (500000 for Llama 3) and 1e-5",
                ));
            }
        }
        if let Some(s) = &self.rope_scaling {
            if !(s.factor > 0.0
                && s.high_freq_factor > s.low_freq_factor
                && s.low_freq_factor > 0.0)
                || s.original_max_position_embeddings == 0
            {
                return Err(range(
                    "model.rope_scaling",
                    format!("`model.rope_scaling` = {s:?} is out of range: factor and low_freq_factor must be above 0, high_freq_factor above low_freq_factor, original_max_position_embeddings at least 1"),
                    "Llama 3.1's: factor 8, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192",
                ));
            }
        }
        check_token_data(r, "llama", self.vocab, self.block, input)
    }

    /// The parameters its sizes give, counted before anything is built (u128: no size
    /// overflows it).
    fn param_count(&self) -> u128 {
        let (d, v, f, l) = (
            self.dim as u128,
            self.vocab as u128,
            self.ffn_dim as u128,
            self.layers as u128,
        );
        let kv = (self.kv_heads as u128) * (d / (self.heads as u128).max(1));
        let bias = if self.attn_bias { d + 2 * kv } else { 0 };
        let block = 2 * d * d + 2 * d * kv + bias + 3 * d * f + 2 * d;
        let head = if self.tie { 0 } else { v * d };
        v * d + l * block + d + head + self.adapter_count()
    }

    fn head_dim(&self) -> usize {
        self.dim / self.heads
    }

    /// The rotary inverse frequencies, `head_dim / 2` of them (transformers'
    /// `_compute_default_rope_parameters`, and `_compute_llama3_parameters` with scaling).
    pub fn inv_freq(&self) -> Vec<f64> {
        let hd = self.head_dim();
        let base: Vec<f64> = (0..hd / 2)
            .map(|i| 1.0 / self.rope_theta.powf((2 * i) as f64 / hd as f64))
            .collect();
        let Some(s) = self.rope_scaling else {
            return base;
        };
        let old = s.original_max_position_embeddings as f64;
        let (low_wavelen, high_wavelen) = (old / s.low_freq_factor, old / s.high_freq_factor);
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen > low_wavelen {
                    f / s.factor
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let smooth = (old / wavelen - s.low_freq_factor)
                        / (s.high_freq_factor - s.low_freq_factor);
                    (1.0 - smooth) * f / s.factor + smooth * f
                }
            })
            .collect()
    }

    /// cos and sin of every position's angles `[block, head_dim]` (each frequency twice, halves
    /// side by side as transformers' `cat((freqs, freqs))`), positions `from..from + t` of them
    /// as `[1, t, 1, head_dim]`; over packed rows (`ctx.positions`), each position's place in
    /// its document, `[n, t, 1, head_dim]`.
    fn rotary<B: Backend>(
        &self,
        from: usize,
        (n, t): (usize, usize),
        ctx: &Forward,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let hd = self.head_dim();
        let table = |sin: bool| {
            let inv = self.inv_freq();
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
            TensorData::new(v, [self.block, hd])
        };
        let cos: Tensor<B, 2> = self
            .cache
            .cached("rope_cos", self.block, device, || table(false));
        let sin: Tensor<B, 2> = self
            .cache
            .cached("rope_sin", self.block, device, || table(true));
        // packed rows: each document's positions start at 0, the angles picked per position
        if let Some(p) = ctx.positions(n, t).filter(|_| from == 0) {
            let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(p, [n * t]), device);
            let at = |x: Tensor<B, 2>| x.select(0, idx.clone()).reshape([n, t, 1, hd]);
            return (at(cos), at(sin));
        }
        let at = |x: Tensor<B, 2>| x.slice([from..from + t, 0..hd]).reshape([1, t, 1, hd]);
        (at(cos), at(sin))
    }

    /// `x` `[n, t, heads, head_dim]` rotated: `x cos + rotate_half(x) sin`.
    fn rotate<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
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

    fn norm<B: Backend, const D: usize>(&self, n: &RmsNorm<B>, x: Tensor<B, D>) -> Tensor<B, D> {
        n.forward(x)
    }

    fn block<B: Backend>(&self, b: &Block<B>, x: Tensor<B, 3>, ctx: &mut Forward) -> Tensor<B, 3> {
        let at = At {
            from: 0,
            past: None,
            keep: false,
        };
        self.block_kv(b, x, at, ctx).0
    }

    /// Block `b` on `x` `[n, t, dim]` at positions `from..from + t`, after the positions whose
    /// keys and values `past` holds (none: `x` starts the sequence and attends causally within
    /// itself; with `past`, `x` is one position that attends to all). With `keep`, also the keys
    /// and values of every position so far, `kv_heads` of them (a decoder's cache).
    fn block_kv<B: Backend>(
        &self,
        b: &Block<B>,
        x: Tensor<B, 3>,
        At { from, past, keep }: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>) {
        let fused = ctx.fused() && !ctx.drops(self.dropout);
        let [n, t, _] = x.dims();
        let (h, g, hd) = (self.heads, self.kv_heads, self.head_dim());
        let a = &b.self_attn;
        let hx = self.norm(&b.input_layernorm, x.clone());
        let q = adapted(
            &a.q_proj,
            self.adapter(b, |l| &l.q_proj),
            hx.clone(),
            None,
            fused,
            ctx,
        )
        .reshape([n, t, h, hd]);
        let k = adapted(
            &a.k_proj,
            self.adapter(b, |l| &l.k_proj),
            hx.clone(),
            None,
            fused,
            ctx,
        )
        .reshape([n, t, g, hd]);
        let v = adapted(
            &a.v_proj,
            self.adapter(b, |l| &l.v_proj),
            hx,
            None,
            fused,
            ctx,
        )
        .reshape([n, t, g, hd]);
        let (cos, sin) = self.rotary::<B>(from, (n, t), ctx, &x.device());
        let (q, k) = (Self::rotate(q, &cos, &sin), Self::rotate(k, &cos, &sin));
        let whole = if fused && past.is_none() && !keep {
            // kiln's fused causal attention reads q, k and v side by side, one per query head
            let wide = |kv: Tensor<B, 4>| {
                self.repeat_kv(kv.swap_dims(1, 2))
                    .swap_dims(1, 2)
                    .reshape([n, t, h * hd])
            };
            let qkv = Tensor::cat(
                vec![
                    q.clone().reshape([n, t, h * hd]),
                    wide(k.clone()),
                    wide(v.clone()),
                ],
                2,
            );
            kernels::document_attention(qkv, h, ctx.segments().cloned())
        } else {
            None
        };
        let (y, kv) = match whole {
            Some(y) => (y, None),
            None => {
                let (y, kv) = self.attention(q, k, v, past, &x.device(), ctx);
                (y, keep.then_some(kv))
            }
        };
        // (`x + o_proj(y)` without `fused`)
        let x = adapted(
            &a.o_proj,
            self.adapter(b, |l| &l.o_proj),
            y,
            Some(x),
            fused,
            ctx,
        );
        let hx = self.norm(&b.post_attention_layernorm, x.clone());
        let m = &b.mlp;
        let gate = adapted(
            &m.gate_proj,
            self.adapter(b, |l| &l.gate_proj),
            hx.clone(),
            None,
            fused,
            ctx,
        );
        let up = adapted(
            &m.up_proj,
            self.adapter(b, |l| &l.up_proj),
            hx,
            None,
            fused,
            ctx,
        );
        let down = self.adapter(b, |l| &l.down_proj);
        let x = adapted(&m.down_proj, down, silu(gate) * up, Some(x), fused, ctx);
        (x, kv)
    }

    /// The attention in Burn's ops from rotated `q` `[n, t, heads, hd]` and `k`, `v` `[n, t,
    /// kv_heads, hd]`: the heads' outputs side by side `[n, t, dim]`, and the keys and values of
    /// every position so far (`past`'s and these), `[n, kv_heads, p, hd]`.
    fn attention<B: Backend>(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        past: Option<Kv<B>>,
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
        let att = q
            .matmul(self.repeat_kv(k.clone()).swap_dims(2, 3))
            .div_scalar((hd as f64).sqrt());
        let att = if causal {
            att + self.cache.attention_mask::<B>(ctx, (n, t), device)
        } else {
            att
        };
        let att = ctx.dropout(softmax(att, 3), self.dropout);
        let y = att
            .matmul(self.repeat_kv(v.clone()))
            .swap_dims(1, 2)
            .reshape([n, t, h * hd]);
        (y, (k, v))
    }

    /// The token embeddings of the ids `x` `[samples, positions]`.
    fn embed<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        x: TensorData,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        m.embed_tokens
            .forward(Tensor::<B, 2, Int>::from_data(x, device))
    }

    /// The final RMSNorm and the output layer: logits `[samples * positions, vocab]`.
    fn head<B: Backend>(&self, m: &LlamaModule<B>, h: Tensor<B, 3>, fused: bool) -> Tensor<B, 2> {
        let [n, t, _] = h.dims();
        let h = self.norm(&m.norm, h).reshape([n * t, self.dim]);
        match &m.lm_head {
            Some(head) => dense(head, h, None, fused),
            None if fused => {
                kernels::linear(h, m.embed_tokens.weight.val().transpose(), None, None)
            }
            None => h.matmul(m.embed_tokens.weight.val().transpose()),
        }
    }

    fn linear<B: Backend>(
        &self,
        d_in: usize,
        d_out: usize,
        bias: bool,
        device: &B::Device,
    ) -> Linear<B> {
        LinearConfig::new(d_in, d_out).with_bias(bias).init(device)
    }

    fn rms<B: Backend>(&self, device: &B::Device) -> RmsNorm<B> {
        RmsNormConfig::new(self.dim)
            .with_epsilon(self.norm_eps)
            .init(device)
    }
}

impl Incremental for Llama {
    fn context_len(&self) -> usize {
        self.block
    }
    fn block_count<B: Backend>(&self, m: &LlamaModule<B>) -> usize {
        m.layers.len()
    }
    /// (positions enter through the rotary embeddings, in the blocks)
    fn embed_at<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        ids: TensorData,
        _from: usize,
        device: &B::Device,
        _ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        self.embed(m, ids, device)
    }
    fn block_at<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        i: usize,
        x: Tensor<B, 3>,
        at: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>) {
        self.block_kv(&m.layers[i], x, at, ctx)
    }
    fn head_of<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        h: Tensor<B, 3>,
        fused: bool,
    ) -> Tensor<B, 2> {
        self.head(m, h, fused)
    }
}

impl Family for Llama {
    fn weights(&self) -> &dyn WeightAdapter {
        self
    }

    type Module<B: Backend> = LlamaModule<B>;

    fn kind(&self) -> &str {
        "llama"
    }

    fn task(&self) -> Task {
        Task::LanguageModel {
            vocab: self.vocab,
            block: self.block,
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> LlamaModule<B> {
        let (d, hd) = (self.dim, self.head_dim());
        let kv = self.kv_heads * hd;
        LlamaModule {
            embed_tokens: EmbeddingConfig::new(self.vocab, d).init(device),
            layers: (0..self.layers)
                .map(|_| Block {
                    input_layernorm: self.rms(device),
                    self_attn: Attention {
                        q_proj: self.linear(d, d, self.attn_bias, device),
                        k_proj: self.linear(d, kv, self.attn_bias, device),
                        v_proj: self.linear(d, kv, self.attn_bias, device),
                        o_proj: self.linear(d, d, false, device),
                    },
                    post_attention_layernorm: self.rms(device),
                    mlp: Mlp {
                        gate_proj: self.linear(d, self.ffn_dim, false, device),
                        up_proj: self.linear(d, self.ffn_dim, false, device),
                        down_proj: self.linear(self.ffn_dim, d, false, device),
                    },
                    lora: self.block_lora(device),
                })
                .collect(),
            norm: self.rms(device),
            lm_head: (!self.tie).then(|| self.linear(d, self.vocab, false, device)),
        }
    }

    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        let mut flat = vec![0f32; layout.num_params()];
        for unit in &layout.units {
            let mut rng = init::named_stream(seed, &unit.name);
            for p in &layout.params[unit.params.clone()] {
                let out = &mut flat[p.range()];
                // (an adapter's parameters come after its block's: they draw last)
                if lora::init(&p.name, &p.shape, out, seed) {
                    continue;
                }
                match p.name.rsplit('.').next().unwrap_or("") {
                    "gamma" => out.fill(1.0),
                    "bias" => out.fill(0.0),
                    _ => out
                        .iter_mut()
                        .for_each(|v| *v = (0.02 * rng.normal()) as f32),
                }
            }
        }
        flat
    }

    fn decoder<'a, B: Backend>(
        &'a self,
        module: LlamaModule<B>,
        device: B::Device,
        cache: bool,
        fused: bool,
    ) -> Option<Box<dyn TokenDecoder + 'a>> {
        Some(Box::new(
            KvDecoder::new(self, module, device, cache).with_fused(fused),
        ))
    }

    /// torchtitan's and nanoGPT's groups: matrices decay, norms do not.
    fn default_decay(&self) -> DecayRule {
        DecayRule::Matrices
    }

    /// Per token: 6 x the multiply-adds of the matrices (q, k, v, o, the three MLP matrices and
    /// the output layer) plus 12 x layers x dim x block for the attention; times `block` tokens.
    fn flops_per_sample(&self) -> Option<f64> {
        let (d, t, f) = (self.dim as f64, self.block as f64, self.ffn_dim as f64);
        let kv = (self.kv_heads * self.head_dim()) as f64;
        let block = 2.0 * d * d + 2.0 * d * kv + 3.0 * d * f;
        let matrices = self.layers as f64 * block + d * self.vocab as f64;
        Some(t * (6.0 * matrices + 12.0 * self.layers as f64 * d * t))
    }

    fn forward<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = self.embed(m, x, device);
        for b in &m.layers {
            h = self.block(b, h, ctx);
        }
        self.head(m, h, ctx.fused())
    }

    /// The embedding, each block, then the head (`norm` and `lm_head`, or `embed_tokens` again
    /// when tied).
    fn stages(&self, _layout: &ParamLayout) -> Vec<Vec<String>> {
        let mut stages = vec![vec!["embed_tokens".to_string()]];
        stages.extend((0..self.layers).map(|i| vec![format!("layers.{i}")]));
        let out = if self.tie { "embed_tokens" } else { "lm_head" };
        stages.push(vec!["norm".to_string(), out.to_string()]);
        stages
    }

    fn stage_forward<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        match (stage, x) {
            (0, Act::Data(x)) => Act::D3(self.embed(m, x, device)),
            (s, Act::D3(h)) if s <= self.layers => Act::D3(self.block(&m.layers[s - 1], h, ctx)),
            (_, Act::D3(h)) => Act::D2(self.head(m, h, ctx.fused())),
            (_, x) => x,
        }
    }
}

/// Llama's weights as other libraries name and lay them out.
impl WeightAdapter for Llama {
    /// Transformers' names are the module's paths, but for the adapters: PEFT's.
    fn torch_name(&self, path: &str) -> String {
        adapters::torch_name(path).unwrap_or_else(|| path.to_string())
    }

    fn lora(&self) -> Option<&LoraSpec> {
        self.lora.as_ref()
    }

    fn formats(&self) -> Vec<WeightFormat> {
        vec![HF_LLAMA]
    }

    fn format_tensors(
        &self,
        format: WeightFormat,
        layout: &ParamLayout,
        torch: &[External],
    ) -> Vec<External> {
        hf::tensors(format, layout, torch)
    }

    fn format_buffer(&self, format: WeightFormat, name: &str) -> bool {
        // (older transformers saved the rotary frequencies)
        format == HF_LLAMA && name.ends_with(".rotary_emb.inv_freq")
    }

    fn detect_format(&self, tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
        tensors
            .iter()
            .any(|(n, _)| n.starts_with("model.layers.") || *n == "model.embed_tokens.weight")
            .then_some(HF_LLAMA)
    }

    fn hf_config(&self, format: WeightFormat) -> Result<Option<String>, String> {
        Ok((format == HF_LLAMA).then(|| hf::config_json(self)))
    }

    fn hf_config_mismatches(
        &self,
        format: WeightFormat,
        config: &serde_json::Value,
    ) -> Vec<ConfigMismatch> {
        if format == HF_LLAMA {
            hf::mismatches(self, config)
        } else {
            Vec::new()
        }
    }

    fn torch_aliases(&self) -> Vec<(String, String)> {
        if self.tie {
            vec![("lm_head.weight".into(), "embed_tokens.weight".into())]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests;
