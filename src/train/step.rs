//! One micro-step's math on a Burn backend: assemble the model from the flat buffer, forward,
//! cross-entropy, backward, and flatten the gradients back; and exact evaluation.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use crate::collective::{DeviceFlat, DeviceTensor, Grads};
use crate::data::Dataset;
use crate::model::{LayerTensors, Mlp};

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("the backend returned data of an unexpected type: {0}")]
    Data(String),
    #[error("parameter `{0}` received no gradient")]
    NoGrad(String),
    #[error("a device buffer belongs to another backend")]
    ForeignGrads,
}

fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>, StepError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| StepError::Data(format!("{e:?}")))
}

/// A layer's flat parameters: on the host, or gathered on the device (fsdp over NCCL).
pub enum LayerParams {
    Host(Vec<f32>),
    Device(Box<dyn DeviceTensor>),
}

/// Forward and backward on one micro-batch: adds d(loss * scale)/d(params) into `grads` (flat, in
/// the model's layout; on the host, or on the device where the backend computed them) and returns the unscaled mean cross-entropy. `layer_params(l)`
/// yields layer l's flat parameters; each buffer becomes that layer's tensor storage at once, so
/// no more than one layer's parameters are held outside the autodiff graph.
#[allow(clippy::too_many_arguments)]
pub fn forward_backward<B: AutodiffBackend, E: From<StepError>>(
    mlp: &Mlp,
    layer_params: &mut dyn FnMut(usize) -> Result<LayerParams, E>,
    x: Vec<f32>,
    y: &[u32],
    masks: Option<Vec<Vec<f32>>>,
    scale: f64,
    grads: &mut Grads,
    device: &B::Device,
) -> Result<f64, E> {
    let batch = y.len();
    let mut layers = Vec::with_capacity(mlp.num_layers());
    for l in 0..mlp.num_layers() {
        let mut t = match layer_params(l)? {
            LayerParams::Host(v) => mlp.layer_tensors::<B>(l, v, device),
            LayerParams::Device(mut d) => {
                let flat = d
                    .as_any_mut()
                    .downcast_mut::<DeviceFlat<B::InnerBackend>>()
                    .ok_or(StepError::ForeignGrads)?
                    .tensor
                    .clone();
                let inner = mlp.layer_tensors_from(l, flat);
                LayerTensors {
                    weight: Tensor::from_inner(inner.weight),
                    bias: Tensor::from_inner(inner.bias),
                }
            }
        };
        t.weight = t.weight.require_grad();
        t.bias = t.bias.require_grad();
        layers.push(t);
    }
    let input = Tensor::<B, 2>::from_data(TensorData::new(x, [batch, mlp.sizes[0]]), device);
    let masks: Option<Vec<Tensor<B, 2>>> = masks.map(|ms| {
        ms.into_iter()
            .zip(&mlp.sizes[1..])
            .map(|(m, &w)| Tensor::from_data(TensorData::new(m, [batch, w]), device))
            .collect()
    });
    let logits = mlp.forward(&layers, input, masks.as_deref());
    let classes = *mlp.sizes.last().unwrap_or(&1);
    let mut onehot = vec![0f32; batch * classes];
    for (i, &c) in y.iter().enumerate() {
        onehot[i * classes + c as usize] = 1.0;
    }
    let onehot = Tensor::<B, 2>::from_data(TensorData::new(onehot, [batch, classes]), device);
    let loss = (log_softmax(logits, 1) * onehot)
        .sum()
        .neg()
        .div_scalar(batch as f64);
    let loss_value = to_vec(loss.clone().inner())?
        .first()
        .copied()
        .unwrap_or(f32::NAN);
    let tape = loss.mul_scalar(scale).backward();
    let mut layer_grads = Vec::with_capacity(mlp.layout.len());
    for (layer, specs) in layers.iter().zip(mlp.layout.chunks(2)) {
        let w = layer
            .weight
            .grad(&tape)
            .ok_or_else(|| StepError::NoGrad(specs[0].name.clone()))?;
        let b = layer
            .bias
            .grad(&tape)
            .ok_or_else(|| StepError::NoGrad(specs[1].name.clone()))?;
        layer_grads.push((&specs[0], w.reshape([specs[0].len()])));
        layer_grads.push((&specs[1], b));
    }
    match grads {
        Grads::Host(host) => {
            for (spec, g) in layer_grads {
                for (a, v) in host[spec.range()].iter_mut().zip(&to_vec(g)?) {
                    *a += v;
                }
            }
        }
        Grads::Device(d) => {
            // the layout is contiguous in this order (see `Mlp::new`), so one concatenation
            // is the flat gradient; it stays on the device
            let flat = Tensor::cat(layer_grads.into_iter().map(|(_, g)| g).collect(), 0);
            d.as_any_mut()
                .downcast_mut::<DeviceFlat<B::InnerBackend>>()
                .ok_or(StepError::ForeignGrads)?
                .add(flat);
        }
    }
    Ok(f64::from(loss_value))
}

/// Exact evaluation totals: every sample counted once.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EvalSums {
    pub loss_sum: f64,
    pub correct: u64,
    pub count: u64,
}

impl EvalSums {
    pub fn loss(&self) -> f64 {
        self.loss_sum / self.count.max(1) as f64
    }
    pub fn accuracy(&self) -> f64 {
        self.correct as f64 / self.count.max(1) as f64
    }
}

/// Per-sample cross-entropy and correctness (1.0 / 0.0) of `params` on the rows `idx` of `ds`, in
/// batches of `batch` (no dropout).
pub fn evaluate<B: Backend>(
    mlp: &Mlp,
    params: &[f32],
    ds: &Dataset,
    idx: &[usize],
    batch: usize,
    device: &B::Device,
) -> Result<(Vec<f64>, Vec<f64>), StepError> {
    let layers = mlp.tensors::<B>(params, device);
    let classes = *mlp.sizes.last().unwrap_or(&1);
    let (mut losses, mut correct) = (Vec::with_capacity(idx.len()), Vec::with_capacity(idx.len()));
    for chunk in idx.chunks(batch.max(1)) {
        let (x, y) = ds.gather(chunk);
        let input =
            Tensor::<B, 2>::from_data(TensorData::new(x, [chunk.len(), ds.features]), device);
        let logits = to_vec(mlp.forward(&layers, input, None))?;
        for (row, &label) in logits.chunks(classes).zip(&y) {
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = f64::from(max)
                + row
                    .iter()
                    .map(|&v| f64::from(v - max).exp())
                    .sum::<f64>()
                    .ln();
            losses.push(lse - f64::from(row[label as usize]));
            let pred = row
                .iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best });
            correct.push(if pred == label as usize { 1.0 } else { 0.0 });
        }
    }
    Ok((losses, correct))
}

#[cfg(test)]
mod tests {
    //! The device path of a micro-step (gradients accumulated as one flat tensor, layers built
    //! from a gathered flat tensor) against the host path, on a CPU backend.

    use burn::backend::{Autodiff, Flex};

    use super::*;
    use crate::collective::RawBuf;
    use crate::config::ModelConfig;

    type B = Autodiff<Flex>;
    type Inner = Flex;

    fn no_address(_: &Tensor<Inner, 1>) -> Result<(RawBuf, Box<dyn std::any::Any>), String> {
        Err("a CPU tensor has no device address".into())
    }

    #[test]
    fn device_buffers_give_the_host_gradients() {
        let mlp = Mlp::new(&ModelConfig {
            input_size: 4,
            hidden_sizes: vec![6],
            classes: 3,
            ..ModelConfig::default()
        });
        let params = mlp.init(3);
        let device = Default::default();
        let x: Vec<f32> = (0..20).map(|i| (i as f32 * 0.37).sin()).collect();
        let y = [0u32, 2, 1, 2, 0];
        let mut host = Grads::Host(vec![0.0; mlp.num_params()]);
        let flat = |v: Vec<f32>| -> Box<dyn DeviceTensor> {
            let n = v.len();
            Box::new(DeviceFlat::<Inner>::new(
                Tensor::from_data(TensorData::new(v, [n]), &device),
                no_address,
            ))
        };
        let mut dev = Grads::Device(flat(vec![0.0; mlp.num_params()]));
        let mut losses = Vec::new();
        // two micro-steps: the device buffer accumulates like the host one
        for _ in 0..2 {
            let mut from_host = |l: usize| -> Result<LayerParams, StepError> {
                Ok(LayerParams::Host(params[mlp.layer_range(l)].to_vec()))
            };
            losses.push(
                forward_backward::<B, StepError>(
                    &mlp,
                    &mut from_host,
                    x.clone(),
                    &y,
                    None,
                    0.5,
                    &mut host,
                    &device,
                )
                .unwrap(),
            );
            let mut from_device = |l: usize| -> Result<LayerParams, StepError> {
                Ok(LayerParams::Device(flat(
                    params[mlp.layer_range(l)].to_vec(),
                )))
            };
            losses.push(
                forward_backward::<B, StepError>(
                    &mlp,
                    &mut from_device,
                    x.clone(),
                    &y,
                    None,
                    0.5,
                    &mut dev,
                    &device,
                )
                .unwrap(),
            );
        }
        assert!(losses.iter().all(|l| *l == losses[0]), "{losses:?}");
        let (h, d) = (host.into_host(0).unwrap(), dev.into_host(0).unwrap());
        assert!(h.iter().any(|g| *g != 0.0));
        for (a, b) in h.iter().zip(&d) {
            assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{h:?}\n{d:?}");
        }
    }
}
