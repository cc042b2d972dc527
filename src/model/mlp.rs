//! `model.kind = "mlp"`: Linear -> activation -> dropout, repeated, then a final Linear, built
//! from Burn `Linear` layers. Initialised like torch `nn.Linear` (U(-1/sqrt(fan_in),
//! 1/sqrt(fan_in)) for weights and biases), each layer from its own stream of kiln's RNG.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use super::api::{Act, Family, Forward, ModelError, Task};
use super::init;
use crate::config::{Activation, ModelConfig, Resolved};
use crate::model::WeightAdapter;
use crate::params::ParamLayout;

/// `model.activation` applied to `h` (the MLP's and the CNN's hidden layers).
pub fn activate<B: Backend, const D: usize>(a: Activation, h: Tensor<B, D>) -> Tensor<B, D> {
    match a {
        Activation::Relu => activation::relu(h),
        Activation::Gelu => activation::gelu(h),
        Activation::Tanh => activation::tanh(h),
        Activation::Sigmoid => activation::sigmoid(h),
    }
}

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
    /// The MLP of `[model]` for samples of shape `input` (flattened: `model.input_size` must be
    /// their number of values).
    pub fn for_input(r: &Resolved, input: &[usize]) -> Result<Self, ModelError> {
        let c = &r.config.model;
        let values: usize = input.iter().product();
        if values != c.input_size {
            return Err(r
                .key_error(
                    "model.input_size",
                    format!(
                        "`model.input_size` = {} but the data's samples have shape {input:?} ({values} values)",
                        c.input_size
                    ),
                    Some(format!("set `model.input_size = {values}`")),
                )
                .into());
        }
        Ok(Mlp::new(c))
    }

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
    fn weights(&self) -> &dyn WeightAdapter {
        self
    }

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

    /// 6 x multiply-adds of the Linear layers: a forward's 2 FLOPs per multiply-add, a backward
    /// twice the forward.
    fn flops_per_sample(&self) -> Option<f64> {
        let macs: usize = self.sizes.windows(2).map(|w| w[0] * w[1]).sum();
        Some(6.0 * macs as f64)
    }

    fn forward<B: Backend>(
        &self,
        module: &MlpModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = self.input(x, device);
        for l in 0..module.layers.len() {
            h = self.layer(module, l, h, ctx);
        }
        h
    }

    /// One stage per layer.
    fn stages(&self, layout: &ParamLayout) -> Vec<Vec<String>> {
        super::api::stage_per_unit(layout)
    }

    fn stage_forward<B: Backend>(
        &self,
        module: &MlpModule<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        let h = match x {
            Act::Data(x) if stage == 0 => self.input(x, device),
            Act::D2(h) if stage > 0 => h,
            // a stage out of place: the engine reports the shapes
            x => return x,
        };
        Act::D2(self.layer(module, stage, h, ctx))
    }
}

/// Mlp's weights as other libraries name and lay them out.
impl WeightAdapter for Mlp {
    /// torch's `nn.Sequential` of `torch_baseline.py`: Linear, activation (and Dropout when
    /// `model.dropout` > 0) per hidden layer, so `layers.<i>` is module `2i` (or `3i`).
    fn torch_name(&self, path: &str) -> String {
        let per = if self.dropout > 0.0 { 3 } else { 2 };
        super::portable::renumber(path, "layers", |i| i * per)
    }
}

impl Mlp {
    /// Samples of any shape enter flattened.
    fn input<B: Backend>(&self, x: TensorData, device: &B::Device) -> Tensor<B, 2> {
        let rows = x.shape.first().copied().unwrap_or(0);
        let x = TensorData {
            shape: vec![rows, self.sizes[0]].into(),
            ..x
        };
        Tensor::<B, 2>::from_data(x, device)
    }

    /// Layer `l`, with its activation and dropout unless it is the last.
    fn layer<B: Backend>(
        &self,
        module: &MlpModule<B>,
        l: usize,
        h: Tensor<B, 2>,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let h = module.layers[l].forward(h);
        if l + 1 < module.layers.len() {
            ctx.dropout(activate(self.activation, h), self.dropout)
        } else {
            h
        }
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

#[cfg(test)]
mod engine_tests {
    //! The model engine on the MLP. The device path of a micro-step (gradients accumulated as one flat tensor, units
    //! installed from slices of a flat device tensor) against the host path, on a CPU backend;
    //! and training on device parameters (`BurnParams`) against the host optimizer.

    use burn::backend::Flex;

    use burn::tensor::{Tensor, TensorData};

    use super::Mlp;
    use crate::config::{ModelConfig, OptimConfig, OptimKind};
    use crate::model::{Batch, FamilyModel, Input, Model, ModelError, StepKey, Task, UnitParams};
    use crate::params::{
        clip_and_step, BurnParams, DeviceFlat, DeviceParams, DeviceTensor, Grads, Optimizer, RawBuf,
    };

    type Inner = Flex;

    fn no_address(_: &Tensor<Inner, 1>) -> Result<(RawBuf, Box<dyn std::any::Any>), String> {
        Err("a CPU tensor has no device address".into())
    }

    fn model(dropout: f64) -> FamilyModel<Mlp> {
        FamilyModel::new(Mlp::new(&ModelConfig {
            input_size: 4,
            hidden_sizes: vec![6],
            classes: 3,
            dropout,
            ..ModelConfig::default()
        }))
    }

    fn batch() -> Batch {
        Batch {
            x: crate::data::Values::F32((0..20).map(|i| (i as f32 * 0.37).sin()).collect()),
            shape: vec![5, 4],
            y: vec![0, 2, 1, 2, 0],
            starts: None,
        }
    }

    fn input() -> Input {
        Task::Classification { classes: 3 }.input(batch())
    }

    fn flat(v: Vec<f32>) -> Box<dyn DeviceTensor> {
        let n = v.len();
        Box::new(DeviceFlat::<Inner>::new(
            Tensor::from_data(TensorData::new(v, [n]), &Default::default()),
            no_address,
        ))
    }

    fn key() -> StepKey {
        StepKey::new(1, [0, 0, 0])
    }

    #[test]
    fn device_buffers_give_the_host_gradients() {
        let m = model(0.2);
        let compute =
            <burn::backend::Autodiff<burn::backend::Flex> as crate::model::ComputeOn>::compute(
                &m,
                &Default::default(),
                true,
            );
        let params = m.init(3);
        let mut host = Grads::Host(vec![0.0; m.num_params()]);
        let mut dev = Grads::Device(flat(vec![0.0; m.num_params()]));
        let mut losses = Vec::new();
        let layout = m.layout().clone();
        // two micro-steps: the device buffer accumulates like the host one
        for _ in 0..2 {
            let mut from_host = |u: usize| -> Result<UnitParams, ModelError> {
                Ok(UnitParams::Host(params[layout.unit_range(u)].to_vec()))
            };
            losses.push(
                crate::model::forward_backward(
                    compute.as_ref(),
                    &mut from_host,
                    input(),
                    key(),
                    0.5,
                    &mut host,
                    false,
                )
                .unwrap(),
            );
            let mut from_device = |u: usize| -> Result<UnitParams, ModelError> {
                Ok(UnitParams::Device(flat(
                    params[layout.unit_range(u)].to_vec(),
                )))
            };
            losses.push(
                crate::model::forward_backward(
                    compute.as_ref(),
                    &mut from_device,
                    input(),
                    key(),
                    0.5,
                    &mut dev,
                    false,
                )
                .unwrap(),
            );
        }
        assert!(losses.iter().all(|l| *l == losses[0]), "{losses:?}");
        let (h, d) = (host.to_host_vec().unwrap(), dev.to_host_vec().unwrap());
        assert!(h.iter().any(|g| *g != 0.0));
        for (a, b) in h.iter().zip(&d) {
            assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{h:?}\n{d:?}");
        }
        // a different dropout key gives a different loss: the masks are drawn and used
        let mut g = Grads::Host(vec![0.0; m.num_params()]);
        let mut from_host = |u: usize| -> Result<UnitParams, ModelError> {
            Ok(UnitParams::Host(params[layout.unit_range(u)].to_vec()))
        };
        let other = StepKey::new(1, [1, 0, 0]);
        let l2 = crate::model::forward_backward(
            compute.as_ref(),
            &mut from_host,
            input(),
            other,
            0.5,
            &mut g,
            false,
        )
        .unwrap();
        assert_ne!(l2, losses[0]);
    }

    #[test]
    fn training_on_device_parameters_matches_the_host() {
        let device = Default::default();
        let m = model(0.0);
        let compute =
            <burn::backend::Autodiff<burn::backend::Flex> as crate::model::ComputeOn>::compute(
                &m, &device, true,
            );
        let layout = m.layout().clone();
        let n = m.num_params();
        let mut host_opt = Optimizer::new(&OptimConfig {
            kind: OptimKind::Adamw,
            weight_decay: 0.01,
            ..OptimConfig::default()
        });
        let mut hp = m.init(5);
        let mut dev = BurnParams::<Flex>::new(&hp, 0, &host_opt, &device, no_address);
        for _ in 0..3 {
            let mut hg = Grads::Host(vec![0.0; n]);
            let mut from_host = |u: usize| -> Result<UnitParams, ModelError> {
                Ok(UnitParams::Host(hp[layout.unit_range(u)].to_vec()))
            };
            crate::model::forward_backward(
                compute.as_ref(),
                &mut from_host,
                input(),
                key(),
                1.0,
                &mut hg,
                false,
            )
            .unwrap();
            let mut g = hg.to_host_vec().unwrap();
            clip_and_step(&mut host_opt, &mut hp, &mut g, 0.05, Some(0.5));

            let mut dg = Grads::Device(flat(vec![0.0; n]));
            let mut from_device = |u: usize| -> Result<UnitParams, ModelError> {
                Ok(UnitParams::Device(dev.slice(layout.unit_range(u))))
            };
            crate::model::forward_backward(
                compute.as_ref(),
                &mut from_device,
                input(),
                key(),
                1.0,
                &mut dg,
                false,
            )
            .unwrap();
            if let Grads::Device(mut d) = dg {
                dev.step(d.as_mut(), 0.05, Some(0.5)).unwrap();
            }
        }
        let dp = dev.params().unwrap();
        assert_ne!(dp, m.init(5));
        for (a, b) in hp.iter().zip(&dp) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{hp:?}\n{dp:?}");
        }
        assert_eq!(dev.export().unwrap().steps, 3);
    }
}
