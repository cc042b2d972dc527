//! Bring your own model: a residual MLP of your own, trained by kiln's command line under every
//! strategy, with checkpoints, resume and sweeps.
//!
//! ```sh
//! cargo run --release --example custom_model -- run my-net.toml
//! ```
//!
//! with `[model] kind = "res-mlp"` and this family's own keys (`width`, `depth`) beside kiln's
//! (`classes`, `dropout`): an unknown key is rejected naming the key and its source.

use std::sync::Arc;

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kiln::model::{init, Act, Family, FamilyModel, Forward, Registry, Task};
use kiln::params::ParamLayout;
use serde::Deserialize;

/// The Burn module: `input`, `blocks.<i>` (each a residual Linear -> ReLU), `head`.
#[derive(Module, Debug)]
struct ResMlpModule<B: Backend> {
    input: Linear<B>,
    blocks: Vec<Linear<B>>,
    head: Linear<B>,
}

/// This family's `[model]` keys.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResMlpKeys {
    /// Width of the residual stream.
    width: usize,
    /// Residual blocks.
    #[serde(default = "two")]
    depth: usize,
    /// Whether the family declares its stages (`input`, each block, `head`), so that fsdp
    /// gathers one at a time and activation checkpointing recomputes one at a time; `false`
    /// runs the whole forward as one stage (same results, fsdp gathers the whole model).
    #[serde(default = "yes")]
    stages: bool,
}

fn yes() -> bool {
    true
}

fn two() -> usize {
    2
}

struct ResMlp {
    features: usize,
    width: usize,
    depth: usize,
    classes: usize,
    dropout: f64,
    staged: bool,
}

impl ResMlp {
    fn input<B: Backend>(
        &self,
        m: &ResMlpModule<B>,
        x: TensorData,
        device: &B::Device,
    ) -> Tensor<B, 2> {
        let rows = x.shape[0];
        let x = TensorData {
            shape: vec![rows, self.features].into(),
            ..x
        };
        relu(m.input.forward(Tensor::<B, 2>::from_data(x, device)))
    }

    fn block<B: Backend>(&self, b: &Linear<B>, h: Tensor<B, 2>, ctx: &mut Forward) -> Tensor<B, 2> {
        h.clone() + ctx.dropout(relu(b.forward(h)), self.dropout)
    }
}

impl Family for ResMlp {
    type Module<B: Backend> = ResMlpModule<B>;

    fn kind(&self) -> &str {
        "res-mlp"
    }

    fn task(&self) -> Task {
        Task::Classification {
            classes: self.classes,
        }
    }

    fn build<B: Backend>(&self, device: &B::Device) -> ResMlpModule<B> {
        ResMlpModule {
            input: LinearConfig::new(self.features, self.width).init(device),
            blocks: (0..self.depth)
                .map(|_| LinearConfig::new(self.width, self.width).init(device))
                .collect(),
            head: LinearConfig::new(self.width, self.classes).init(device),
        }
    }

    /// PyTorch's Linear default, each layer from its own stream keyed by its path.
    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        init::pytorch_default(layout, seed)
    }

    fn forward<B: Backend>(
        &self,
        m: &ResMlpModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let mut h = self.input(m, x, device);
        for b in &m.blocks {
            h = self.block(b, h, ctx);
        }
        m.head.forward(h)
    }

    /// One stage per layer: the layout's units are `input`, `blocks.<i>` and `head`.
    fn stages(&self, layout: &ParamLayout) -> Vec<Vec<String>> {
        if !self.staged {
            return vec![layout.units.iter().map(|u| u.name.clone()).collect()];
        }
        kiln::model::stage_per_unit(layout)
    }

    fn stage_forward<B: Backend>(
        &self,
        m: &ResMlpModule<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        match (stage, x) {
            (0, Act::Data(x)) if !self.staged => Act::D2(self.forward(m, x, device, ctx)),
            (0, Act::Data(x)) => Act::D2(self.input(m, x, device)),
            (s, Act::D2(h)) if s <= self.depth => Act::D2(self.block(&m.blocks[s - 1], h, ctx)),
            (_, Act::D2(h)) => Act::D2(m.head.forward(h)),
            // out of place: kiln reports the shapes
            (_, x) => x,
        }
    }
}

fn main() {
    let mut registry = Registry::builtin();
    registry.register_with_keys::<ResMlpKeys>("res-mlp", |r, input| {
        let keys: ResMlpKeys = r.model_keys()?;
        Ok(Arc::new(FamilyModel::new(ResMlp {
            features: input.iter().product(),
            width: keys.width,
            depth: keys.depth,
            classes: r.config.model.classes,
            dropout: r.config.model.dropout,
            staged: keys.stages,
        })))
    });
    std::process::exit(kiln::cli::main_with(registry));
}
