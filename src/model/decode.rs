//! One KV-cache decoder for the transformer families (`Family::decoder`): a family whose
//! forward splits into an embedding at given positions, blocks that can keep and extend their
//! keys and values, and a head implements `Incremental`, and `KvDecoder` does the rest.
//! `prefill` runs a context through the model (keeping every block's keys and values with
//! `cache`); `step` appends one token and runs only its position against them; without
//! `cache` each `step` runs the whole context again, for comparison. Logits of the last
//! position, f32.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::api::{Family, Forward, ModelError, TokenDecoder};

/// A block's keys and values so far, `[n, kv heads, positions, head dim]` each.
pub type Kv<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// Where a block runs while decoding: its input starts at position `from`, after the
/// positions `past` holds (none: the input starts the sequence, causally; with `past`, the
/// input is one position); with `keep`, the block also returns the keys and values of every
/// position so far.
pub struct At<B: Backend> {
    pub from: usize,
    pub past: Option<Kv<B>>,
    pub keep: bool,
}

/// A family's forward, split for decoding.
pub trait Incremental: Family {
    /// Positions the model attends over at most (`block_size`).
    fn context_len(&self) -> usize;
    /// Its blocks in `module`.
    fn block_count<B: Backend>(&self, module: &Self::Module<B>) -> usize;
    /// The embeddings of `ids` `[1, t]` at positions `from..from + t`.
    fn embed_at<B: Backend>(
        &self,
        module: &Self::Module<B>,
        ids: TensorData,
        from: usize,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 3>;
    /// Block `i` on `x` where `at` says; the keys and values so far when `at.keep`.
    fn block_at<B: Backend>(
        &self,
        module: &Self::Module<B>,
        i: usize,
        x: Tensor<B, 3>,
        at: At<B>,
        ctx: &mut Forward,
    ) -> (Tensor<B, 3>, Option<Kv<B>>);
    /// The logits `[rows, vocab]` of the hidden states `h` `[n, t, dim]`.
    fn head_of<B: Backend>(
        &self,
        module: &Self::Module<B>,
        h: Tensor<B, 3>,
        fused: bool,
    ) -> Tensor<B, 2>;
}

/// Generation from a family whose parameters are installed once (see the module).
pub struct KvDecoder<'a, F: Incremental, B: Backend> {
    family: &'a F,
    module: F::Module<B>,
    device: B::Device,
    cache: bool,
    /// The ids so far.
    context: Vec<u32>,
    /// Per block: keys and values of every position of `context` (with `cache`).
    kv: Vec<Kv<B>>,
    /// Whether the forwards call the fused kernels (`backend.fused`).
    fused: bool,
}

impl<'a, F: Incremental, B: Backend> KvDecoder<'a, F, B> {
    pub fn new(family: &'a F, module: F::Module<B>, device: B::Device, cache: bool) -> Self {
        KvDecoder {
            family,
            module,
            device,
            cache,
            context: Vec::new(),
            kv: Vec::new(),
            fused: true,
        }
    }

    /// This decoder with the fused kernels on or off (`backend.fused`).
    pub fn with_fused(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }

    /// The whole context through the model (keeping the keys and values with `cache`).
    fn run_all(&mut self) -> Result<Vec<f32>, ModelError> {
        let (f, m) = (self.family, &self.module);
        let t = self.context.len();
        if t == 0 || t > f.context_len() {
            return Err(ModelError::Stage(format!(
                "a context of {t} positions (1 to {} fit)",
                f.context_len()
            )));
        }
        let ids: Vec<i64> = self.context.iter().map(|&i| i64::from(i)).collect();
        let mut ctx = Forward::eval().with_fused(self.fused);
        let mut x = f.embed_at(m, TensorData::new(ids, [1, t]), 0, &self.device, &mut ctx);
        self.kv.clear();
        for i in 0..f.block_count(m) {
            let (y, kv) = f.block_at(
                m,
                i,
                x,
                At {
                    from: 0,
                    past: None,
                    keep: self.cache,
                },
                &mut ctx,
            );
            self.kv.extend(kv);
            x = y;
        }
        self.logits_of(x)
    }

    /// The logits after the last position of `h` `[1, t, dim]`.
    fn logits_of(&self, h: Tensor<B, 3>) -> Result<Vec<f32>, ModelError> {
        let [n, t, d] = h.dims();
        let last = h.slice([0..n, t - 1..t, 0..d]);
        self.family
            .head_of(&self.module, last, self.fused)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ModelError::Data(format!("{e:?}")))
    }
}

impl<F: Incremental, B: Backend> TokenDecoder for KvDecoder<'_, F, B> {
    /// Starts again from `ids` (at most the context length of them): the logits after the last.
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.context = ids.to_vec();
        self.run_all()
    }

    /// Appends `id` (the context must not be full): the logits after it.
    fn step(&mut self, id: u32) -> Result<Vec<f32>, ModelError> {
        let (f, m) = (self.family, &self.module);
        if self.context.len() >= f.context_len() {
            return Err(ModelError::Stage(format!(
                "the context is full ({} positions): prefill a shorter one",
                f.context_len()
            )));
        }
        self.context.push(id);
        if !self.cache || self.kv.is_empty() {
            return self.run_all();
        }
        let at = self.context.len() - 1;
        let mut ctx = Forward::eval().with_fused(self.fused);
        let ids = TensorData::new(vec![i64::from(id)], [1, 1]);
        let mut x = f.embed_at(m, ids, at, &self.device, &mut ctx);
        for (i, kv) in self.kv.iter_mut().enumerate() {
            let (y, next) = f.block_at(
                m,
                i,
                x,
                At {
                    from: at,
                    past: Some(kv.clone()),
                    keep: true,
                },
                &mut ctx,
            );
            if let Some(next) = next {
                *kv = next;
            }
            x = y;
        }
        self.logits_of(x)
    }

    fn context(&self) -> &[u32] {
        &self.context
    }
}
