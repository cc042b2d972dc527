//! `model.kind = "cnn"`: the convolutional net of `scripts/torch_reference.py`'s `cnn`.
//! Each stage of `model.channels` is Conv2d(c_in, c, kernel_size, padding = kernel_size / 2) ->
//! activation (`model.activation`, ReLU by default) -> MaxPool2d(2); then flatten -> the hidden
//! Linear layers (`model.hidden_sizes`, each followed by the activation and dropout) ->
//! `model.classes`. The input shape `[C, H, W]` comes
//! from the data. Initialisation is PyTorch's default for Conv2d and Linear: weights and biases
//! U(-1/sqrt(fan_in), 1/sqrt(fan_in)), each layer from its own stream of kiln's RNG keyed by its
//! path (`convs.0`, `fcs.1`, ...).

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::tensor::backend::Backend;
use burn::tensor::module::max_pool2d;
use burn::tensor::{Tensor, TensorData};

use super::api::{Act, Family, Forward, ModelError, Task};
use super::init;
use super::mlp::activate;
use crate::config::{Activation, Resolved};
use crate::model::WeightAdapter;
use crate::params::ParamLayout;

/// The module: `convs.<i>` (weight `[out, in, k, k]`, bias), then `fcs.<i>` (Burn's Linear
/// weight is `[in, out]`, PyTorch's transpose).
#[derive(Module, Debug)]
pub struct CnnModule<B: Backend> {
    pub convs: Vec<Conv2d<B>>,
    pub fcs: Vec<Linear<B>>,
}

/// The CNN family for one `[model]` section and input shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Cnn {
    /// `[C, H, W]` of one sample.
    pub input: [usize; 3],
    pub channels: Vec<usize>,
    pub kernel_size: usize,
    /// Widths of the Linear layers after flattening: hidden..., classes.
    pub linear: Vec<usize>,
    pub activation: Activation,
    pub dropout: f64,
}

impl Cnn {
    /// The CNN of `[model]` for samples of shape `input` (`[C, H, W]`); every key and the image
    /// shape are checked against each other here, so a bad combination is bad input.
    pub fn for_input(r: &Resolved, input: &[usize]) -> Result<Self, ModelError> {
        let c = &r.config.model;
        if c.channels.is_empty() || c.channels.contains(&0) {
            return Err(r
                .key_error(
                    "model.channels",
                    format!(
                        "`model.channels` = {:?}: a cnn needs at least one stage, each with at least one channel",
                        c.channels
                    ),
                    Some("e.g. channels = [32, 64]".into()),
                )
                .into());
        }
        let k = c.kernel_size.unwrap_or(3);
        if k.is_multiple_of(2) {
            return Err(r
                .key_error(
                    "model.kernel_size",
                    format!("`model.kernel_size` = {k} must be odd (padding keeps the image size)"),
                    Some("use 3 or 5".into()),
                )
                .into());
        }
        let &[ch, h, w] = input else {
            return Err(r
                .key_error(
                    "model.kind",
                    format!(
                        "`model.kind` = \"cnn\" needs image samples [C, H, W], but the data's samples have shape {input:?}"
                    ),
                    Some(
                        "use image data (`data.kind = \"idx\"`, or `data.image = [C, H, W]` for synthetic)"
                            .into(),
                    ),
                )
                .into());
        };
        let stages = c.channels.len() as u32;
        let halve = |v: usize| v.checked_shr(stages).unwrap_or(0);
        let (oh, ow) = (halve(h), halve(w));
        if oh == 0 || ow == 0 {
            return Err(r
                .key_error(
                    "model.channels",
                    format!(
                        "{stages} stages halve a {h}x{w} image to nothing (each MaxPool2d(2) halves it)"
                    ),
                    Some(format!(
                        "use at most {} stage(s) for {h}x{w} images",
                        (h.min(w) as f64).log2().floor() as usize
                    )),
                )
                .into());
        }
        let flat = c.channels.last().copied().unwrap_or(ch) * oh * ow;
        let mut linear = vec![flat];
        linear.extend(&c.hidden_sizes);
        linear.push(c.classes);
        Ok(Cnn {
            input: [ch, h, w],
            channels: c.channels.clone(),
            kernel_size: k,
            linear,
            activation: c.activation,
            dropout: c.dropout,
        })
    }

    fn act<B: Backend, const D: usize>(&self, h: Tensor<B, D>) -> Tensor<B, D> {
        activate(self.activation, h)
    }
}

impl Family for Cnn {
    fn weights(&self) -> &dyn WeightAdapter {
        self
    }

    type Module<B: Backend> = CnnModule<B>;

    fn kind(&self) -> &str {
        "cnn"
    }

    fn task(&self) -> Task {
        Task::Classification {
            classes: *self.linear.last().unwrap_or(&1),
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> CnnModule<B> {
        let k = self.kernel_size;
        let p = k / 2;
        let mut c_in = self.input[0];
        let mut convs = Vec::with_capacity(self.channels.len());
        for &c in &self.channels {
            convs.push(
                Conv2dConfig::new([c_in, c], [k, k])
                    .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                    .init(device),
            );
            c_in = c;
        }
        CnnModule {
            convs,
            fcs: self
                .linear
                .windows(2)
                .map(|w| LinearConfig::new(w[0], w[1]).init(device))
                .collect(),
        }
    }

    /// PyTorch's defaults (`init::pytorch_default`): U(-b, b), b = 1/sqrt(fan_in), where fan_in
    /// is in*k*k for a Conv2d and in for a Linear.
    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        init::pytorch_default(layout, seed)
    }

    /// 6 x multiply-adds of the convolutions (at each stage's resolution) and Linear layers.
    fn flops_per_sample(&self) -> Option<f64> {
        let [mut c_in, mut h, mut w] = self.input;
        let k = self.kernel_size;
        let mut macs = 0usize;
        for &c in &self.channels {
            macs += c_in * c * k * k * h * w;
            (c_in, h, w) = (c, h / 2, w / 2);
        }
        // `linear` starts with the flattened width
        debug_assert_eq!(self.linear.first(), Some(&(c_in * h * w)));
        macs += self.linear.windows(2).map(|l| l[0] * l[1]).sum::<usize>();
        Some(6.0 * macs as f64)
    }

    fn forward<B: Backend>(
        &self,
        module: &CnnModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = Tensor::<B, 4>::from_data(x, device);
        for conv in &module.convs {
            h = self.conv(conv, h);
        }
        let mut h = flatten(h);
        for l in 0..module.fcs.len() {
            h = self.fc(module, l, h, ctx);
        }
        h
    }

    /// One stage per convolution and per Linear layer.
    fn stages(&self, layout: &ParamLayout) -> Vec<Vec<String>> {
        super::api::stage_per_unit(layout)
    }

    fn stage_forward<B: Backend>(
        &self,
        module: &CnnModule<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        let convs = module.convs.len();
        let x = match x {
            Act::Data(x) if stage == 0 => Act::D4(Tensor::<B, 4>::from_data(x, device)),
            x => x,
        };
        match x {
            Act::D4(h) if stage < convs => Act::D4(self.conv(&module.convs[stage], h)),
            Act::D4(h) if stage == convs => Act::D2(self.fc(module, 0, flatten(h), ctx)),
            Act::D2(h) if stage > convs => Act::D2(self.fc(module, stage - convs, h, ctx)),
            // a stage out of place: the engine reports the shapes
            x => x,
        }
    }
}

/// Cnn's weights as other libraries name and lay them out.
impl WeightAdapter for Cnn {
    /// torch's `nn.Sequential` of `torch_baseline.py`: Conv2d, activation, MaxPool2d per stage,
    /// Flatten, then Linear and activation (and Dropout when `model.dropout` > 0) per hidden
    /// layer: `convs.<i>` is module `3i`, `fcs.<j>` module `3 * stages + 1 + 2j` (or `3j`).
    fn torch_name(&self, path: &str) -> String {
        let stages = self.channels.len();
        let per = if self.dropout > 0.0 { 3 } else { 2 };
        let path = super::portable::renumber(path, "convs", |i| 3 * i);
        super::portable::renumber(&path, "fcs", |j| 3 * stages + 1 + per * j)
    }
}

/// `[n, c, h, w]` -> `[n, c * h * w]`.
fn flatten<B: Backend>(h: Tensor<B, 4>) -> Tensor<B, 2> {
    let [n, c, hh, ww] = h.dims();
    h.reshape([n, c * hh * ww])
}

impl Cnn {
    /// A convolution, its activation and a 2x2 max-pool.
    fn conv<B: Backend>(&self, conv: &Conv2d<B>, h: Tensor<B, 4>) -> Tensor<B, 4> {
        max_pool2d(
            self.act(conv.forward(h)),
            [2, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            false,
        )
    }

    /// Linear layer `l`, with its activation and dropout unless it is the last.
    fn fc<B: Backend>(
        &self,
        module: &CnnModule<B>,
        l: usize,
        h: Tensor<B, 2>,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let h = module.fcs[l].forward(h);
        if l + 1 < module.fcs.len() {
            ctx.dropout(self.act(h), self.dropout)
        } else {
            h
        }
    }
}
