//! `model.kind = "gpt"`: a decoder-only transformer with the layout and initialisation of
//! `scripts/torch_reference.py`'s `Gpt` (nanoGPT): token plus learned position
//! embeddings, pre-LayerNorm blocks of causal multi-head self-attention and an MLP of 4*dim with
//! GELU, a final LayerNorm, and an output layer tied to the token embedding
//! (`tie_embeddings`). Dropout (kiln's masks) after the embeddings, on the attention weights
//! and on each residual branch. Initialisation: normal(0, 0.02) for weights and embeddings,
//! normal(0, 0.02/sqrt(2*layers)) for the residual output projections, zero biases, LayerNorm
//! scale 1 and shift 0. Each block is one unit, so fsdp `unit = "layer"` gathers one block at
//! a time.

mod adapters;
mod hf;
mod keys;

pub use adapters::BlockLora;
pub use keys::{GeluKind, GptKeys};

use crate::model::ConfigMismatch;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::{gelu, softmax};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::api::{Act, Family, Forward, ModelError, Task, TokenDecoder};
use super::decode::{At, Incremental, Kv, KvDecoder};
use super::init;
use super::lora::{self, adapted, LoraSpec};
use super::portable::{External, WeightFormat};
use super::sizing::{check_token_data, sized_for_this_machine};
use crate::config::{DecayRule, Resolved};
use crate::kernels;
use crate::model::WeightAdapter;
use crate::params::ParamLayout;

/// GELU's tanh approximation, `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))` (GPT-2's
/// `gelu_new`, PyTorch's `GELU(approximate="tanh")`), in Burn's ops.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    kernels::gelu_tanh_ops(x)
}

/// The LayerNorms' epsilon (PyTorch's and Burn's default).
const LN_EPS: f64 = 1e-5;

/// `ln` of `x`: the fused kernel with `fused` (Burn's op where it does not apply).
fn norm<B: Backend, const D: usize>(
    ln: &LayerNorm<B>,
    x: Tensor<B, D>,
    fused: bool,
) -> Tensor<B, D> {
    if !fused {
        return ln.forward(x);
    }
    kernels::layer_norm(x, ln.gamma.val(), ln.beta.as_ref().map(|b| b.val()), LN_EPS)
}

/// `l` of `x`, plus `residual` when given (`residual + l(x)`): one gemm with `fused`.
pub(in crate::model) fn dense<B: Backend, const D: usize>(
    l: &Linear<B>,
    x: Tensor<B, D>,
    residual: Option<Tensor<B, D>>,
    fused: bool,
) -> Tensor<B, D> {
    if !fused {
        let y = l.forward(x);
        return match residual {
            Some(r) => r + y,
            None => y,
        };
    }
    kernels::linear(
        x,
        l.weight.val(),
        l.bias.as_ref().map(|b| b.val()),
        residual,
    )
}

/// One pre-LayerNorm transformer block.
#[derive(Module, Debug)]
pub struct BlockModule<B: Backend> {
    pub ln_1: LayerNorm<B>,
    /// q, k and v in one projection `[dim, 3 * dim]`.
    pub c_attn: Linear<B>,
    /// The attention's output projection (residual).
    pub c_proj: Linear<B>,
    pub ln_2: LayerNorm<B>,
    pub mlp_fc: Linear<B>,
    /// The MLP's output projection (residual).
    pub mlp_proj: Linear<B>,
    /// LoRA adapters of this block's modules (`[model.lora]`), after its own parameters.
    pub lora: Option<BlockLora<B>>,
}

/// The module: `wte`, `wpe`, `blocks.<i>`, `ln_f` (and `lm_head` when not tied).
#[derive(Module, Debug)]
pub struct GptModule<B: Backend> {
    pub wte: Embedding<B>,
    pub wpe: Embedding<B>,
    pub blocks: Vec<BlockModule<B>>,
    pub ln_f: LayerNorm<B>,
    pub lm_head: Option<Linear<B>>,
}

/// The GPT family for one `[model]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpt {
    pub vocab: usize,
    pub block: usize,
    pub layers: usize,
    pub heads: usize,
    pub dim: usize,
    pub bias: bool,
    pub tie: bool,
    /// The MLP's GELU is the tanh approximation (GPT-2's `gelu_new`), not the exact one.
    pub gelu_tanh: bool,
    pub dropout: f64,
    /// LoRA adapters (`[model.lora]` with a rank): each block's targeted modules get one.
    pub lora: Option<LoraSpec>,
    /// The causal masks made so far, one per backend, device, length and dtype.
    pub masks: MaskCache,
}

/// Causal masks built once per shape on the device (a step of a gpt reuses them instead of
/// uploading one per block and forward), one per thread: a rank's autodiff graphs never share
/// a tensor with another rank's.
#[derive(Default, Clone)]
pub struct MaskCache(
    std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<MaskKey, Box<dyn std::any::Any + Send>>>,
    >,
);

/// What a cached tensor is (`"mask"`, a family's own name), and its backend, thread, device,
/// length and dtype.
type MaskKey = (
    &'static str,
    std::any::TypeId,
    std::thread::ThreadId,
    String,
    usize,
    String,
);

impl std::fmt::Debug for MaskCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MaskCache")
    }
}

impl PartialEq for MaskCache {
    /// (a cache: any two are equal)
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// `e`'s rows of `ids`: with `fused`, kiln's embedding kernel (whose backward keeps only the
/// ids), else Burn's.
pub(in crate::model) fn lookup<B: Backend>(
    e: &Embedding<B>,
    ids: Tensor<B, 2, Int>,
    fused: bool,
) -> Tensor<B, 3> {
    if fused {
        if let Some(y) = crate::kernels::embedding(e.weight.val(), ids.clone()) {
            return y;
        }
    }
    e.forward(ids)
}

impl MaskCache {
    /// The additive causal mask `[1, 1, t, t]` (0 where position i may attend to j <= i, -1e9
    /// above the diagonal) in the device's float dtype, made once.
    pub(in crate::model) fn get<B: Backend>(&self, t: usize, device: &B::Device) -> Tensor<B, 4> {
        self.cached("mask", t, device, || {
            let mask: Vec<f32> = (0..t * t)
                .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
                .collect();
            TensorData::new(mask, [1, 1, t, t])
        })
    }

    /// The additive mask of `ctx`'s causal attention over `n` rows of `t` positions: over
    /// packed rows the block-diagonal one (`Forward::document_mask`, `[n, 1, t, t]`), else the
    /// causal mask (`get`, `[1, 1, t, t]`, made once).
    pub(in crate::model) fn attention_mask<B: Backend>(
        &self,
        ctx: &Forward,
        (n, t): (usize, usize),
        device: &B::Device,
    ) -> Tensor<B, 4> {
        ctx.document_mask(n, t, device)
            .unwrap_or_else(|| self.get(t, device))
    }

    /// The values called `name` for length `t` (a kernel's table), made by `make` once.
    pub(in crate::model) fn values(
        &self,
        name: &'static str,
        t: usize,
        make: impl FnOnce() -> Vec<f32>,
    ) -> std::sync::Arc<[f32]> {
        let key = (
            name,
            std::any::TypeId::of::<std::sync::Arc<[f32]>>(),
            std::thread::current().id(),
            String::new(),
            t,
            String::new(),
        );
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = cache
            .get(&key)
            .and_then(|v| v.downcast_ref::<std::sync::Arc<[f32]>>())
        {
            return v.clone();
        }
        let made: std::sync::Arc<[f32]> = make().into();
        cache.insert(key, Box::new(made.clone()));
        made
    }

    /// The tensor called `name` for length `t` on `device`, made from `make`'s values once.
    pub(in crate::model) fn cached<B: Backend, const D: usize>(
        &self,
        name: &'static str,
        t: usize,
        device: &B::Device,
        make: impl FnOnce() -> TensorData,
    ) -> Tensor<B, D> {
        let dtype = burn::tensor::get_device_settings::<B>(device).float_dtype;
        let key = (
            name,
            std::any::TypeId::of::<B>(),
            std::thread::current().id(),
            format!("{device:?}"),
            t,
            format!("{dtype:?}"),
        );
        let mut cache = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache
            .get(&key)
            .and_then(|m| m.downcast_ref::<Tensor<B, D>>())
        {
            return m.clone();
        }
        let made = Tensor::<B, D>::from_data(make(), device);
        cache.insert(key, Box::new(made.clone()));
        made
    }
}

impl Gpt {
    /// The GPT of `[model]`; its samples must be windows of `block_size + 1` tokens.
    pub fn for_input(r: &Resolved, input: &[usize]) -> Result<Self, ModelError> {
        let c = &r.config.model;
        let k: GptKeys = r.model_keys()?;
        let g = Gpt {
            vocab: c.vocab_size.unwrap_or(256),
            block: c.block_size.unwrap_or(128),
            layers: k.layers.unwrap_or(4),
            heads: k.heads.unwrap_or(4),
            dim: k.dim.unwrap_or(128),
            bias: k.bias.unwrap_or(true),
            tie: k.tie_embeddings.unwrap_or(true),
            gelu_tanh: k.gelu == Some(GeluKind::Tanh),
            dropout: c.dropout,
            lora: LoraSpec::of(r, &adapters::TARGETS, &adapters::DEFAULT)?,
            masks: MaskCache::default(),
        };
        if let Some(s) = &g.lora {
            s.check(r, &g.adaptable())?;
        }
        let err = |key: &str, message: String, help: &str| -> ModelError {
            r.key_error(key, message, Some(help.to_string())).into()
        };
        let range = |key: &str, message: String, help: &str| -> ModelError {
            r.range_error(key, message, Some(help.to_string())).into()
        };
        for (key, v) in [
            ("model.block_size", g.block),
            ("model.layers", g.layers),
            ("model.heads", g.heads),
            ("model.dim", g.dim),
            ("model.vocab_size", g.vocab),
        ] {
            if v == 0 {
                return Err(range(
                    key,
                    format!("`{key}` = 0 is out of range: must be at least 1"),
                    "a gpt needs at least one of each",
                ));
            }
        }
        g.sized_for_this_machine(r)?;
        if !g.dim.is_multiple_of(g.heads) {
            return Err(err(
                "model.dim",
                format!(
                    "`model.dim` = {} is not a multiple of `model.heads` = {}",
                    g.dim, g.heads
                ),
                "every head gets dim / heads channels; change one of them",
            ));
        }
        check_token_data(r, "gpt", g.vocab, g.block, input)?;
        Ok(g)
    }

    /// The parameters its sizes give, counted before anything is built.
    fn param_count(&self) -> u128 {
        let (d, v, t, l) = (
            self.dim as u128,
            self.vocab as u128,
            self.block as u128,
            self.layers as u128,
        );
        let bias = u128::from(self.bias);
        // LayerNorms, attention (qkv and its projection), MLP (4x): weights and biases
        let block = 12 * d * d + bias * 9 * d + 2 * d * (1 + bias);
        let head = if self.tie { 0 } else { v * d };
        v * d + t * d + l * block + d * (1 + bias) + head + self.adapter_count()
    }

    fn sized_for_this_machine(&self, r: &Resolved) -> Result<(), ModelError> {
        sized_for_this_machine(
            r,
            "gpt",
            self.param_count(),
            &[
                ("model.layers", self.layers, 4),
                ("model.dim", self.dim, 128),
                ("model.vocab_size", self.vocab, 256),
            ],
        )
    }

    fn ln<B: Backend>(&self, device: &B::Device) -> LayerNorm<B> {
        LayerNormConfig::new(self.dim)
            .with_epsilon(LN_EPS)
            .with_bias(self.bias)
            .init(device)
    }

    fn linear<B: Backend>(&self, d_in: usize, d_out: usize, device: &B::Device) -> Linear<B> {
        LinearConfig::new(d_in, d_out)
            .with_bias(self.bias)
            .init(device)
    }

    fn block<B: Backend>(
        &self,
        b: &BlockModule<B>,
        x: Tensor<B, 3>,
        ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        self.block_kv(b, x, None, false, ctx).0
    }

    /// Block `b` on `x` `[n, t, dim]`, the positions after those whose keys and values `past`
    /// holds (`[n, heads, p, hd]` each; none: `x` starts the sequence, and its positions attend
    /// causally among themselves; with `past`, `x` is one position that attends to all). With
    /// `keep`, also returns the keys and values of every position so far (a decoder's cache).
    ///
    /// With `ctx.fused()` (and no dropout drawn) the LayerNorms, the linear layers with their
    /// residuals, GELU and the causal attention are kiln's kernels (`kernels`), which run on flex
    /// in f32 and are Burn's ops elsewhere.
    fn block_kv<B: Backend>(
        &self,
        b: &BlockModule<B>,
        x: Tensor<B, 3>,
        past: Option<Kv<B>>,
        keep: bool,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>) {
        let fused = ctx.fused() && !ctx.drops(self.dropout);
        let h = norm(&b.ln_1, x.clone(), fused);
        let qkv = adapted(
            &b.c_attn,
            self.adapter(b, |l| &l.c_attn),
            h,
            None,
            fused,
            ctx,
        );
        let whole = if fused && past.is_none() && !keep {
            kernels::document_attention(qkv.clone(), self.heads, ctx.segments().cloned())
        } else {
            None
        };
        let (y, kv) = match whole {
            Some(y) => (y, None),
            None => {
                let (y, kv) = self.attention(qkv, past, &x.device(), ctx);
                (y, keep.then_some(kv))
            }
        };
        let proj = self.adapter(b, |l| &l.c_proj);
        let x = if fused {
            adapted(&b.c_proj, proj, y, Some(x), true, ctx)
        } else {
            let y = adapted(&b.c_proj, proj, y, None, false, ctx);
            x + ctx.dropout(y, self.dropout)
        };
        let h = norm(&b.ln_2, x.clone(), fused);
        let h = adapted(
            &b.mlp_fc,
            self.adapter(b, |l| &l.mlp_fc),
            h,
            None,
            fused,
            ctx,
        );
        let h = if fused {
            kernels::gelu(h, self.gelu_tanh)
        } else if self.gelu_tanh {
            gelu_tanh(h)
        } else {
            gelu(h)
        };
        let proj = self.adapter(b, |l| &l.mlp_proj);
        let x = if fused {
            adapted(&b.mlp_proj, proj, h, Some(x), true, ctx)
        } else {
            let h = adapted(&b.mlp_proj, proj, h, None, false, ctx);
            x + ctx.dropout(h, self.dropout)
        };
        (x, kv)
    }

    /// The attention in Burn's ops from the projection `qkv` `[n, t, 3 dim]`: the heads'
    /// outputs side by side `[n, t, dim]`, and the keys and values of every position so far
    /// (`past`'s and `qkv`'s).
    fn attention<B: Backend>(
        &self,
        qkv: Tensor<B, 3>,
        past: Option<Kv<B>>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, (Tensor<B, 4>, Tensor<B, 4>)) {
        let [n, t, three] = qkv.dims();
        let d = three / 3;
        let (h, hd) = (self.heads, d / self.heads);
        let split = |i: usize| {
            qkv.clone()
                .slice([0..n, 0..t, i * d..(i + 1) * d])
                .reshape([n, t, h, hd])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (split(0), split(1), split(2));
        let (k, v, causal) = match past {
            Some((pk, pv)) => (
                Tensor::cat(vec![pk, k], 2),
                Tensor::cat(vec![pv, v], 2),
                false,
            ),
            None => (k, v, true),
        };
        let att = q
            .matmul(k.clone().swap_dims(2, 3))
            .div_scalar((hd as f64).sqrt());
        let att = if causal {
            // position i attends to positions <= i (of its document, over packed rows)
            att + self.masks.attention_mask::<B>(ctx, (n, t), device)
        } else {
            att
        };
        let att = ctx.dropout(softmax(att, 3), self.dropout);
        let y = att.matmul(v.clone()).swap_dims(1, 2).reshape([n, t, d]);
        (y, (k, v))
    }

    /// Token plus position embeddings of the ids `x` `[samples, positions]`.
    fn embed<B: Backend>(
        &self,
        m: &GptModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        self.embed_at(m, x, 0, device, ctx)
    }

    /// `embed` of ids at positions `from`, `from + 1`, ...
    fn embed_at<B: Backend>(
        &self,
        m: &GptModule<B>,
        x: TensorData,
        from: usize,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        let idx = Tensor::<B, 2, Int>::from_data(x, device);
        let [n, t] = idx.dims();
        // packed rows: each document's positions start at 0
        let pos = match ctx.positions(n, t).filter(|_| from == 0) {
            Some(p) => Tensor::<B, 2, Int>::from_data(TensorData::new(p, [n, t]), device),
            None => {
                Tensor::<B, 1, Int>::arange(from as i64..(from + t) as i64, device).reshape([1, t])
            }
        };
        let fused = ctx.fused();
        let h = lookup(&m.wte, idx, fused) + lookup(&m.wpe, pos, fused);
        ctx.dropout(h, self.dropout)
    }

    /// The final LayerNorm and the output layer: logits `[samples * positions, vocab]`. With
    /// `fused`, the tied output layer reads `wte` through transposed strides (see
    /// `kernels::linear`).
    fn head<B: Backend>(&self, m: &GptModule<B>, h: Tensor<B, 3>, fused: bool) -> Tensor<B, 2> {
        let [n, t, _] = h.dims();
        let h = norm(&m.ln_f, h, fused).reshape([n * t, self.dim]);
        match &m.lm_head {
            Some(head) => dense(head, h, None, fused),
            None if fused => kernels::linear(h, m.wte.weight.val().transpose(), None, None),
            None => h.matmul(m.wte.weight.val().transpose()),
        }
    }
}

impl Incremental for Gpt {
    fn context_len(&self) -> usize {
        self.block
    }
    fn block_count<B: Backend>(&self, m: &GptModule<B>) -> usize {
        m.blocks.len()
    }
    fn embed_at<B: Backend>(
        &self,
        m: &GptModule<B>,
        ids: TensorData,
        from: usize,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        Gpt::embed_at(self, m, ids, from, device, ctx)
    }
    fn block_at<B: Backend>(
        &self,
        m: &GptModule<B>,
        i: usize,
        x: Tensor<B, 3>,
        at: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>) {
        // (positions are in the embeddings)
        self.block_kv(&m.blocks[i], x, at.past, at.keep, ctx)
    }
    fn head_of<B: Backend>(&self, m: &GptModule<B>, h: Tensor<B, 3>, fused: bool) -> Tensor<B, 2> {
        self.head(m, h, fused)
    }
}

impl Family for Gpt {
    fn weights(&self) -> &dyn WeightAdapter {
        self
    }

    type Module<B: Backend> = GptModule<B>;

    fn kind(&self) -> &str {
        "gpt"
    }

    fn task(&self) -> Task {
        Task::LanguageModel {
            vocab: self.vocab,
            block: self.block,
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> GptModule<B> {
        let d = self.dim;
        GptModule {
            wte: EmbeddingConfig::new(self.vocab, d).init(device),
            wpe: EmbeddingConfig::new(self.block, d).init(device),
            blocks: (0..self.layers)
                .map(|_| BlockModule {
                    ln_1: self.ln(device),
                    c_attn: self.linear(d, 3 * d, device),
                    c_proj: self.linear(d, d, device),
                    ln_2: self.ln(device),
                    mlp_fc: self.linear(d, 4 * d, device),
                    mlp_proj: self.linear(4 * d, d, device),
                    lora: self.block_lora(device),
                })
                .collect(),
            ln_f: self.ln(device),
            lm_head: (!self.tie).then(|| {
                LinearConfig::new(d, self.vocab)
                    .with_bias(false)
                    .init(device)
            }),
        }
    }

    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        let mut flat = vec![0f32; layout.num_params()];
        let residual = 0.02 / ((2 * self.layers) as f64).sqrt();
        for unit in &layout.units {
            let mut rng = init::named_stream(seed, &unit.name);
            for p in &layout.params[unit.params.clone()] {
                let out = &mut flat[p.range()];
                // (an adapter's parameters come after its block's: they draw last)
                if lora::init(&p.name, &p.shape, out, seed) {
                    continue;
                }
                let leaf = p.name.rsplit('.').next().unwrap_or("");
                let layer = p.name.rsplit('.').nth(1).unwrap_or("");
                match leaf {
                    // LayerNorm scale
                    "gamma" => out.fill(1.0),
                    // LayerNorm shift and Linear biases
                    "beta" | "bias" => out.fill(0.0),
                    _ => {
                        let std = if layer == "c_proj" || layer == "mlp_proj" {
                            residual
                        } else {
                            0.02
                        };
                        for v in out {
                            *v = (std * rng.normal()) as f32;
                        }
                    }
                }
            }
        }
        flat
    }

    fn decoder<'a, B: Backend>(
        &'a self,
        module: GptModule<B>,
        device: B::Device,
        cache: bool,
        fused: bool,
    ) -> Option<Box<dyn TokenDecoder + 'a>> {
        Some(Box::new(
            KvDecoder::new(self, module, device, cache).with_fused(fused),
        ))
    }

    /// nanoGPT's groups: matrices decay, biases, norms and nothing else of fewer dimensions.
    /// (every parameter goes through kiln's kernels, unless dropout switches a block to
    /// Burn's ops)
    fn kernel_params(&self) -> bool {
        self.dropout == 0.0
    }

    fn default_decay(&self) -> DecayRule {
        DecayRule::Matrices
    }

    /// Per token, nanoGPT's estimate: 6 x the multiply-adds of the matrices (12 dim^2 per block
    /// and the output layer) plus 12 x layers x dim x block for the attention; times `block`
    /// tokens per sample.
    fn flops_per_sample(&self) -> Option<f64> {
        let (d, t) = (self.dim as f64, self.block as f64);
        let matrices = self.layers as f64 * 12.0 * d * d + d * self.vocab as f64;
        Some(t * (6.0 * matrices + 12.0 * self.layers as f64 * d * t))
    }

    fn forward<B: Backend>(
        &self,
        m: &GptModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = self.embed(m, x, device, ctx);
        for b in &m.blocks {
            h = self.block(b, h, ctx);
        }
        self.head(m, h, ctx.fused())
    }

    /// The embeddings (`wte`, `wpe`), each block, then the head (`ln_f` and `lm_head`, or `wte`
    /// again when tied: the tied weight is gathered for both uses and its gradients summed).
    fn stages(&self, _layout: &ParamLayout) -> Vec<Vec<String>> {
        let mut stages = vec![vec!["wte".to_string(), "wpe".to_string()]];
        stages.extend((0..self.layers).map(|i| vec![format!("blocks.{i}")]));
        let out = if self.tie { "wte" } else { "lm_head" };
        stages.push(vec!["ln_f".to_string(), out.to_string()]);
        stages
    }

    fn stage_forward<B: Backend>(
        &self,
        m: &GptModule<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        match (stage, x) {
            (0, Act::Data(x)) => Act::D3(self.embed(m, x, device, ctx)),
            (s, Act::D3(h)) if s <= self.layers => Act::D3(self.block(&m.blocks[s - 1], h, ctx)),
            (_, Act::D3(h)) => Act::D2(self.head(m, h, ctx.fused())),
            // a stage out of place: the engine reports the shapes
            (_, x) => x,
        }
    }
}

/// Gpt's weights as other libraries name and lay them out.
impl WeightAdapter for Gpt {
    /// nanoGPT's names as in `torch_baseline.py`: the block MLP is `mlp.0` and `mlp.2` of an
    /// `nn.Sequential(Linear, GELU, Linear)`.
    fn torch_name(&self, path: &str) -> String {
        // an adapter is named after the module it adapts (`blocks.0.c_attn.lora_A.weight`)
        let path = match adapters::adapted_module(path) {
            Some((module, rest)) => format!("{module}.{rest}"),
            None => path.to_string(),
        };
        path.replacen(".mlp_fc.", ".mlp.0.", 1)
            .replacen(".mlp_proj.", ".mlp.2.", 1)
    }

    fn lora(&self) -> Option<&LoraSpec> {
        self.lora.as_ref()
    }

    fn formats(&self) -> Vec<WeightFormat> {
        hf::FORMATS.to_vec()
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
        hf::FORMATS.contains(&format) && hf::gpt2_buffer(name)
    }

    fn detect_format(&self, tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
        hf::detect(tensors)
    }

    fn hf_config(&self, format: WeightFormat) -> Result<Option<String>, String> {
        match format {
            hf::HF_GPT2 => hf::config_json(self).map(Some),
            _ => Ok(None),
        }
    }

    fn hf_config_mismatches(
        &self,
        format: WeightFormat,
        config: &serde_json::Value,
    ) -> Vec<ConfigMismatch> {
        match format {
            hf::HF_GPT2 => hf::mismatches(self, config),
            _ => Vec::new(),
        }
    }

    /// A tied output layer is `lm_head.weight` in PyTorch's state dict too.
    fn torch_aliases(&self) -> Vec<(String, String)> {
        if self.tie {
            vec![("lm_head.weight".into(), "wte.weight".into())]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    //! The attention is causal: a position's logits depend on the tokens up to it only.

    use burn::backend::{Autodiff, Flex};

    use super::*;
    use crate::data::Values;
    use crate::model::{ComputeOn, FamilyModel, Model};

    /// The count `sized_for_this_machine` checks before building is the built model's.
    #[test]
    fn the_parameters_counted_before_the_build_are_the_models() {
        for (bias, tie) in [(true, true), (false, true), (true, false), (false, false)] {
            let gpt = Gpt {
                vocab: 300,
                block: 8,
                layers: 3,
                heads: 2,
                dim: 16,
                bias,
                tie,
                gelu_tanh: false,
                dropout: 0.0,
                lora: None,
                masks: MaskCache::default(),
            };
            let counted = gpt.param_count();
            let m = FamilyModel::new(gpt);
            assert_eq!(counted, m.num_params() as u128, "bias {bias}, tied {tie}");
        }
    }

    /// A gpt of two blocks of 16 over positions up to 8.
    fn tiny(vocab: usize) -> Gpt {
        Gpt {
            vocab,
            block: 8,
            layers: 2,
            heads: 2,
            dim: 16,
            bias: true,
            tie: true,
            gelu_tanh: false,
            dropout: 0.0,
            lora: None,
            masks: MaskCache::default(),
        }
    }

    #[test]
    fn a_later_token_never_changes_earlier_logits() {
        let m = FamilyModel::new(tiny(256));
        let compute = <Autodiff<Flex> as ComputeOn>::compute(&m, &Default::default(), true);
        let params = m.init(3);
        let a = compute
            .logits(&params, &Values::Tokens(vec![7, 8, 9, 10]), &[1, 4])
            .unwrap();
        let b = compute
            .logits(&params, &Values::Tokens(vec![7, 8, 9, 200]), &[1, 4])
            .unwrap();
        assert_eq!(a.len(), 4 * 256);
        assert_eq!(a[..3 * 256], b[..3 * 256], "positions before the change");
        assert_ne!(a[3 * 256..], b[3 * 256..], "the changed position");
        // and a prefix sees exactly what the longer context saw at its positions
        let c = compute
            .logits(&params, &Values::Tokens(vec![7, 8]), &[1, 2])
            .unwrap();
        for (x, y) in c.iter().zip(&a[..2 * 256]) {
            assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
        }
    }

    #[test]
    fn packed_documents_get_their_own_logits() {
        crate::model::packed_tests::each_document_gets_its_own_logits(tiny(32), 32);
    }
}
