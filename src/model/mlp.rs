//! `model.kind = "mlp"`: Linear -> activation -> dropout, repeated, then a final Linear, built
//! from Burn `Linear` layers. Initialised like torch `nn.Linear` (U(-1/sqrt(fan_in),
//! 1/sqrt(fan_in)) for weights and biases), each layer from its own stream of kiln's RNG.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::api::{Family, Forward, Task};
use super::init;
use crate::config::{Activation, ModelConfig};
use crate::params::ParamLayout;

/// The module: `layers.0 ... layers.{n-1}` (paths `layers.<i>.weight`, `layers.<i>.bias`).
#[derive(Module, Debug)]
pub struct MlpModule<B: Backend> {
    pub layers: Vec<Linear<B>>,
}

/// The MLP family for one `[model]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct Mlp {
    /// input, hidden..., classes
    pub sizes: Vec<usize>,
    pub activation: Activation,
    pub dropout: f64,
}

impl Mlp {
    pub fn new(c: &ModelConfig) -> Self {
        let mut sizes = vec![c.input_size];
        sizes.extend(&c.hidden_sizes);
        sizes.push(c.classes);
        Mlp {
            sizes,
            activation: c.activation,
            dropout: c.dropout,
        }
    }
}

impl Family for Mlp {
    type Module<B: Backend> = MlpModule<B>;

    fn kind(&self) -> &str {
        "mlp"
    }

    fn task(&self) -> Task {
        Task::Classification {
            classes: *self.sizes.last().unwrap_or(&1),
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> MlpModule<B> {
        MlpModule {
            layers: self
                .sizes
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
        }
    }

    /// Layer l's weight then bias from the stream ("init", l), as kiln always drew them.
    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        let mut flat = vec![0f32; layout.num_params()];
        for (l, unit) in layout.units.iter().enumerate() {
            let bound = 1.0 / (self.sizes[l] as f64).sqrt();
            let mut rng = init::stream(seed, &[l as u64]);
            init::uniform(&mut rng, &mut flat[unit.range.clone()], bound);
        }
        flat
    }

    fn forward<B: Backend>(
        &self,
        module: &MlpModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = Tensor::<B, 2>::from_data(x, device);
        let last = module.layers.len().saturating_sub(1);
        for (l, layer) in module.layers.iter().enumerate() {
            h = layer.forward(h);
            if l < last {
                h = match self.activation {
                    Activation::Relu => activation::relu(h),
                    Activation::Gelu => activation::gelu(h),
                    Activation::Tanh => activation::tanh(h),
                    Activation::Sigmoid => activation::sigmoid(h),
                };
                h = ctx.dropout(h, self.dropout);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FamilyModel, Model};

    #[test]
    fn layout_is_contiguous_and_named_by_path() {
        let m = FamilyModel::new(Mlp::new(&ModelConfig {
            input_size: 3,
            hidden_sizes: vec![4, 5],
            classes: 2,
            ..ModelConfig::default()
        }));
        let l = m.layout();
        assert_eq!(l.num_params(), 3 * 4 + 4 + 4 * 5 + 5 + 5 * 2 + 2);
        let names: Vec<_> = l.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "layers.0.weight",
                "layers.0.bias",
                "layers.1.weight",
                "layers.1.bias",
                "layers.2.weight",
                "layers.2.bias"
            ]
        );
        assert_eq!(l.params[0].shape, [3, 4]);
        assert_eq!(l.params[1].offset, 12);
        assert_eq!(l.num_units(), 3);
        assert_eq!(l.unit_range(1), 16..41);
        let p = m.init(1);
        assert_eq!(p, m.init(1));
        assert!(p[..12].iter().all(|v| v.abs() <= 1.0 / 3f32.sqrt()));
    }
}
