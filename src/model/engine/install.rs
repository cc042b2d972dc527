//! Between a Burn module and kiln's flat buffers: the layout from visiting the module
//! (`layout_of`), the rank's parameters installed into a clone of it as leaf tensors
//! (`Install`, one `Lift` per kind of tensor made), and the gradients read back
//! (`GradVisitor`).

use std::collections::HashMap;
use std::marker::PhantomData;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Tensor, TensorData};

use super::super::api::{ModelError, UnitParams};
use crate::params::{DeviceFlat, ParamLayout};

/// A trainable parameter, as opposed to state such as BatchNorm's running statistics (which
/// Burn visits as initialised parameters that require no gradient). Asked only of modules on an
/// autodiff backend, where an initialised trainable parameter requires a gradient.
pub(super) fn trainable<B: Backend, const D: usize>(param: &Param<Tensor<B, D>>) -> bool {
    !param.is_initialized() || param.is_require_grad()
}

/// The module path of the parameter being visited, kept by `enter_module`/`exit_module`.
#[derive(Default)]
pub(super) struct Path(pub(super) Vec<String>);

impl Path {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
    fn name(&self) -> String {
        self.0.join(".")
    }
}

/// Lists every trainable parameter's path, shape and holding module type, in visiting order.
pub(super) struct LayoutVisitor {
    pub(super) path: Path,
    /// The container type of each level of `path` (`Struct:Linear`, `Vec`, ...).
    pub(super) containers: Vec<String>,
    pub(super) entries: Vec<(String, Vec<usize>, String)>,
}

impl<B: Backend> ModuleVisitor<B> for LayoutVisitor {
    fn enter_module(&mut self, name: &str, container: &str) {
        self.path.enter(name);
        self.containers.push(container.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.exit();
        self.containers.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if trainable(param) {
            // Burn's derive enters a field with the type of the struct that has the field
            let module = self
                .containers
                .iter()
                .rev()
                .find_map(|c| c.strip_prefix("Struct:"))
                .unwrap_or("")
                .to_string();
            self.entries
                .push((self.path.name(), param.lazy_shape().to_vec(), module));
        }
    }
}

/// The flat layout of a module on an autodiff backend (so that trainable parameters and state
/// can be told apart).
pub fn layout_of<B: AutodiffBackend, M: Module<B>>(module: &M) -> ParamLayout {
    let mut v = LayoutVisitor {
        path: Path::default(),
        containers: Vec::new(),
        entries: Vec::new(),
    };
    module.visit(&mut v);
    ParamLayout::with_modules(v.entries)
}

/// Replaces every parameter of the given units, found by its path, by a tensor from the rank's
/// buffers; anything else (other units' parameters, state) stays as it is. `B` is the backend of
/// the module (autodiff for training: each tensor becomes a leaf that requires a gradient), `I`
/// its inner backend.
pub(super) struct Install<'a, B: Backend, I: Backend, L: Lift<B, I>> {
    /// Parameters as views of their unit's buffer (`kernels::param_view`) rather than copies.
    pub(super) views: bool,
    pub(super) layout: &'a ParamLayout,
    pub(super) index: &'a HashMap<String, usize>,
    pub(super) unit_of: &'a [usize],
    pub(super) path: Path,
    pub(super) installed: usize,
    /// Per layout unit: its parameters, when it is being installed.
    pub(super) units: Vec<Option<Tensor<I, 1>>>,
    pub(super) error: Option<ModelError>,
    pub(super) lift: PhantomData<(B, L)>,
}

/// How an inner-backend tensor becomes a parameter of the module's backend.
pub(super) trait Lift<B: Backend, I: Backend> {
    fn lift<const D: usize>(t: Tensor<I, D>) -> Tensor<B, D>;
    /// A frozen parameter (`ParamLayout::frozen`): no gradient is ever taken of it, so in
    /// training it is a constant of the graph (its backward computes no weight gradient).
    fn frozen<const D: usize>(t: Tensor<I, D>) -> Tensor<B, D> {
        Self::lift(t)
    }
}

/// Training: a leaf of the autodiff graph that requires a gradient.
pub(super) struct Leaf;
impl<B: AutodiffBackend> Lift<B, B::InnerBackend> for Leaf {
    fn lift<const D: usize>(t: Tensor<B::InnerBackend, D>) -> Tensor<B, D> {
        Tensor::from_inner(t).require_grad()
    }
    fn frozen<const D: usize>(t: Tensor<B::InnerBackend, D>) -> Tensor<B, D> {
        Tensor::from_inner(t)
    }
}

/// A recomputed stage's first forward: on the autodiff backend (so its values are the bits the
/// recompute and a kept graph give), but untracked: no graph, nothing saved.
pub(super) struct Untracked;
impl<B: AutodiffBackend> Lift<B, B::InnerBackend> for Untracked {
    fn lift<const D: usize>(t: Tensor<B::InnerBackend, D>) -> Tensor<B, D> {
        Tensor::from_inner(t)
    }
}

/// Evaluation: the tensor as it is.
pub(super) struct Plain;
impl<B: Backend> Lift<B, B> for Plain {
    fn lift<const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
        t
    }
}

/// Unit `u`'s parameters as one flat inner tensor in the compute dtype `dtype` (made once; each
/// parameter is a slice): the compute copy of the f32 masters, cast as it is installed.
pub(super) fn unit_tensor<I: Backend>(
    layout: &ParamLayout,
    u: usize,
    p: UnitParams,
    device: &I::Device,
    dtype: FloatDType,
) -> Result<Tensor<I, 1>, ModelError> {
    let want = layout.units[u].range.len();
    match p {
        UnitParams::Host(v) if v.len() == want => Ok(Tensor::from_data(
            TensorData::new(v, [want]),
            (device, DType::from(dtype)),
        )),
        UnitParams::Device(mut d) if d.len() == want => Ok(d
            .as_any_mut()
            .downcast_mut::<DeviceFlat<I>>()
            .ok_or(ModelError::ForeignBuffer)?
            .tensor
            .clone()
            .cast(dtype)),
        UnitParams::Host(v) => Err(unit_size(u, v.len(), want)),
        UnitParams::Device(d) => Err(unit_size(u, d.len(), want)),
    }
}

pub(super) fn unit_size(unit: usize, got: usize, want: usize) -> ModelError {
    ModelError::UnitSize { unit, got, want }
}

impl<B: Backend, I: Backend, L: Lift<B, I>> ModuleMapper<B> for Install<'_, B, I, L> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let name = self.path.name();
        let Some(&i) = self.index.get(&name) else {
            // state, not a parameter
            return param;
        };
        let shape = param.lazy_shape();
        if shape.to_vec() != self.layout.params[i].shape {
            self.error = Some(ModelError::Shape {
                name,
                module: shape.to_vec(),
                layout: self.layout.params[i].shape.clone(),
            });
            return param;
        }
        let u = self.unit_of[i];
        let Some(unit) = &self.units[u] else {
            // a unit of another stage
            return param;
        };
        let spec = &self.layout.params[i];
        let base = self.layout.units[u].range.start;
        let rel = spec.offset - base..spec.offset - base + spec.len();
        self.installed += 1;
        // reshaped before it becomes a leaf: the parameter itself must be the leaf; a view of
        // the unit's buffer where the family reads it through kiln's kernels (the parameters
        // of a unit share it, and a resharded stage drops it whole), elsewhere a copy (Burn's
        // ops would copy a view that does not start the buffer at each use)
        let dims: [usize; D] = shape.dims();
        let view = self
            .views
            .then(|| crate::kernels::param_view(unit, rel.start, dims))
            .flatten();
        let t: Tensor<I, D> = view.unwrap_or_else(|| unit.clone().slice(rel).reshape(shape));
        let t = if self.layout.unit_frozen(u) {
            L::frozen(t)
        } else {
            L::lift(t)
        };
        Param::initialized(param.id, t)
    }
}

/// The layout parameters of chosen units, found by the path of the parameter being visited.
pub(super) struct Chosen<'a> {
    pub(super) index: &'a HashMap<String, usize>,
    pub(super) unit_of: &'a [usize],
    /// Per layout unit: whether it is chosen.
    pub(super) units: &'a [bool],
    pub(super) path: Path,
}

impl Chosen<'_> {
    /// The layout index of the parameter at the current path, when its unit is chosen.
    fn here(&self) -> Option<usize> {
        let &i = self.index.get(&self.path.name())?;
        self.units[self.unit_of[i]].then_some(i)
    }
}

/// Leaves every layout parameter of the chosen units without its values (`kernels::hollow`:
/// the same graph node over one zero), after a resharded stage's forward.
pub(super) struct Hollow<'a>(pub(super) Chosen<'a>);

impl<B: Backend> ModuleMapper<B> for Hollow<'_> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.0.path.enter(name);
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.0.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        match self.0.here() {
            Some(_) => {
                let id = param.id;
                Param::initialized(id, crate::kernels::hollow(param.val()))
            }
            None => param,
        }
    }
}

/// Collects the gradient of every layout parameter of the chosen units, flattened, by path
/// (the other units' parameters are never touched: they may be lazy and uninitialised).
pub(super) struct GradVisitor<'a, B: AutodiffBackend> {
    pub(super) tape: &'a mut <B as AutodiffBackend>::Gradients,
    pub(super) chosen: Chosen<'a>,
    pub(super) out: Vec<Option<Tensor<B::InnerBackend, 1>>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradVisitor<'_, B> {
    fn enter_module(&mut self, name: &str, _container: &str) {
        self.chosen.path.enter(name);
    }
    fn exit_module(&mut self, _name: &str, _container: &str) {
        self.chosen.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(i) = self.chosen.here() {
            let t = param.val();
            let n = t.shape().num_elements();
            // taken out of the tape: it is freed as soon as the unit's gradient is joined
            self.out[i] = t.grad_remove(self.tape).map(|g| g.reshape([n]));
        }
    }
}

pub(super) fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>, ModelError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| ModelError::Data(format!("{e:?}")))
}
