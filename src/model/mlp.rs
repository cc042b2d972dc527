//! A multi-layer perceptron: Linear -> activation -> dropout, repeated, then a final Linear.
//! Initialised like torch `nn.Linear` (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and
//! biases) from kiln's own RNG, so initialisation never touches Burn's global RNG.

use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::ParamSpec;
use crate::config::{Activation, ModelConfig};
use crate::rng::Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    /// input, hidden..., classes
    pub sizes: Vec<usize>,
    pub activation: Activation,
    pub dropout: f64,
    pub layout: Vec<ParamSpec>,
}

/// One layer's tensors, assembled from the flat buffer.
pub struct LayerTensors<B: Backend> {
    pub weight: Tensor<B, 2>,
    pub bias: Tensor<B, 1>,
}

impl Mlp {
    pub fn new(c: &ModelConfig) -> Self {
        let mut sizes = vec![c.input_size];
        sizes.extend(&c.hidden_sizes);
        sizes.push(c.classes);
        let mut layout = Vec::new();
        let mut offset = 0;
        for (i, w) in sizes.windows(2).enumerate() {
            for (name, shape) in [("weight", vec![w[0], w[1]]), ("bias", vec![w[1]])] {
                let spec = ParamSpec {
                    name: format!("layers.{i}.{name}"),
                    shape,
                    offset,
                };
                offset += spec.len();
                layout.push(spec);
            }
        }
        Mlp {
            sizes,
            activation: c.activation,
            dropout: c.dropout,
            layout,
        }
    }

    pub fn num_layers(&self) -> usize {
        self.sizes.len() - 1
    }

    pub fn num_params(&self) -> usize {
        self.layout.last().map(|p| p.offset + p.len()).unwrap_or(0)
    }

    /// torch `nn.Linear` default initialisation, from `seed`.
    pub fn init(&self, seed: u64) -> Vec<f32> {
        let mut flat = vec![0f32; self.num_params()];
        for (l, pair) in self.layout.chunks(2).enumerate() {
            let bound = 1.0 / (self.sizes[l] as f64).sqrt();
            let mut rng = Rng::stream(seed, "init", &[l as u64]);
            for spec in pair {
                for v in &mut flat[spec.range()] {
                    *v = rng.uniform(-bound, bound) as f32;
                }
            }
        }
        flat
    }

    /// The flat range of layer `l` (its weight, then its bias).
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.layout[2 * l].offset..self.layout[2 * l + 1].range().end
    }

    /// Builds layer `l`'s tensors from its flat parameters (weight, then bias), taking the buffer.
    pub fn layer_tensors<B: Backend>(
        &self,
        l: usize,
        mut flat: Vec<f32>,
        device: &B::Device,
    ) -> LayerTensors<B> {
        let (w, b) = (&self.layout[2 * l], &self.layout[2 * l + 1]);
        let bias = flat.split_off(w.len());
        LayerTensors {
            weight: Tensor::from_data(TensorData::new(flat, [w.shape[0], w.shape[1]]), device),
            bias: Tensor::from_data(TensorData::new(bias, [b.shape[0]]), device),
        }
    }

    /// Layer `l`'s tensors from its flat parameters already on the device (weight then bias).
    pub fn layer_tensors_from<B: Backend>(&self, l: usize, flat: Tensor<B, 1>) -> LayerTensors<B> {
        let (w, b) = (&self.layout[2 * l], &self.layout[2 * l + 1]);
        LayerTensors {
            weight: flat
                .clone()
                .slice(0..w.len())
                .reshape([w.shape[0], w.shape[1]]),
            bias: flat.slice(w.len()..w.len() + b.len()),
        }
    }

    /// Builds every layer's tensors from the whole flat buffer.
    pub fn tensors<B: Backend>(&self, flat: &[f32], device: &B::Device) -> Vec<LayerTensors<B>> {
        (0..self.num_layers())
            .map(|l| self.layer_tensors(l, flat[self.layer_range(l)].to_vec(), device))
            .collect()
    }

    /// Forward pass. `masks[l]`, when given, is the (already scaled) dropout mask after hidden
    /// layer l.
    pub fn forward<B: Backend>(
        &self,
        layers: &[LayerTensors<B>],
        x: Tensor<B, 2>,
        masks: Option<&[Tensor<B, 2>]>,
    ) -> Tensor<B, 2> {
        let mut h = x;
        let last = layers.len() - 1;
        for (l, layer) in layers.iter().enumerate() {
            h = h.matmul(layer.weight.clone()) + layer.bias.clone().unsqueeze::<2>();
            if l < last {
                h = match self.activation {
                    Activation::Relu => activation::relu(h),
                    Activation::Gelu => activation::gelu(h),
                    Activation::Tanh => activation::tanh(h),
                    Activation::Sigmoid => activation::sigmoid(h),
                };
                if let Some(m) = masks {
                    h = h * m[l].clone();
                }
            }
        }
        h
    }

    /// Inverted-dropout masks for one micro-batch, drawn from kiln's RNG by `counters`
    /// (seed, step, micro-step, rank), so every rank and every resume reproduces them.
    pub fn dropout_masks(
        &self,
        batch: usize,
        seed: u64,
        counters: &[u64],
    ) -> Option<Vec<Vec<f32>>> {
        if self.dropout <= 0.0 {
            return None;
        }
        let keep = 1.0 - self.dropout;
        let scale = (1.0 / keep) as f32;
        let mut rng = Rng::stream(seed, "dropout", counters);
        Some(
            self.sizes[1..self.sizes.len() - 1]
                .iter()
                .map(|&width| {
                    (0..batch * width)
                        .map(|_| if rng.next_f64() < keep { scale } else { 0.0 })
                        .collect()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_contiguous() {
        let m = Mlp::new(&ModelConfig {
            input_size: 3,
            hidden_sizes: vec![4, 5],
            classes: 2,
            ..ModelConfig::default()
        });
        assert_eq!(m.num_params(), 3 * 4 + 4 + 4 * 5 + 5 + 5 * 2 + 2);
        assert_eq!(m.layout[1].offset, 12);
        let p = m.init(1);
        assert_eq!(p, m.init(1));
        assert!(p[..12].iter().all(|v| v.abs() <= 1.0 / 3f32.sqrt()));
    }
}
