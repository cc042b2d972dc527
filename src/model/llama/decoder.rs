//! Generation from a llama: `prefill` runs a context through the model (keeping each block's
//! keys and values, `kv_heads` of them, with `cache`), `step` appends one token and runs only its
//! position against the cache; without `cache` each `step` runs the whole context again.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::{Kv, Llama, LlamaModule};
use crate::model::api::{Forward, ModelError, TokenDecoder};

pub struct Decoder<'a, B: Backend> {
    llama: &'a Llama,
    module: LlamaModule<B>,
    device: B::Device,
    cache: bool,
    context: Vec<u32>,
    /// Per block: keys and values of every position of `context` (with `cache`).
    kv: Vec<Kv<B>>,
    fused: bool,
}

impl<B: Backend> TokenDecoder for Decoder<'_, B> {
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.context = ids.to_vec();
        self.run_all()
    }

    fn step(&mut self, id: u32) -> Result<Vec<f32>, ModelError> {
        if self.context.len() >= self.llama.block {
            return Err(ModelError::Stage(format!(
                "the context is full ({} positions): prefill a shorter one",
                self.llama.block
            )));
        }
        self.context.push(id);
        if !self.cache || self.kv.is_empty() {
            return self.run_all();
        }
        let (l, m) = (self.llama, &self.module);
        let at = self.context.len() - 1;
        let mut ctx = Forward::eval().with_fused(self.fused);
        let mut x = l.embed(
            m,
            TensorData::new(vec![i64::from(id)], [1, 1]),
            &self.device,
        );
        for (b, kv) in m.layers.iter().zip(self.kv.iter_mut()) {
            let (y, next) = l.block_kv(b, x, at, Some(kv.clone()), true, &mut ctx);
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

impl<'a, B: Backend> Decoder<'a, B> {
    pub fn new(llama: &'a Llama, module: LlamaModule<B>, device: B::Device, cache: bool) -> Self {
        Decoder {
            llama,
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
        let (l, m) = (self.llama, &self.module);
        let t = self.context.len();
        if t == 0 || t > l.block {
            return Err(ModelError::Stage(format!(
                "a context of {t} positions (1 to {} fit)",
                l.block
            )));
        }
        let ids: Vec<i64> = self.context.iter().map(|&i| i64::from(i)).collect();
        let mut ctx = Forward::eval().with_fused(self.fused);
        let mut x = l.embed(m, TensorData::new(ids, [1, t]), &self.device);
        self.kv.clear();
        for b in &m.layers {
            let (y, kv) = l.block_kv(b, x, 0, None, self.cache, &mut ctx);
            self.kv.extend(kv);
            x = y;
        }
        self.logits_of(x)
    }

    /// The logits after the last position of `h` `[1, t, dim]`.
    fn logits_of(&self, h: Tensor<B, 3>) -> Result<Vec<f32>, ModelError> {
        let [n, t, d] = h.dims();
        let last = h.slice([0..n, t - 1..t, 0..d]);
        self.llama
            .head(&self.module, last, self.fused)
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| ModelError::Data(format!("{e:?}")))
    }
}
