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
use kiln::model::{init, Family, FamilyModel, Forward, Registry, Task};
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
        let rows = x.shape[0];
        let x = TensorData {
            shape: vec![rows, self.features].into(),
            ..x
        };
        let mut h = relu(m.input.forward(Tensor::<B, 2>::from_data(x, device)));
        for b in &m.blocks {
            h = h.clone() + ctx.dropout(relu(b.forward(h)), self.dropout);
        }
        m.head.forward(h)
    }
}

fn main() {
    let mut registry = Registry::builtin();
    registry.register("res-mlp", |r, input| {
        let keys: ResMlpKeys = r.model_keys()?;
        Ok(Arc::new(FamilyModel::new(ResMlp {
            features: input.iter().product(),
            width: keys.width,
            depth: keys.depth,
            classes: r.config.model.classes,
            dropout: r.config.model.dropout,
        })))
    });
    std::process::exit(kiln::cli::main_with(registry));
}
