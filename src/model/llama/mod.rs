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
mod attention;
mod check;
mod hf;
mod keys;
mod moe;

pub use adapters::BlockLora;
pub use hf::HF_LLAMA;
pub use keys::{LayerType, LlamaKeys, RopeScaling, RopeType};
pub use moe::{Expert, MoeSpec, SparseMoe};

use crate::model::ConfigMismatch;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::api::{Act, Family, Forward, ModelError, Task, TokenDecoder};
use super::decode::{At, Incremental, Kv, KvDecoder};
use super::gpt::{dense, MaskCache};
use super::init;
use super::lora::{self, LoraSpec};
use super::portable::{External, WeightFormat};
use crate::config::{DecayRule, Resolved};
use crate::kernels;
use crate::model::WeightAdapter;
use crate::params::ParamLayout;

/// The attention's projections (transformers' `self_attn`): q, k and v apart, or side by side
/// in Phi-3's `qkv_proj`; Qwen3's and Gemma 3's norms of each head's q and k.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: Option<Linear<B>>,
    pub k_proj: Option<Linear<B>>,
    pub v_proj: Option<Linear<B>>,
    pub qkv_proj: Option<Linear<B>>,
    pub o_proj: Linear<B>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
}

/// The MLP: `down(act(gate(x)) * up(x))` (gate and up side by side in Phi-3's `gate_up_proj`).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: Option<Linear<B>>,
    pub up_proj: Option<Linear<B>>,
    pub gate_up_proj: Option<Linear<B>>,
    pub down_proj: Linear<B>,
}

/// One decoder block (Gemma 3's with norms before and after its MLP as well).
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    pub input_layernorm: RmsNorm<B>,
    pub self_attn: Attention<B>,
    pub post_attention_layernorm: RmsNorm<B>,
    pub pre_feedforward_layernorm: Option<RmsNorm<B>>,
    pub post_feedforward_layernorm: Option<RmsNorm<B>>,
    /// Dense blocks' MLP.
    pub mlp: Option<Mlp<B>>,
    /// Mixtral's experts instead.
    pub block_sparse_moe: Option<SparseMoe<B>>,
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

/// Which decoder of the family `model.kind` names: they share the llama's block and differ
/// where transformers' modeling files differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, Qwen2 (`attn_bias`).
    Llama,
    /// Qwen3: per-head RMSNorm on q and k.
    Qwen3,
    /// Gemma 3 (text): scaled embeddings, `(1 + weight)` norms, GeGLU, q/k norms, norms after
    /// the attention and the MLP, sliding layers with their own rotary base.
    Gemma3,
    /// Phi-3: fused `qkv_proj` and `gate_up_proj`.
    Phi3,
    /// Mixtral: a sparse mixture of SwiGLU experts in every block.
    Mixtral,
}

impl Arch {
    /// Every architecture by its `model.kind`.
    pub const ALL: [(&'static str, Arch); 5] = [
        ("llama", Arch::Llama),
        ("qwen3", Arch::Qwen3),
        ("gemma3", Arch::Gemma3),
        ("phi3", Arch::Phi3),
        ("mixtral", Arch::Mixtral),
    ];

    /// The architecture of `model.kind` `kind`.
    pub fn of(kind: &str) -> Option<Arch> {
        Self::ALL.iter().find(|(k, _)| *k == kind).map(|(_, a)| *a)
    }

    /// Its `model.kind`.
    pub fn kind(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("llama", |(k, _)| k)
    }

    /// Whether each head's q and k are RMS-normed before the rotation.
    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Gemma3)
    }
}

/// The llama family for one `[model]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Llama {
    pub arch: Arch,
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
    /// Channels per head.
    pub head_dim: usize,
    /// The sliding layers' window.
    pub sliding_window: Option<usize>,
    /// Whether each layer is a sliding one.
    pub sliding: Vec<bool>,
    /// Gemma 3's sliding layers' rotary base.
    pub rope_local_theta: f64,
    /// What the scores `q . k` are multiplied by (`head_dim^-0.5`; Gemma 3's
    /// `query_pre_attn_scalar^-0.5`).
    pub query_scale: f64,
    /// Mixtral's experts.
    pub moe: Option<MoeSpec>,
    /// The causal masks and rotary tables made so far.
    pub cache: MaskCache,
}

impl Llama {
    /// The llama of `[model]`; its samples must be windows of `block_size + 1` tokens.
    pub fn for_input(r: &Resolved, input: &[usize]) -> Result<Self, ModelError> {
        let c = &r.config.model;
        let arch = Arch::of(&c.kind).unwrap_or(Arch::Llama);
        let k: LlamaKeys = r.model_keys()?;
        let heads = k.heads.unwrap_or(4);
        let dim = k.dim.unwrap_or(128);
        let layers = k.layers.unwrap_or(4);
        let head_dim = k.head_dim.unwrap_or(dim / heads.max(1));
        let sliding = match (&k.layer_types, k.sliding_window) {
            (Some(types), _) => types
                .iter()
                .map(|t| *t == LayerType::SlidingAttention)
                .collect(),
            // Gemma 3: five local layers to one global
            (None, Some(_)) if arch == Arch::Gemma3 => {
                (0..layers).map(|i| (i + 1) % 6 != 0).collect()
            }
            (None, window) => vec![window.is_some(); layers],
        };
        let l = Llama {
            arch,
            vocab: c.vocab_size.unwrap_or(256),
            block: c.block_size.unwrap_or(128),
            layers,
            heads,
            kv_heads: k.kv_heads.unwrap_or(heads),
            dim,
            ffn_dim: k
                .ffn_dim
                .unwrap_or((dim.saturating_mul(8) / 3).div_ceil(32).saturating_mul(32)),
            rope_theta: k.rope_theta.unwrap_or(10_000.0),
            rope_scaling: k.rope_scaling,
            norm_eps: k.norm_eps.unwrap_or(1e-5),
            tie: k.tie_embeddings.unwrap_or(arch == Arch::Gemma3),
            attn_bias: k.attn_bias.unwrap_or(false),
            dropout: c.dropout,
            lora: None,
            head_dim,
            sliding_window: k.sliding_window,
            sliding,
            rope_local_theta: k.rope_local_theta.unwrap_or(10_000.0),
            query_scale: 1.0 / k.query_pre_attn_scalar.unwrap_or(head_dim as f64).sqrt(),
            moe: (arch == Arch::Mixtral).then(|| MoeSpec {
                experts: k.experts.unwrap_or(4),
                top_k: k.experts_per_token.unwrap_or(2),
                aux_coef: k.router_aux_loss_coef.unwrap_or(0.001),
            }),
            cache: MaskCache::default(),
        };
        let names: Vec<&str> = l.adaptable().iter().map(|(m, ..)| *m).collect();
        let defaults: Vec<&str> = adapters::DEFAULT
            .iter()
            .copied()
            .filter(|d| names.contains(d))
            .collect();
        let l = Llama {
            lora: LoraSpec::of(r, &names, &defaults)?,
            ..l
        };
        l.check(r, &k, input)?;
        if let Some(s) = &l.lora {
            s.check(r, &l.adaptable())?;
        }
        Ok(l)
    }

    /// The token embeddings of the ids `x` `[samples, positions]`.
    fn embed<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        x: TensorData,
        device: &B::Device,
        fused: bool,
    ) -> Tensor<B, 3> {
        let ids = Tensor::<B, 2, Int>::from_data(x, device);
        let h = crate::model::gpt::lookup(&m.embed_tokens, ids, fused);
        if self.arch == Arch::Gemma3 {
            // Gemma's embeddings scaled by sqrt(dim), the factor rounded to f32 as transformers'
            h.mul_scalar((self.dim as f32).sqrt())
        } else {
            h
        }
    }

    /// The final RMSNorm and the output layer: logits `[samples * positions, vocab]`.
    fn head<B: Backend>(&self, m: &LlamaModule<B>, h: Tensor<B, 3>, fused: bool) -> Tensor<B, 2> {
        let [n, t, _] = h.dims();
        let h = self.norm(&m.norm, h, fused).reshape([n * t, self.dim]);
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

    fn rms<B: Backend>(&self, width: usize, device: &B::Device) -> RmsNorm<B> {
        RmsNormConfig::new(width)
            .with_epsilon(self.norm_eps)
            .init(device)
    }

    /// One block's modules.
    fn build_block<B: Backend>(&self, device: &B::Device) -> Block<B> {
        let (d, hd, f) = (self.dim, self.head_dim, self.ffn_dim);
        let (q, kv) = (self.heads * hd, self.kv_heads * hd);
        let (fused, gemma) = (self.arch == Arch::Phi3, self.arch == Arch::Gemma3);
        let dense = self.moe.is_none();
        let lin = |i: usize, o: usize, bias: bool| self.linear(i, o, bias, device);
        let split = |i: usize, o: usize, bias: bool, on: bool| on.then(|| lin(i, o, bias));
        Block {
            input_layernorm: self.rms(d, device),
            self_attn: Attention {
                q_proj: split(d, q, self.attn_bias, !fused),
                k_proj: split(d, kv, self.attn_bias, !fused),
                v_proj: split(d, kv, self.attn_bias, !fused),
                qkv_proj: split(d, q + 2 * kv, false, fused),
                o_proj: lin(q, d, false),
                q_norm: self.arch.qk_norm().then(|| self.rms(hd, device)),
                k_norm: self.arch.qk_norm().then(|| self.rms(hd, device)),
            },
            post_attention_layernorm: self.rms(d, device),
            pre_feedforward_layernorm: gemma.then(|| self.rms(d, device)),
            post_feedforward_layernorm: gemma.then(|| self.rms(d, device)),
            mlp: dense.then(|| Mlp {
                gate_proj: split(d, f, false, !fused),
                up_proj: split(d, f, false, !fused),
                gate_up_proj: split(d, 2 * f, false, fused),
                down_proj: lin(f, d, false),
            }),
            block_sparse_moe: self.moe.map(|m| SparseMoe {
                gate: lin(d, m.experts, false),
                experts: (0..m.experts)
                    .map(|_| Expert {
                        w1: lin(d, f, false),
                        w2: lin(f, d, false),
                        w3: lin(d, f, false),
                    })
                    .collect(),
            }),
            lora: self.block_lora(device),
        }
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
        ctx: &mut Forward,
    ) -> Tensor<B, 3> {
        self.embed(m, ids, device, ctx.fused())
    }
    fn block_at<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        i: usize,
        x: Tensor<B, 3>,
        at: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>) {
        let (x, kv, _) = self.block_kv(i, &m.layers[i], x, at, ctx);
        (x, kv)
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
        self.arch.kind()
    }

    fn task(&self) -> Task {
        Task::LanguageModel {
            vocab: self.vocab,
            block: self.block,
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> LlamaModule<B> {
        let d = self.dim;
        LlamaModule {
            embed_tokens: EmbeddingConfig::new(self.vocab, d).init(device),
            layers: (0..self.layers).map(|_| self.build_block(device)).collect(),
            norm: self.rms(d, device),
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
                    // (Gemma's norms multiply by 1 + weight)
                    "gamma" => out.fill(if self.arch == Arch::Gemma3 { 0.0 } else { 1.0 }),
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
    /// (every parameter goes through kiln's kernels, unless dropout switches a block to
    /// Burn's ops)
    fn kernel_params(&self) -> bool {
        self.dropout == 0.0
    }

    fn default_decay(&self) -> DecayRule {
        DecayRule::Matrices
    }

    /// Per token: 6 x the multiply-adds of the matrices (q, k, v, o, the three MLP matrices and
    /// the output layer) plus 12 x layers x dim x block for the attention; times `block` tokens.
    fn flops_per_sample(&self) -> Option<f64> {
        let (d, t, f) = (self.dim as f64, self.block as f64, self.ffn_dim as f64);
        let hd = self.head_dim as f64;
        let (q, kv) = (self.heads as f64 * hd, self.kv_heads as f64 * hd);
        // a token runs top_k experts (and the router)
        let mlp = match &self.moe {
            Some(m) => m.top_k as f64 * 3.0 * d * f + d * m.experts as f64,
            None => 3.0 * d * f,
        };
        let block = 2.0 * d * q + 2.0 * d * kv + mlp;
        let matrices = self.layers as f64 * block + d * self.vocab as f64;
        Some(t * (6.0 * matrices + 12.0 * self.layers as f64 * q * t))
    }

    fn forward<B: Backend>(
        &self,
        m: &LlamaModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = self.embed(m, x, device, ctx.fused());
        for (i, b) in m.layers.iter().enumerate() {
            h = self.block(i, b, h, ctx).0;
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
            (0, Act::Data(x)) => Act::D3(self.embed(m, x, device, ctx.fused())),
            // a mixture of experts' router statistics travel beside the hidden state, summed
            (s, Act::D3(h)) if s <= self.layers => {
                match self.block(s - 1, &m.layers[s - 1], h, ctx) {
                    (h, Some(stats)) => Act::WithStats(h, stats),
                    (h, None) => Act::D3(h),
                }
            }
            (s, Act::WithStats(h, sum)) if s <= self.layers => {
                match self.block(s - 1, &m.layers[s - 1], h, ctx) {
                    (h, Some(stats)) => Act::WithStats(h, sum + stats),
                    (h, None) => Act::WithStats(h, sum),
                }
            }
            (_, Act::D3(h)) => Act::D2(self.head(m, h, ctx.fused())),
            (_, Act::WithStats(h, stats)) => {
                Act::WithLoss(self.head(m, h, ctx.fused()), self.aux_loss(stats))
            }
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
        vec![hf::format_of(self.arch)]
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
        // (older transformers saved the rotary frequencies; a Gemma 3 vision-language
        // checkpoint has its vision tower beside the language model kiln computes, under
        // `model.` when transformers 5 saved its modules' names)
        format == hf::format_of(self.arch)
            && (name.ends_with(".rotary_emb.inv_freq")
                || self.arch == Arch::Gemma3
                    && crate::config::hf_json::VISION_SIDE
                        .iter()
                        .any(|p| name.strip_prefix("model.").unwrap_or(name).starts_with(p)))
    }

    fn detect_format(&self, tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
        let format = hf::format_of(self.arch);
        tensors
            .iter()
            .map(|(n, _)| format.strip(n))
            .any(|n| n.starts_with("model.layers.") || n == "model.embed_tokens.weight")
            .then_some(format)
    }

    fn hf_config(&self, format: WeightFormat) -> Result<Option<String>, String> {
        Ok((format == hf::format_of(self.arch)).then(|| hf::config_json(self)))
    }

    fn hf_config_mismatches(
        &self,
        format: WeightFormat,
        config: &serde_json::Value,
    ) -> Vec<ConfigMismatch> {
        if format == hf::format_of(self.arch) {
            // (a Gemma 3 vision-language config.json: its language model's, `text_config`)
            // (one whose text_config is not a table was refused when the config was read)
            match crate::config::hf_json::language_model(config) {
                Ok(c) => hf::mismatches(self, &c),
                Err(_) => hf::mismatches(self, config),
            }
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
