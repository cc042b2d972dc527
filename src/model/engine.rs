//! Any `Family` over kiln's flat buffers: the layout comes from visiting the module, each
//! micro-step installs the rank's parameters into a clone of the module as leaf tensors, and the
//! gradients come back with one concatenation.
//!
//! Burn 0.21 traps this avoids (see the design notes): parameters are matched by order and path,
//! never by `ParamId`; a lazy parameter is never initialised (`lazy_shape`, never `consume`), so
//! Burn's process-wide RNG is never drawn from; each parameter is its own leaf made from a slice
//! of the unit's buffer, never a slice of one big autodiff tensor (whose backward would allocate
//! a full-size zero tensor per slice); the gradients are joined on the device and read with one
//! `into_data`, not one read per parameter.

use std::marker::PhantomData;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::activation::log_softmax;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

use super::api::{
    Batch, Compute, EvalOut, Family, Forward, Model, ModelError, StepKey, Task, UnitParams,
};
use crate::params::{DeviceFlat, Grads, ParamLayout};

/// A trainable parameter, as opposed to state such as BatchNorm's running statistics (which
/// Burn visits as initialised parameters that require no gradient). kiln builds modules fresh,
/// so every trainable parameter is still lazy when it is looked at.
fn trainable<B: Backend, const D: usize>(param: &Param<Tensor<B, D>>) -> bool {
    !param.is_initialized() || param.is_require_grad()
}

/// Lists every trainable parameter's path and shape, in visiting order.
struct LayoutVisitor {
    path: Vec<String>,
    entries: Vec<(String, Vec<usize>)>,
}

impl<B: Backend> ModuleVisitor<B> for LayoutVisitor {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if trainable(param) {
            self.entries
                .push((self.path.join("."), param.lazy_shape().to_vec()));
        }
    }
}

/// The flat layout of a module.
pub fn layout_of<B: Backend, M: Module<B>>(module: &M) -> ParamLayout {
    let mut v = LayoutVisitor {
        path: Vec::new(),
        entries: Vec::new(),
    };
    module.visit(&mut v);
    ParamLayout::new(v.entries)
}

/// The current unit's parameters, as inner-backend tensors ready to be sliced per parameter.
enum Current<B: Backend> {
    Host(Vec<f32>),
    Device(Tensor<B, 1>),
}

/// Replaces every trainable parameter by a tensor from the rank's buffers. `B` is the backend of
/// the module (autodiff for training: each tensor becomes a leaf that requires a gradient).
struct Install<'a, B: Backend, I: Backend, L: Lift<B, I>> {
    layout: &'a ParamLayout,
    unit_of: &'a [usize],
    next: usize,
    unit: Option<(usize, Current<I>)>,
    source: &'a mut dyn FnMut(usize) -> Result<UnitParams, ModelError>,
    device: &'a I::Device,
    error: Option<ModelError>,
    lift: PhantomData<(B, L)>,
}

/// How an inner-backend tensor becomes a parameter of the module's backend.
trait Lift<B: Backend, I: Backend> {
    fn lift<const D: usize>(t: Tensor<I, D>) -> Tensor<B, D>;
}

/// Training: a leaf of the autodiff graph that requires a gradient.
struct Leaf;
impl<B: AutodiffBackend> Lift<B, B::InnerBackend> for Leaf {
    fn lift<const D: usize>(t: Tensor<B::InnerBackend, D>) -> Tensor<B, D> {
        Tensor::from_inner(t).require_grad()
    }
}

/// Evaluation: the tensor as it is.
struct Plain;
impl<B: Backend> Lift<B, B> for Plain {
    fn lift<const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
        t
    }
}

impl<B: Backend, I: Backend, L: Lift<B, I>> Install<'_, B, I, L> {
    /// Parameter `i`'s values as a flat inner tensor, fetching its unit first if needed.
    fn take(&mut self, i: usize) -> Result<Tensor<I, 1>, ModelError> {
        let u = self.unit_of[i];
        if self.unit.as_ref().map(|(cur, _)| *cur) != Some(u) {
            let want = self.layout.units[u].range.len();
            let current = match (self.source)(u)? {
                UnitParams::Host(v) => {
                    if v.len() != want {
                        return Err(ModelError::UnitSize {
                            unit: u,
                            got: v.len(),
                            want,
                        });
                    }
                    Current::Host(v)
                }
                UnitParams::Device(mut d) => {
                    if d.len() != want {
                        return Err(ModelError::UnitSize {
                            unit: u,
                            got: d.len(),
                            want,
                        });
                    }
                    let t = d
                        .as_any_mut()
                        .downcast_mut::<DeviceFlat<I>>()
                        .ok_or(ModelError::ForeignBuffer)?
                        .tensor
                        .clone();
                    Current::Device(t)
                }
            };
            self.unit = Some((u, current));
        }
        let spec = &self.layout.params[i];
        let base = self.layout.units[u].range.start;
        let rel = spec.offset - base..spec.offset - base + spec.len();
        Ok(match &self.unit {
            Some((_, Current::Host(v))) => {
                Tensor::from_data(TensorData::new(v[rel].to_vec(), [spec.len()]), self.device)
            }
            Some((_, Current::Device(t))) => t.clone().slice(rel),
            None => return Err(ModelError::Params(u)),
        })
    }
}

impl<B: Backend, I: Backend, L: Lift<B, I>> ModuleMapper<B> for Install<'_, B, I, L> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if !trainable(&param) || self.error.is_some() {
            return param;
        }
        let i = self.next;
        self.next += 1;
        match self.take(i) {
            Ok(flat) => {
                // reshaped before it becomes a leaf: the parameter itself must be the leaf
                let t: Tensor<I, D> = flat.reshape(param.lazy_shape());
                Param::initialized(param.id, L::lift(t))
            }
            Err(e) => {
                self.error = Some(e);
                param
            }
        }
    }
}

/// Collects every trainable parameter's gradient, flattened, in layout order (zeros where the
/// forward did not use a parameter).
struct GradVisitor<'a, B: AutodiffBackend> {
    tape: &'a <B as AutodiffBackend>::Gradients,
    out: Vec<Tensor<B::InnerBackend, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradVisitor<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if !trainable(param) {
            return;
        }
        let t = param.val();
        let n = t.shape().num_elements();
        let g = match t.grad(self.tape) {
            Some(g) => g.reshape([n]),
            None => Tensor::zeros([n], &t.device()),
        };
        self.out.push(g);
    }
}

fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>, ModelError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ModelError::Data(format!("{e:?}")))
}

/// A family's compute on backend `B`.
pub struct Engine<F: Family, B: AutodiffBackend> {
    family: Arc<F>,
    layout: ParamLayout,
    unit_of: Vec<usize>,
    template: F::Module<B>,
    inner: F::Module<B::InnerBackend>,
    device: B::Device,
}

impl<F: Family, B: AutodiffBackend> Engine<F, B> {
    pub fn new(family: Arc<F>, layout: &ParamLayout, device: &B::Device) -> Self {
        let unit_of = (0..layout.params.len())
            .map(|i| layout.unit_of_param(i))
            .collect();
        Engine {
            template: family.build::<B>(device),
            inner: family.build::<B::InnerBackend>(device),
            family,
            layout: layout.clone(),
            unit_of,
            device: device.clone(),
        }
    }

    fn input(&self, batch: &mut Batch) -> TensorData {
        TensorData::new(std::mem::take(&mut batch.x), batch.shape.clone())
    }
}

/// The mean cross-entropy of `logits` for labels `y`, as torch's `cross_entropy` computes it.
fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, y: &[u32], classes: usize) -> Tensor<B, 1> {
    let rows = y.len();
    let mut onehot = vec![0f32; rows * classes];
    for (i, &c) in y.iter().enumerate() {
        onehot[i * classes + c as usize] = 1.0;
    }
    let onehot =
        Tensor::<B, 2>::from_data(TensorData::new(onehot, [rows, classes]), &logits.device());
    (log_softmax(logits, 1) * onehot)
        .sum()
        .neg()
        .div_scalar(rows as f64)
}

impl<F: Family, B: AutodiffBackend> Compute<B> for Engine<F, B> {
    fn forward_backward(
        &self,
        params: &mut dyn FnMut(usize) -> Result<UnitParams, ModelError>,
        mut batch: Batch,
        key: StepKey,
        scale: f64,
        grads: &mut Grads,
    ) -> Result<f64, ModelError> {
        let Task::Classification { classes } = self.family.task();
        let mut install = Install::<B, B::InnerBackend, Leaf> {
            layout: &self.layout,
            unit_of: &self.unit_of,
            next: 0,
            unit: None,
            source: params,
            device: &self.device,
            error: None,
            lift: PhantomData,
        };
        let module = self.template.clone().map(&mut install);
        if let Some(e) = install.error.take() {
            return Err(e);
        }
        drop(install);
        let x = self.input(&mut batch);
        let logits = self
            .family
            .forward(&module, x, &self.device, &mut Forward::train(key));
        let loss = cross_entropy(logits, &batch.y, classes);
        let loss_value = to_vec(loss.clone().inner())?
            .first()
            .copied()
            .unwrap_or(f32::NAN);
        let tape = loss.mul_scalar(scale).backward();
        let mut collect = GradVisitor::<B> {
            tape: &tape,
            out: Vec::with_capacity(self.layout.params.len()),
        };
        module.visit(&mut collect);
        let flat = Tensor::cat(collect.out, 0);
        match grads {
            Grads::Host(host) => {
                for (a, v) in host.iter_mut().zip(&to_vec(flat)?) {
                    *a += v;
                }
            }
            Grads::Device(d) => d
                .as_any_mut()
                .downcast_mut::<DeviceFlat<B::InnerBackend>>()
                .ok_or(ModelError::ForeignBuffer)?
                .add(flat),
        }
        Ok(f64::from(loss_value))
    }

    fn evaluate(&self, params: &[f32], mut batch: Batch) -> Result<EvalOut, ModelError> {
        let Task::Classification { classes } = self.family.task();
        let mut source = |u: usize| -> Result<UnitParams, ModelError> {
            Ok(UnitParams::Host(params[self.layout.unit_range(u)].to_vec()))
        };
        let mut install = Install::<B::InnerBackend, B::InnerBackend, Plain> {
            layout: &self.layout,
            unit_of: &self.unit_of,
            next: 0,
            unit: None,
            source: &mut source,
            device: &self.device,
            error: None,
            lift: PhantomData,
        };
        let module = self.inner.clone().map(&mut install);
        if let Some(e) = install.error.take() {
            return Err(e);
        }
        drop(install);
        let x = self.input(&mut batch);
        let logits = to_vec(
            self.family
                .forward(&module, x, &self.device, &mut Forward::eval()),
        )?;
        let mut out = EvalOut::default();
        for (row, &label) in logits.chunks(classes).zip(&batch.y) {
            let max = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let lse = f64::from(max)
                + row
                    .iter()
                    .map(|&v| f64::from(v - max).exp())
                    .sum::<f64>()
                    .ln();
            out.losses.push(lse - f64::from(row[label as usize]));
            let pred = row
                .iter()
                .enumerate()
                .fold(0, |best, (i, &v)| if v > row[best] { i } else { best });
            out.correct
                .push(if pred == label as usize { 1.0 } else { 0.0 });
        }
        Ok(out)
    }
}

/// A family behind the `Model` trait: its layout is taken once, from a module built on the CPU.
pub struct FamilyModel<F: Family> {
    family: Arc<F>,
    layout: ParamLayout,
}

impl<F: Family> FamilyModel<F> {
    pub fn new(family: F) -> Self {
        let module = family.build::<NdArray>(&Default::default());
        let layout = layout_of::<NdArray, _>(&module);
        FamilyModel {
            family: Arc::new(family),
            layout,
        }
    }

    fn engine<B: AutodiffBackend>(&self, device: &B::Device) -> Box<dyn Compute<B>> {
        Box::new(Engine::<F, B>::new(
            self.family.clone(),
            &self.layout,
            device,
        ))
    }
}

impl<F: Family> Model for FamilyModel<F> {
    fn kind(&self) -> &str {
        self.family.kind()
    }
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }
    fn task(&self) -> Task {
        self.family.task()
    }
    fn init(&self, seed: u64) -> Vec<f32> {
        self.family.init(&self.layout, seed)
    }
    fn on_ndarray(
        &self,
        device: &burn::backend::ndarray::NdArrayDevice,
    ) -> Box<dyn Compute<Autodiff<NdArray>>> {
        self.engine(device)
    }
    fn on_flex(
        &self,
        device: &burn::backend::flex::FlexDevice,
    ) -> Box<dyn Compute<Autodiff<Flex>>> {
        self.engine(device)
    }
    #[cfg(feature = "cuda")]
    fn on_cuda_f32(
        &self,
        device: &burn::backend::cuda::CudaDevice,
    ) -> Box<dyn Compute<Autodiff<burn::backend::Cuda<f32>>>> {
        self.engine(device)
    }
    #[cfg(feature = "cuda")]
    fn on_cuda_bf16(
        &self,
        device: &burn::backend::cuda::CudaDevice,
    ) -> Box<dyn Compute<Autodiff<burn::backend::Cuda<burn::tensor::bf16>>>> {
        self.engine(device)
    }
    #[cfg(feature = "cuda")]
    fn on_cuda_f16(
        &self,
        device: &burn::backend::cuda::CudaDevice,
    ) -> Box<dyn Compute<Autodiff<burn::backend::Cuda<burn::tensor::f16>>>> {
        self.engine(device)
    }
}
