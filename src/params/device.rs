//! Parameters and optimizer state kept on the device between steps (ddp and single on CUDA with
//! f32 parameters): the forward reads slices of the parameters where they are, and clipping and
//! the optimizer step run as Burn tensor ops, so a step moves no parameter or gradient across
//! the host boundary. The ops are the host optimizer's (`optim.rs`), term by term in the same
//! order, so on a CPU backend the results are bit-identical to it.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::buffer::{DeviceFlat, DeviceTensor, RawBuf, RawFn};
use super::optim::{clip_coef, Optimizer};
use super::transfers::{record, Moved};
use crate::checkpoint::OptState;
use crate::config::OptimKind;

/// A whole parameter buffer and its optimizer state, on a device.
pub trait DeviceParams {
    /// Elements `range` of the parameters, for the forward.
    fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor>;
    /// Clips `grads` to the global norm `clip` (torch `clip_grad_norm_`) and takes one optimizer
    /// step at `lr`.
    fn step(
        &mut self,
        grads: &mut dyn DeviceTensor,
        lr: f64,
        clip: Option<f64>,
    ) -> Result<(), String> {
        let coef = match clip {
            Some(max_norm) => clip_coef(grads.sum_squares()?.sqrt(), max_norm),
            None => None,
        };
        self.step_scaled(grads, lr, coef)
    }
    /// One optimizer step at `lr` with `grads` scaled by `coef` first (clipping by a norm
    /// computed elsewhere: fsdp's over every rank's shards).
    fn step_scaled(
        &mut self,
        grads: &mut dyn DeviceTensor,
        lr: f64,
        coef: Option<f64>,
    ) -> Result<(), String>;
    /// The parameters on the host.
    fn params(&mut self) -> Result<Vec<f32>, String>;
    /// The parameter buffer for a collective (pending writes finished), valid until the next
    /// step.
    fn raw(&mut self) -> Result<RawBuf, String>;
    /// The optimizer state as `Optimizer::export` gives it.
    fn export(&mut self) -> Result<OptState, String>;
    fn state_bytes(&self) -> usize;
}

/// `DeviceParams` over Burn tensors of backend `B`.
pub struct BurnParams<B: Backend> {
    params: Tensor<B, 1>,
    m: Option<Tensor<B, 1>>,
    v: Option<Tensor<B, 1>>,
    /// Hyperparameters and the step count (its own buffers stay empty).
    opt: Optimizer,
    /// Leading elements that never train: the optimizer steps `params[frozen..]`.
    frozen: usize,
    /// The weight decay of each element, where some get none (`Optimizer::no_decay`).
    decay: Option<Tensor<B, 1>>,
    raw_fn: RawFn<B>,
    /// Keeps the address from `raw` valid until the parameters change.
    guard: Option<Box<dyn std::any::Any>>,
}

fn upload<B: Backend>(values: &[f32], device: &B::Device) -> Tensor<B, 1> {
    super::buffer::master_upload(values, device)
}

fn download<B: Backend>(t: &Tensor<B, 1>) -> Result<Vec<f32>, String> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| format!("reading device parameters: {e:?}"))
}

impl<B: Backend> BurnParams<B> {
    /// Uploads `params` and the state of `opt`, which steps `params[frozen..]`.
    pub fn new(
        params: &[f32],
        frozen: usize,
        opt: &Optimizer,
        device: &B::Device,
        raw_fn: RawFn<B>,
    ) -> Self {
        record(Moved::ParamsToDevice, params.len());
        record(Moved::StateToDevice, opt.m.len() + opt.v.len());
        let state = |v: &[f32]| (!v.is_empty()).then(|| upload::<B>(v, device));
        let mut hyper = opt.clone();
        hyper.m = Vec::new();
        hyper.v = Vec::new();
        let decay = (!opt.no_decay.is_empty() && opt.weight_decay != 0.0).then(|| {
            let mut wd = vec![opt.weight_decay; params.len() - frozen];
            for r in &opt.no_decay {
                let r = r.start.min(wd.len())..r.end.min(wd.len());
                wd[r].fill(0.0);
            }
            upload::<B>(&wd, device)
        });
        BurnParams {
            params: upload(params, device),
            m: state(&opt.m),
            v: state(&opt.v),
            decay,
            opt: hyper,
            frozen,
            raw_fn,
            guard: None,
        }
    }
}

impl<B: Backend> DeviceParams for BurnParams<B> {
    fn slice(&self, range: Range<usize>) -> Box<dyn DeviceTensor> {
        Box::new(DeviceFlat::new(
            self.params.clone().slice(range),
            self.raw_fn,
        ))
    }

    fn step_scaled(
        &mut self,
        grads: &mut dyn DeviceTensor,
        lr: f64,
        coef: Option<f64>,
    ) -> Result<(), String> {
        let mut g = grads
            .as_any_mut()
            .downcast_mut::<DeviceFlat<B>>()
            .ok_or("the gradient buffer belongs to another backend")?
            .tensor
            .clone();
        if let Some(coef) = coef {
            g = g.mul_scalar(coef as f32);
        }
        self.guard = None;
        let o = &mut self.opt;
        o.steps += 1;
        let lr = lr as f32;
        let wd = o.weight_decay;
        let n = self.params.dims()[0];
        let frozen = self.frozen;
        // (with a frozen head, `whole` is the buffer's one handle when the tail is assigned
        // back: `slice_assign` then writes in place instead of copying the parameters)
        let whole = self.params.clone();
        let p = match frozen {
            0 => whole.clone(),
            _ => whole.clone().slice(frozen..n),
        };
        // wd * p, per element where some elements get no decay
        let decayed = |p: Tensor<B, 1>| match &self.decay {
            Some(w) => p * w.clone(),
            None => p.mul_scalar(wd),
        };
        match o.kind {
            OptimKind::Sgd if o.momentum == 0.0 => {
                self.params = p.clone() - (g + decayed(p)).mul_scalar(lr);
            }
            OptimKind::Sgd => {
                let mu = o.momentum;
                let d = g + decayed(p.clone());
                let b = match self.m.take() {
                    None => d.clone(),
                    Some(b) => b.mul_scalar(mu) + d.clone(),
                };
                let upd = if o.nesterov {
                    d + b.clone().mul_scalar(mu)
                } else {
                    b.clone()
                };
                self.params = p - upd.mul_scalar(lr);
                self.m = Some(b);
            }
            OptimKind::Adam | OptimKind::Adamw => {
                let [b1, b2] = o.betas;
                let t = o.steps as i32;
                let bc1 = 1.0 - b1.powi(t);
                let bc2_sqrt = (1.0 - b2.powi(t)).sqrt();
                let step_size = lr / bc1;
                let (p, g) = match (o.kind, &self.decay) {
                    (OptimKind::Adamw, None) => (p.mul_scalar(1.0 - lr * wd), g),
                    // 1 - lr * wd per element, as the host computes it
                    (OptimKind::Adamw, Some(w)) => {
                        (p * w.clone().mul_scalar(-lr).add_scalar(1.0), g)
                    }
                    _ => (p.clone(), g + decayed(p)),
                };
                let zeros = || super::buffer::master_zeros::<B>(p.dims()[0], &p.device());
                let m = self.m.take().unwrap_or_else(zeros).mul_scalar(b1)
                    + g.clone().mul_scalar(1.0 - b1);
                let v = self.v.take().unwrap_or_else(zeros).mul_scalar(b2)
                    + g.clone().mul_scalar(1.0 - b2).mul(g);
                let denom = v.clone().sqrt().div_scalar(bc2_sqrt).add_scalar(o.eps);
                self.params = p - m.clone().mul_scalar(step_size).div(denom);
                self.m = Some(m);
                self.v = Some(v);
            }
        }
        if frozen > 0 {
            // the frozen head as it was, the stepped tail after it
            let empty = Tensor::<B, 1>::zeros([0], &whole.device());
            let tail = std::mem::replace(&mut self.params, empty);
            self.params = whole.slice_assign(frozen..n, tail);
        } else {
            drop(whole);
        }
        Ok(())
    }

    fn params(&mut self) -> Result<Vec<f32>, String> {
        record(Moved::ParamsToHost, self.params.dims()[0]);
        download(&self.params)
    }

    fn raw(&mut self) -> Result<RawBuf, String> {
        let (raw, guard) = (self.raw_fn)(&self.params)?;
        self.guard = Some(guard);
        Ok(raw)
    }

    fn export(&mut self) -> Result<OptState, String> {
        let host = |t: &Option<Tensor<B, 1>>| {
            let v = t.as_ref().map(download).unwrap_or(Ok(Vec::new()))?;
            record(Moved::StateToHost, v.len());
            Ok::<_, String>(v)
        };
        Ok(OptState {
            steps: self.opt.steps,
            m: host(&self.m)?,
            v: host(&self.v)?,
        })
    }

    fn state_bytes(&self) -> usize {
        let n = self.params.dims()[0] - self.frozen;
        (usize::from(self.m.is_some()) + usize::from(self.v.is_some())) * n * 4
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;

    use super::*;
    use crate::config::OptimConfig;
    use crate::params::{clip_by_norm, sum_squares, RawBuf};

    fn no_address(_: &Tensor<Flex, 1>) -> Result<(RawBuf, Box<dyn std::any::Any>), String> {
        Err("a CPU tensor has no device address".into())
    }

    /// With a frozen head (`ParamLayout::frozen`) the device steps the tail as the host
    /// optimizer steps `params[frozen..]`, and the head keeps its bits.
    #[test]
    fn a_frozen_head_keeps_its_bits_and_the_tail_steps_as_on_the_host() {
        let device = Default::default();
        let (n, frozen) = (300, 120);
        let init: Vec<f32> = (0..n)
            .map(|i| ((i * 31) % 97) as f32 / 50.0 - 1.0)
            .collect();
        let cfg = OptimConfig {
            kind: OptimKind::Adamw,
            weight_decay: 0.1,
            ..OptimConfig::default()
        };
        let mut host = Optimizer::new(&cfg).with_no_decay(vec![10..20, 40..41]);
        let mut dev = BurnParams::<Flex>::new(&init, frozen, &host, &device, no_address);
        let mut hp = init.clone();
        for s in 0..3 {
            let g: Vec<f32> = (0..n - frozen)
                .map(|i| ((i * 7 + s * 13) % 23) as f32 / 11.0 - 1.0)
                .collect();
            host.step(&mut hp[frozen..], &g, 0.05);
            let mut dg = DeviceFlat::<Flex>::new(upload(&g, &device), no_address);
            dev.step(&mut dg, 0.05, None).unwrap();
        }
        let dp = dev.params().unwrap();
        assert_eq!(dp[..frozen], init[..frozen]);
        assert_eq!(dp, hp);
        assert_ne!(dp[frozen..], init[frozen..]);
        assert_eq!(dev.state_bytes(), host.state_bytes());
        assert_eq!(dev.export().unwrap().m.len(), n - frozen);
    }

    #[test]
    fn device_optimizers_are_the_host_optimizers() {
        let device = Default::default();
        let n = 1000;
        let init: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0)
            .collect();
        let grad = |s: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + 13 * s) * 104_729) % 300) as f32 / 150.0 - 1.0)
                .collect()
        };
        for (kind, momentum, nesterov, wd) in [
            (OptimKind::Sgd, 0.0, false, 0.01),
            (OptimKind::Sgd, 0.9, false, 0.0),
            (OptimKind::Sgd, 0.9, true, 0.01),
            (OptimKind::Adam, 0.0, false, 0.01),
            (OptimKind::Adamw, 0.0, false, 0.05),
        ] {
            for (clip, no_decay) in [
                (None, vec![]),
                (Some(1.0), vec![]),
                // biases and norms spared (optim.decay = "matrices")
                (None, vec![3..100, 500..501, 998..1000]),
            ] {
                let cfg = OptimConfig {
                    kind,
                    momentum,
                    nesterov,
                    weight_decay: wd,
                    ..OptimConfig::default()
                };
                let mut host = Optimizer::new(&cfg).with_no_decay(no_decay.clone());
                let mut hp = init.clone();
                // the device state starts from one host step (as after a resume)
                host.step(&mut hp, &grad(0), 0.1);
                let mut dev = BurnParams::<Flex>::new(&hp, 0, &host, &device, no_address);
                for s in 1..4 {
                    let mut g = grad(s);
                    if let Some(max) = clip {
                        let norm = sum_squares(&g).sqrt();
                        clip_by_norm(&mut g, norm, max);
                    }
                    host.step(&mut hp, &g, 0.1);
                    let mut dg = DeviceFlat::<Flex>::new(upload(&grad(s), &device), no_address);
                    dev.step(&mut dg, 0.1, clip).unwrap();
                }
                let what = format!(
                    "{kind:?} momentum {momentum} nesterov {nesterov} clip {clip:?} no decay {no_decay:?}"
                );
                let dp = dev.params().unwrap();
                // clipping sums squares in f32 on the device, f64 on the host
                let tol = if clip.is_some() { 1e-6 } else { 0.0 };
                for (a, b) in hp.iter().zip(&dp) {
                    assert!(
                        (a - b).abs() <= tol * a.abs().max(1.0),
                        "{what}: {a} vs {b}"
                    );
                }
                let (he, de) = (host.export(), dev.export().unwrap());
                assert_eq!(
                    (he.steps, he.m.len(), he.v.len()),
                    (de.steps, de.m.len(), de.v.len()),
                    "{what}"
                );
                assert_eq!(dev.state_bytes(), host.state_bytes(), "{what}");
                assert_ne!(dp, init, "{what}");
            }
        }
    }
}
