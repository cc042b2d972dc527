//! Any `Family` over kiln's flat buffers: the layout comes from visiting the module, each
//! micro-step installs the rank's parameters into a clone of the module as leaf tensors, and the
//! gradients come back with one concatenation.
//!
//! Burn 0.21 traps this avoids (see the design notes): parameters are matched by module path,
//! never by `ParamId` (and checked against the layout's shapes and count); a lazy parameter is never initialised (`lazy_shape`, never `consume`), so
//! Burn's process-wide RNG is never drawn from; each parameter is its own leaf made from a slice
//! of the unit's buffer, never a slice of one big autodiff tensor (whose backward would allocate
//! a full-size zero tensor per slice); the gradients are joined on the device and read with one
//! `into_data`, not one read per parameter.

use crate::model::WeightAdapter;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use burn::backend::{Autodiff, NdArray};
use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor, TensorData};

use super::api::{
    Act, Batch, Compute, EvalOut, Family, Forward, GradScale, Input, MicroStep, Model, ModelError,
    StagedEval, StepKey, Task, TokenDecoder, UnitParams, Values,
};
use crate::kernels;
use crate::params::ParamLayout;

mod install;
mod loss;
mod micro;

use install::*;
use loss::score;
use micro::EngineMicro;

/// One batch's evaluation, stage by stage, on the inner backend.
struct EngineEval<'a, F: Family, B: AutodiffBackend> {
    engine: &'a Engine<F, B>,
    /// The next stage's input (the batch, then each stage's output).
    act: Option<Act<B::InnerBackend>>,
    targets: Vec<u32>,
    ctx: Forward,
}

impl<F: Family, B: AutodiffBackend> StagedEval for EngineEval<'_, F, B> {
    fn forward(&mut self, s: usize, params: Vec<UnitParams>) -> Result<(), ModelError> {
        let e = self.engine;
        let units = e.stage_params(s, params)?;
        let input = self
            .act
            .take()
            .ok_or_else(|| ModelError::Stage(format!("stage {s} ran out of order")))?;
        // only this stage's parameters; freed with the module after it
        let module = e.install::<B::InnerBackend, Plain>(e.inner.clone(), units)?;
        self.act = Some(
            e.family
                .stage_forward(&module, s, input, &e.device, &mut self.ctx),
        );
        Ok(())
    }

    fn finish(self: Box<Self>, out: &mut EvalOut) -> Result<(), ModelError> {
        let logits = self
            .act
            .ok_or_else(|| ModelError::Stage("the evaluation ran no stage".into()))?
            .into_logits()?;
        let task = self.engine.family.task();
        let by_tokens = self.ctx.segments().is_some();
        score(&task, logits, &self.targets, by_tokens, out)
    }
}

/// A family's compute on backend `B`.
pub struct Engine<F: Family, B: AutodiffBackend> {
    family: Arc<F>,
    layout: ParamLayout,
    /// Layout index of each parameter path.
    index: HashMap<String, usize>,
    unit_of: Vec<usize>,
    /// The layout units of each stage of the forward.
    stages: Vec<Vec<usize>>,
    /// Per stage: whether it or a stage before it has a unit that trains (else its backward
    /// has nothing to compute: frozen embeddings, `model.freeze` of the first layers).
    trains: Vec<bool>,
    template: F::Module<B>,
    inner: F::Module<B::InnerBackend>,
    device: B::Device,
    /// The compute dtype: the device's default float dtype (`backend.precision`, set by
    /// `backend::RankBackend::prepare`). Parameters come in f32 and are cast to it; gradients
    /// go out in f32.
    dtype: FloatDType,
    /// Whether forwards call the fused kernels (`backend.fused`) and the loss is the fused
    /// cross-entropy.
    fused: bool,
}

/// The layout units each of `family`'s stages names, checked: every name a unit of the layout,
/// every unit in some stage, no stage empty.
pub fn stage_units<F: Family>(family: &F, layout: &ParamLayout) -> Result<Vec<Vec<usize>>, String> {
    let stages = family.stages(layout);
    let mut used = vec![false; layout.num_units()];
    let mut out = Vec::with_capacity(stages.len());
    for (s, names) in stages.iter().enumerate() {
        if names.is_empty() {
            return Err(format!("stage {s} names no unit"));
        }
        let mut units = Vec::with_capacity(names.len());
        for name in names {
            let Some(u) = layout.units.iter().position(|u| &u.name == name) else {
                let known: Vec<_> = layout.units.iter().map(|u| u.name.as_str()).collect();
                return Err(format!(
                    "stage {s} names unit `{name}`, which the module does not have (its units: {})",
                    known.join(", ")
                ));
            };
            if units.contains(&u) {
                return Err(format!("stage {s} names unit `{name}` twice"));
            }
            used[u] = true;
            units.push(u);
        }
        out.push(units);
    }
    if let Some(u) = used.iter().position(|&x| !x) {
        return Err(format!(
            "unit `{}` is in no stage (every unit with parameters must be used)",
            layout.units[u].name
        ));
    }
    Ok(out)
}

/// Per stage of `stages`: whether it or a stage before it has a unit that trains.
pub fn trains_up_to(layout: &ParamLayout, stages: &[Vec<usize>]) -> Vec<bool> {
    let mut any = false;
    stages
        .iter()
        .map(|s| {
            any |= s.iter().any(|&u| !layout.unit_frozen(u));
            any
        })
        .collect()
}

impl<F: Family, B: AutodiffBackend> Engine<F, B> {
    pub fn new(
        family: Arc<F>,
        layout: &ParamLayout,
        stages: &[Vec<usize>],
        device: &B::Device,
    ) -> Self {
        let unit_of = (0..layout.params.len())
            .map(|i| layout.unit_of_param(i))
            .collect();
        let index = layout
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        Engine {
            trains: trains_up_to(layout, stages),
            template: family.build::<B>(device),
            inner: family.build::<B::InnerBackend>(device),
            family,
            layout: layout.clone(),
            index,
            unit_of,
            stages: stages.to_vec(),
            device: device.clone(),
            dtype: burn::tensor::get_device_settings::<B::InnerBackend>(device).float_dtype,
            fused: true,
        }
    }

    /// This engine with the fused kernels on or off (`backend.fused`).
    pub fn with_fused(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }

    /// `module` with every parameter of `units` (layout unit, its parameters) installed (as
    /// leaves when `L` is `Leaf`); the other units' parameters stay as they are.
    fn install<M: Backend, L: Lift<M, B::InnerBackend>>(
        &self,
        module: F::Module<M>,
        units: Vec<(usize, UnitParams)>,
    ) -> Result<F::Module<M>, ModelError> {
        self.install_held::<M, L>(module, units, None)
    }

    /// `install`, with each unit's buffer registered in `held` (the fused kernels then keep
    /// its parameters through its slot: `kernels::Resharded`).
    fn install_held<M: Backend, L: Lift<M, B::InnerBackend>>(
        &self,
        module: F::Module<M>,
        units: Vec<(usize, UnitParams)>,
        mut held: Option<&mut kernels::Resharded>,
    ) -> Result<F::Module<M>, ModelError> {
        let mut slots: Vec<Option<Tensor<B::InnerBackend, 1>>> =
            vec![None; self.layout.num_units()];
        let mut want = 0;
        let mut all_held = true;
        for (u, p) in units {
            want += self.layout.units[u].params.len();
            let t = unit_tensor(&self.layout, u, p, &self.device, self.dtype)?;
            if let Some(h) = held.as_deref_mut() {
                all_held &= h.add(&t);
            }
            slots[u] = Some(t);
        }
        if !all_held {
            // a stage reshards all its units or none (its backward refills them all)
            if let Some(h) = held {
                *h = kernels::Resharded::default();
            }
        }
        let mut install = Install::<M, B::InnerBackend, L> {
            views: self.views(),
            layout: &self.layout,
            index: &self.index,
            unit_of: &self.unit_of,
            path: Path::default(),
            installed: 0,
            units: slots,
            error: None,
            lift: PhantomData,
        };
        let module = module.map(&mut install);
        if let Some(e) = install.error {
            return Err(e);
        }
        if install.installed != want {
            return Err(ModelError::Build {
                kind: self.family.kind().to_string(),
                reason: format!(
                    "the module has {} of the {want} parameters of the units installed",
                    install.installed,
                ),
            });
        }
        Ok(module)
    }

    /// Whether parameters are installed as views of their unit's buffer: the family's fused
    /// forward reads them through kiln's kernels only (`Family::kernel_params`).
    fn views(&self) -> bool {
        self.fused && self.family.kernel_params()
    }

    /// Stage `s`'s input in a graph: a leaf whose gradient the backward takes when a stage
    /// before it trains, else a constant.
    fn input_act(&self, s: usize, x: Act<B::InnerBackend>) -> Act<B> {
        if s > 0 && self.trains[s - 1] {
            Act::<B>::leaf(x)
        } else {
            Act::<B>::untracked(x)
        }
    }

    /// `module` with the parameters of stage `s`'s units left without their values (their
    /// graph nodes kept, so `stage_grads` still finds their gradients).
    fn hollow(&self, s: usize, module: F::Module<B>) -> F::Module<B> {
        let mut units = vec![false; self.layout.num_units()];
        for &u in &self.stages[s] {
            units[u] = true;
        }
        module.map(&mut Hollow(Chosen {
            index: &self.index,
            unit_of: &self.unit_of,
            units: &units,
            path: Path::default(),
        }))
    }

    /// The inner-backend module (no autodiff) holding the whole flat `params`.
    fn inner_with(&self, params: &[f32]) -> Result<F::Module<B::InnerBackend>, ModelError> {
        let units = (0..self.layout.num_units())
            .map(|u| {
                (
                    u,
                    UnitParams::Host(params[self.layout.unit_range(u)].to_vec()),
                )
            })
            .collect();
        self.install::<B::InnerBackend, Plain>(self.inner.clone(), units)
    }

    /// Stage `s`'s units paired with `params` (in stage order).
    fn stage_params(
        &self,
        s: usize,
        params: Vec<UnitParams>,
    ) -> Result<Vec<(usize, UnitParams)>, ModelError> {
        let units = &self.stages[s];
        if params.len() != units.len() {
            return Err(ModelError::Stage(format!(
                "stage {s} uses {} units but {} were handed in",
                units.len(),
                params.len()
            )));
        }
        Ok(units.iter().copied().zip(params).collect())
    }

    /// The flat gradient of each unit of stage `s` that trains, taken out of `tape`, in f32 (rounded to
    /// `scale.round_to` and divided by `scale.loss_scale` first, where they are set), in stage
    /// order. The module (the stage's gathered parameters)
    /// is freed before the gradients are joined, so the parameters, their gradients and the
    /// joined copy never exist at once.
    fn stage_grads(
        &self,
        s: usize,
        module: F::Module<B>,
        mut tape: <B as AutodiffBackend>::Gradients,
        scale: GradScale,
    ) -> Result<Vec<Tensor<B::InnerBackend, 1>>, ModelError> {
        let mut chosen = vec![false; self.layout.num_units()];
        let units: Vec<usize> = self.stages[s]
            .iter()
            .copied()
            .filter(|&u| !self.layout.unit_frozen(u))
            .collect();
        for &u in &units {
            chosen[u] = true;
        }
        let mut collect = GradVisitor::<B> {
            tape: &mut tape,
            chosen: Chosen {
                index: &self.index,
                unit_of: &self.unit_of,
                units: &chosen,
                path: Path::default(),
            },
            out: vec![None; self.layout.params.len()],
        };
        module.visit(&mut collect);
        let mut grads = collect.out;
        drop(module);
        drop(tape);
        let mut out = Vec::with_capacity(units.len());
        for u in units {
            let range = self.layout.units[u].params.clone();
            let mut parts = Vec::with_capacity(range.len());
            for i in range {
                let spec = &self.layout.params[i];
                parts.push(
                    grads[i]
                        .take()
                        .ok_or_else(|| ModelError::NoGrad(spec.name.clone()))?,
                );
            }
            let g = if parts.len() == 1 {
                parts
                    .pop()
                    .unwrap_or_else(|| Tensor::zeros([0], &self.device))
            } else {
                Tensor::cat(parts, 0)
            }
            .cast(FloatDType::F32);
            let g = match scale.round_to {
                Some(d) => g.cast(d).cast(FloatDType::F32),
                None => g,
            };
            out.push(if scale.loss_scale == 1.0 {
                g
            } else {
                g.mul_scalar(1.0 / scale.loss_scale)
            });
        }
        Ok(out)
    }
}

impl<F: Family, B: AutodiffBackend> Compute<B> for Engine<F, B> {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn stages(&self) -> &[Vec<usize>] {
        &self.stages
    }

    fn reshards(&self) -> bool {
        self.views() && kernels::fused_on::<B::InnerBackend>(self.dtype.into())
    }

    fn micro<'a>(
        &'a self,
        batch: Input,
        key: StepKey,
        grads: GradScale,
        how: (bool, bool),
    ) -> Box<dyn MicroStep<B> + 'a> {
        Box::new(EngineMicro::new(self, batch, key, grads, how))
    }

    fn evaluate(
        &self,
        params: &[f32],
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<EvalOut, ModelError> {
        let task = self.family.task();
        // installed once for every batch
        let module = self.inner_with(params)?;
        let mut out = EvalOut::default();
        for batch in batches {
            let input = task.input(batch);
            let by_tokens = input.starts.is_some();
            let logits = self.family.forward(
                &module,
                input.x,
                &self.device,
                &mut Forward::eval()
                    .with_fused(self.fused)
                    .with_segments(input.starts)
                    .with_padding(input.padding),
            );
            score(&task, logits, &input.targets, by_tokens, &mut out)?;
        }
        Ok(out)
    }

    fn eval_batch<'a>(&'a self, batch: Batch) -> Box<dyn StagedEval + 'a> {
        let task = self.family.task();
        let input = task.input(batch);
        Box::new(EngineEval {
            engine: self,
            act: Some(Act::Data(input.x)),
            targets: input.targets,
            ctx: Forward::eval()
                .with_fused(self.fused)
                .with_segments(input.starts)
                .with_padding(input.padding),
        })
    }

    fn logits(&self, params: &[f32], x: &Values, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let module = self.inner_with(params)?;
        let x = match (self.family.task(), x) {
            (Task::Classification { .. }, Values::F32(v)) => {
                TensorData::new(v.clone(), shape.to_vec())
            }
            (Task::Classification { .. }, Values::Tokens(v)) => TensorData::new(
                v.iter().map(|&t| t as f32).collect::<Vec<_>>(),
                shape.to_vec(),
            ),
            (Task::LanguageModel { .. }, Values::Tokens(v)) => TensorData::new(
                v.iter().map(|&t| i64::from(t)).collect::<Vec<_>>(),
                shape.to_vec(),
            ),
            (Task::LanguageModel { .. }, Values::F32(v)) => TensorData::new(
                v.iter().map(|&t| t as i64).collect::<Vec<_>>(),
                shape.to_vec(),
            ),
        };
        to_vec(self.family.forward(
            &module,
            x,
            &self.device,
            &mut Forward::eval().with_fused(self.fused),
        ))
    }
}

/// A family behind the `Model` trait: its layout is taken once, from a module built on the CPU
/// (with autodiff, so that trainable parameters and state can be told apart), and so are its
/// stages.
pub struct FamilyModel<F: Family> {
    family: Arc<F>,
    layout: ParamLayout,
    /// The layout as the module lists its parameters, where `layout` froze some (the family
    /// initialises in it: a frozen model starts from the unfrozen one's values).
    natural: Option<ParamLayout>,
    stages: Vec<Vec<usize>>,
    /// Why the family's stages were refused (`Model::check` reports it; the model then runs as
    /// one stage).
    stage_error: Option<String>,
}

impl<F: Family> FamilyModel<F> {
    pub fn new(family: F) -> Self {
        let module = family.build::<Autodiff<NdArray>>(&Default::default());
        let layout = layout_of::<Autodiff<NdArray>, _>(&module);
        let (stages, stage_error) = match stage_units(&family, &layout) {
            Ok(s) => (s, None),
            Err(e) => (vec![(0..layout.num_units()).collect()], Some(e)),
        };
        FamilyModel {
            family: Arc::new(family),
            layout,
            natural: None,
            stages,
            stage_error,
        }
    }

    /// `Model::with_frozen`: the layout with the marked parameters first, each stage's units
    /// those of the same names in it (a unit split in two is used where it was).
    fn frozen(&self, freeze: &[bool]) -> Option<Self> {
        let natural = self.natural.as_ref().unwrap_or(&self.layout);
        let layout = natural.frozen_first(freeze)?;
        // the stages in the natural layout's units
        let natural_stages = match &self.natural {
            None => self.stages.clone(),
            Some(_) => stage_units(self.family.as_ref(), natural).ok()?,
        };
        let stages = natural_stages
            .iter()
            .map(|s| {
                let mut units = Vec::new();
                for &u in s {
                    let name = &natural.units[u].name;
                    units
                        .extend((0..layout.num_units()).filter(|&v| &layout.units[v].name == name));
                }
                units
            })
            .collect();
        Some(FamilyModel {
            family: self.family.clone(),
            layout,
            natural: Some(natural.clone()),
            stages,
            stage_error: self.stage_error.clone(),
        })
    }

    /// The family itself.
    pub fn family(&self) -> &F {
        &self.family
    }

    /// The family's module on backend `B` (no autodiff) holding the flat `params`, for
    /// inference outside the step (sampling).
    pub fn module_with<B: Backend>(
        &self,
        params: &[f32],
        device: &B::Device,
    ) -> Result<F::Module<B>, ModelError> {
        // (installing parameters calls no kernel)
        Engine::<F, Autodiff<B>>::new(self.family.clone(), &self.layout, &self.stages, device)
            .inner_with(params)
    }

    /// The family's decoder on backend `B` for a device behind `Any` (`Model::decoder_erased`).
    #[allow(clippy::type_complexity)]
    fn typed_decoder<B: Backend>(
        &self,
        device: &dyn std::any::Any,
        params: &[f32],
        (cache, fused): (bool, bool),
    ) -> Option<Result<Option<Box<dyn TokenDecoder + '_>>, ModelError>> {
        let device = device.downcast_ref::<B::Device>()?;
        Some(
            self.module_with::<B>(params, device)
                .map(|m| self.family.decoder(m, device.clone(), cache, fused)),
        )
    }

    /// `engine` for a device behind `Any`, boxed again as `Any` (`Model::compute_erased`).
    fn erased_engine<B: AutodiffBackend>(
        &self,
        device: &dyn std::any::Any,
        fused: bool,
    ) -> Option<Box<dyn std::any::Any>> {
        let device = device.downcast_ref::<B::Device>()?;
        Some(Box::new(self.engine::<B>(device, fused)))
    }

    fn engine<B: AutodiffBackend>(&self, device: &B::Device, fused: bool) -> Box<dyn Compute<B>> {
        Box::new(
            Engine::<F, B>::new(self.family.clone(), &self.layout, &self.stages, device)
                .with_fused(fused),
        )
    }
}

impl<F: Family> Model for FamilyModel<F> {
    fn kind(&self) -> &str {
        self.family.kind()
    }
    fn check(&self) -> Result<(), ModelError> {
        match &self.stage_error {
            Some(reason) => Err(ModelError::Build {
                kind: self.family.kind().to_string(),
                reason: format!("`Family::stages`: {reason}"),
            }),
            None => Ok(()),
        }
    }
    fn stages(&self) -> &[Vec<usize>] {
        &self.stages
    }
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }
    fn task(&self) -> Task {
        self.family.task()
    }
    fn init(&self, seed: u64) -> Vec<f32> {
        let Some(natural) = &self.natural else {
            return self.family.init(&self.layout, seed);
        };
        // reordered in place (no second copy of the model): the frozen parameters keep their
        // order and only move towards the head, the trainable ones go to the tail after them
        let mut values = self.family.init(natural, seed);
        let at: HashMap<&str, std::ops::Range<usize>> = self
            .layout
            .params
            .iter()
            .map(|p| (p.name.as_str(), p.range()))
            .collect();
        let mut tail = vec![0f32; self.layout.num_trainable()];
        let frozen = self.layout.frozen;
        for p in &natural.params {
            let to = &at[p.name.as_str()];
            if to.start >= frozen {
                tail[to.start - frozen..to.end - frozen].copy_from_slice(&values[p.range()]);
            }
        }
        for p in &natural.params {
            let to = &at[p.name.as_str()];
            if to.start < frozen {
                values.copy_within(p.range(), to.start);
            }
        }
        values[frozen..].copy_from_slice(&tail);
        values
    }
    fn with_frozen(&self, freeze: &[bool]) -> Option<crate::model::SharedModel> {
        // marked here, or frozen already
        let names: std::collections::HashSet<&str> = self
            .layout
            .params
            .iter()
            .zip(freeze.iter().chain(std::iter::repeat(&false)))
            .filter(|(p, &f)| f || p.offset < self.layout.frozen)
            .map(|(p, _)| p.name.as_str())
            .collect();
        let natural = self.natural.as_ref().unwrap_or(&self.layout);
        let marks: Vec<bool> = natural
            .params
            .iter()
            .map(|p| names.contains(p.name.as_str()))
            .collect();
        self.frozen(&marks)
            .map(|m| Arc::new(m) as crate::model::SharedModel)
    }
    fn weights(&self) -> &dyn WeightAdapter {
        self.family.weights()
    }
    fn flops_per_sample(&self) -> Option<f64> {
        self.family.flops_per_sample()
    }
    fn decay_rule(&self, optim: &crate::config::OptimConfig) -> crate::config::DecayRule {
        optim.decay.unwrap_or(self.family.default_decay())
    }
    fn decoder_erased<'a>(
        &'a self,
        backend: std::any::TypeId,
        device: &dyn std::any::Any,
        params: &[f32],
        cache: bool,
        fused: bool,
    ) -> Option<Result<Option<Box<dyn TokenDecoder + 'a>>, ModelError>> {
        macro_rules! decoders {
            ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
                $(
                    $(#[$a])*
                    if backend == std::any::TypeId::of::<<$ty as AutodiffBackend>::InnerBackend>() {
                        return self.typed_decoder::<<$ty as AutodiffBackend>::InnerBackend>(
                            device, params, (cache, fused),
                        );
                    }
                )*
            };
        }
        super::backends::for_each_backend!(decoders);
        None
    }

    fn compute_erased(
        &self,
        backend: std::any::TypeId,
        device: &dyn std::any::Any,
        fused: bool,
    ) -> Option<Box<dyn std::any::Any>> {
        macro_rules! engines {
            ($($(#[$a:meta])* $v:ident = $name:literal => $ty:ty),* $(,)?) => {
                $(
                    $(#[$a])*
                    if backend == std::any::TypeId::of::<$ty>() {
                        return self.erased_engine::<$ty>(device, fused);
                    }
                )*
            };
        }
        super::backends::for_each_backend!(engines);
        None
    }
}

#[cfg(test)]
mod tests;
