//! The layout and installation rules on a family with state (BatchNorm's running
//! statistics), not only parameters.

use crate::params::Grads;
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};

use super::*;

#[derive(Module, Debug)]
struct NetModule<B: Backend> {
    fc: Linear<B>,
    norm: BatchNorm<B>,
}

struct Net;

impl Family for Net {
    type Module<B: Backend> = NetModule<B>;
    fn kind(&self) -> &str {
        "net"
    }
    fn task(&self) -> Task {
        Task::Classification { classes: 3 }
    }
    fn build<B: Backend>(&self, device: &B::Device) -> NetModule<B> {
        NetModule {
            fc: LinearConfig::new(4, 3).init(device),
            norm: BatchNormConfig::new(3).init(device),
        }
    }
    fn init(&self, layout: &ParamLayout, _seed: u64) -> Vec<f32> {
        (0..layout.num_params())
            .map(|i| (i as f32 * 0.1).sin())
            .collect()
    }
    fn forward<B: Backend>(
        &self,
        m: &NetModule<B>,
        x: TensorData,
        device: &B::Device,
        _ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        let h = m.fc.forward(Tensor::<B, 2>::from_data(x, device));
        let [b, c] = h.dims();
        m.norm.forward(h.reshape([b, c, 1])).reshape([b, c])
    }
}

#[test]
fn running_statistics_are_state_and_every_parameter_is_installed_and_trained() {
    let m = FamilyModel::new(Net);
    let names: Vec<_> = m.layout().params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["fc.weight", "fc.bias", "norm.gamma", "norm.beta"]);
    let units: Vec<_> = m.layout().units.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(units, ["fc", "norm"]);
    let compute =
        <burn::backend::Autodiff<burn::backend::Flex> as crate::model::ComputeOn>::compute(
            &m,
            &Default::default(),
            true,
        );
    let params = m.init(0);
    let layout = m.layout().clone();
    let mut source = |u: usize| -> Result<UnitParams, ModelError> {
        Ok(UnitParams::Host(params[layout.unit_range(u)].to_vec()))
    };
    let mut grads = Grads::Host(vec![0.0; m.num_params()]);
    let batch = Batch {
        x: Values::F32((0..16).map(|i| (i as f32 * 0.7).cos()).collect()),
        shape: vec![4, 4],
        y: vec![0, 1, 2, 1],
        starts: None,
    };
    let loss = crate::model::forward_backward(
        compute.as_ref(),
        &mut source,
        m.task().input(batch.clone()),
        StepKey::new(0, [0; 3]),
        1.0,
        &mut grads,
        false,
    )
    .unwrap();
    assert!(loss.is_finite());
    let g = grads.to_host_vec().unwrap();
    // gamma and beta get gradients like the linear layer does
    for p in &m.layout().params {
        assert!(
            g[p.range()].iter().any(|v| *v != 0.0),
            "{} has no gradient",
            p.name
        );
    }
    let out = compute
        .evaluate(&params, &mut std::iter::once(batch))
        .unwrap();
    assert_eq!(out.losses.len(), 4);
}

#[test]
fn a_unit_of_the_wrong_size_is_an_error() {
    let m = FamilyModel::new(Net);
    let compute =
        <burn::backend::Autodiff<burn::backend::Flex> as crate::model::ComputeOn>::compute(
            &m,
            &Default::default(),
            true,
        );
    let mut short =
        |_u: usize| -> Result<UnitParams, ModelError> { Ok(UnitParams::Host(vec![0.0; 3])) };
    let mut g = Grads::Host(vec![0.0; m.num_params()]);
    let batch = Batch {
        x: Values::F32(vec![0.0; 8]),
        shape: vec![2, 4],
        y: vec![0, 1],
        starts: None,
    };
    let key = StepKey::new(0, [0; 3]);
    let e = crate::model::forward_backward(
        compute.as_ref(),
        &mut short,
        m.task().input(batch),
        key,
        1.0,
        &mut g,
        false,
    )
    .err()
    .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some("unit 0 has 3 parameters, the layout says 15")
    );
}

/// `Net` with the stages it is given.
struct Staged(Vec<Vec<String>>);

impl Family for Staged {
    type Module<B: Backend> = NetModule<B>;
    fn kind(&self) -> &str {
        "staged"
    }
    fn task(&self) -> Task {
        Net.task()
    }
    fn build<B: Backend>(&self, device: &B::Device) -> NetModule<B> {
        Net.build(device)
    }
    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32> {
        Net.init(layout, seed)
    }
    fn forward<B: Backend>(
        &self,
        m: &NetModule<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2> {
        Net.forward(m, x, device, ctx)
    }
    fn stages(&self, _layout: &ParamLayout) -> Vec<Vec<String>> {
        self.0.clone()
    }
}

#[test]
fn stages_that_do_not_fit_the_layout_are_refused_naming_the_family() {
    let names = |v: &[&[&str]]| -> Vec<Vec<String>> {
        v.iter()
            .map(|s| s.iter().map(|n| n.to_string()).collect())
            .collect()
    };
    for (stages, why) in [
        (
            names(&[&["fc", "nrom"]]),
            "stage 0 names unit `nrom`, which the module does not have (its units: fc, norm)",
        ),
        (names(&[&["fc"]]), "unit `norm` is in no stage"),
        (
            names(&[&["fc", "fc"], &["norm"]]),
            "stage 0 names unit `fc` twice",
        ),
        (names(&[&["fc", "norm"], &[]]), "stage 1 names no unit"),
    ] {
        let e = FamilyModel::new(Staged(stages))
            .check()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("model `staged`: `Family::stages`: "), "{e}");
        assert!(e.contains(why), "{e}");
    }
    assert!(FamilyModel::new(Staged(names(&[&["fc"], &["norm"]])))
        .check()
        .is_ok());
}
