//! The `Model` trait the rest of kiln sees, the `Family` trait a model family implements, and
//! what passes between them: batches, the task, the parameters of a unit and the errors.

use std::sync::Arc;

use burn::module::Module;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{FloatDType, Tensor, TensorData};

use super::portable::{External, WeightFormat};
use crate::config::DecayRule;
pub use crate::data::Values;
pub use crate::kernels::Starts;
use crate::params::{DeviceTensor, Grads, ParamLayout};

/// What a model is trained to do; it decides the loss and the evaluation metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    /// One label per sample: cross-entropy over `classes` logits; accuracy.
    Classification { classes: usize },
    /// Next-token prediction: each sample is a window of `block + 1` token ids (as values of
    /// `x`); the model sees the first `block` and predicts each next one, cross-entropy over
    /// `vocab` logits at every position; perplexity.
    LanguageModel { vocab: usize, block: usize },
}

impl Task {
    /// Logits per row of the model's output.
    pub fn classes(&self) -> usize {
        match *self {
            Task::Classification { classes } => classes,
            Task::LanguageModel { vocab, .. } => vocab,
        }
    }
    /// Targets predicted per sample (tokens per window for a language model).
    pub fn targets_per_sample(&self) -> usize {
        match *self {
            Task::Classification { .. } => 1,
            Task::LanguageModel { block, .. } => block,
        }
    }
}

/// One micro-batch: inputs (row-major, `shape[0]` samples: feature values, or token windows)
/// and one target per sample (unused by a language model, whose targets are the inputs shifted
/// by one).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub x: Values,
    pub shape: Vec<usize>,
    pub y: Vec<u32>,
    /// Rows of documents (a language model's): where each token's document starts in its
    /// row, `[rows * (block + 1)]`. A token whose document is not the next token's has no
    /// target (the last token of a document, and padding, which is a document of one token
    /// each); attention and positions stay inside documents (`Forward::with_segments`).
    /// `None`: each row is one sequence, every token a target.
    pub starts: Option<Starts>,
}

impl From<crate::data::Gathered> for Batch {
    fn from(g: crate::data::Gathered) -> Batch {
        Batch {
            x: g.x,
            shape: g.shape,
            y: g.y,
            starts: g.starts.map(Starts::from),
        }
    }
}

/// A micro-batch in the form the model takes, built on the host ahead of the step (by the data
/// loader's threads when `data.workers` > 0): the input tensor's data, ready to upload, and the
/// target class of each output row (the loss picks each row's log-probability of its target on
/// the device: nothing on the host grows with the number of classes).
#[derive(Debug, Clone)]
pub struct Input {
    /// Features `[rows, ...sample shape]` (f32) for classification; the first `block` token ids
    /// of each window `[rows, block]` (i64) for a language model.
    pub x: TensorData,
    /// The target of each output row (one per sample; `block` per window).
    pub targets: Vec<u32>,
    /// Packed rows: where each input position's document starts (`Batch::starts`).
    pub starts: Option<Starts>,
    /// Rows of documents: which input positions are padding (`None`: none is).
    pub padding: Option<super::forward::Padding>,
}

impl Input {
    /// Output rows (targets) the batch has.
    pub fn rows(&self) -> usize {
        self.targets.len()
    }
}

impl Task {
    /// `batch` as the model takes it: the batch as it is for classification; for a language
    /// model, each window's first `block` tokens and the `block` tokens after them.
    /// The input tensor's data, the targets (`kernels::IGNORE` where a token has none) and,
    /// for rows of documents, where each input position's document starts and which positions
    /// are padding.
    pub fn input(&self, batch: Batch) -> Input {
        match *self {
            Task::Classification { .. } => {
                let x = match batch.x {
                    Values::F32(v) => TensorData::new(v, batch.shape),
                    Values::Tokens(v) => TensorData::new(
                        v.into_iter().map(|t| t as f32).collect::<Vec<_>>(),
                        batch.shape,
                    ),
                };
                Input {
                    x,
                    targets: batch.y,
                    starts: None,
                    padding: None,
                }
            }
            Task::LanguageModel { block, .. } => {
                let rows = batch.shape.first().copied().unwrap_or(0);
                let width = block + 1;
                let tokens: Vec<u32> = match batch.x {
                    Values::Tokens(v) => v,
                    Values::F32(v) => v.into_iter().map(|t| t as u32).collect(),
                };
                let mut inputs = Vec::with_capacity(rows * block);
                let mut targets = Vec::with_capacity(rows * block);
                // (a token of a document that has no loss carries `NO_LOSS`, a row's padding
                // `PADDING`: the input is its id, the target `IGNORE`)
                let marks = crate::data::documents::NO_LOSS | crate::data::documents::PADDING;
                for w in tokens.chunks(width) {
                    inputs.extend(w[..block].iter().map(|&t| i64::from(t & !marks)));
                    targets.extend(w[1..].iter().map(|&t| {
                        if t & marks == 0 {
                            t
                        } else {
                            crate::kernels::IGNORE
                        }
                    }));
                }
                let starts = batch.starts.filter(|s| s.len() == rows * width);
                let padding = starts.as_ref().and_then(|_| {
                    let pad = crate::data::documents::PADDING;
                    let p: Vec<bool> = tokens
                        .chunks(width)
                        .flat_map(|w| w[..block].iter().map(|&t| t & pad != 0))
                        .collect();
                    p.contains(&true).then(|| p.into())
                });
                let starts = starts.map(|s| {
                    let mut input_starts = Vec::with_capacity(rows * block);
                    for (r, row) in s.chunks(width).enumerate() {
                        input_starts.extend_from_slice(&row[..block]);
                        for i in 0..block {
                            if row[i + 1] != row[i] {
                                targets[r * block + i] = crate::kernels::IGNORE;
                            }
                        }
                    }
                    Starts::from(input_starts)
                });
                Input {
                    x: TensorData::new(inputs, [rows, block]),
                    targets,
                    starts,
                    padding,
                }
            }
        }
    }
}

/// A unit's flat parameters: on the host, or in a device buffer (gathered there, or kept there
/// between steps).
pub enum UnitParams {
    Host(Vec<f32>),
    Device(Box<dyn DeviceTensor>),
}

/// What passes between the stages of a forward: the batch's data into the first stage, a
/// tensor of 2, 3 or 4 dimensions between stages (`[rows, features]`, `[samples, positions,
/// dim]`, `[samples, channels, h, w]`), the logits `[rows, classes]` out of the last.
#[derive(Debug, Clone)]
pub enum Act<B: Backend> {
    Data(TensorData),
    D2(Tensor<B, 2>),
    D3(Tensor<B, 3>),
    D4(Tensor<B, 4>),
    /// A hidden state `[samples, positions, dim]` with statistics that travel beside it from
    /// stage to stage (a mixture of experts' router statistics, summed over its blocks).
    WithStats(Tensor<B, 3>, Tensor<B, 3>),
    /// The logits with each sample's loss of the model's own `[samples]`, added to the task's in
    /// training, the samples weighted as their targets are (a mixture of experts'
    /// load-balancing loss).
    WithLoss(Tensor<B, 2>, Tensor<B, 1>),
}

impl<B: Backend> Act<B> {
    /// The logits of the last stage.
    pub fn into_logits(self) -> Result<Tensor<B, 2>, ModelError> {
        Ok(self.into_logits_and_loss()?.0)
    }
    /// The logits of the last stage and the model's own loss, if it has one.
    pub fn into_logits_and_loss(self) -> Result<(Tensor<B, 2>, Option<Tensor<B, 1>>), ModelError> {
        match self {
            Act::D2(t) => Ok((t, None)),
            Act::WithLoss(t, loss) => Ok((t, Some(loss))),
            other => Err(ModelError::Stage(format!(
                "the last stage must return logits [rows, classes], not {}",
                other.describe()
            ))),
        }
    }
    fn describe(&self) -> String {
        match self {
            Act::Data(d) => format!("the input data {:?}", d.shape),
            Act::D2(t) => format!("a tensor {:?}", t.dims()),
            Act::D3(t) => format!("a tensor {:?}", t.dims()),
            Act::D4(t) => format!("a tensor {:?}", t.dims()),
            Act::WithStats(t, s) => {
                format!("a tensor {:?} with statistics {:?}", t.dims(), s.dims())
            }
            Act::WithLoss(t, _) => format!("logits {:?} with a loss", t.dims()),
        }
    }
}

impl<B: AutodiffBackend> Act<B> {
    /// The values without their graph.
    pub fn inner(&self) -> Act<B::InnerBackend> {
        match self {
            Act::Data(d) => Act::Data(d.clone()),
            Act::D2(t) => Act::D2(t.clone().inner()),
            Act::D3(t) => Act::D3(t.clone().inner()),
            Act::D4(t) => Act::D4(t.clone().inner()),
            Act::WithStats(t, s) => Act::WithStats(t.clone().inner(), s.clone().inner()),
            Act::WithLoss(t, l) => Act::WithLoss(t.clone().inner(), l.clone().inner()),
        }
    }
    /// `x` as a new leaf of the graph that requires a gradient (data stays data).
    pub fn leaf(x: Act<B::InnerBackend>) -> Act<B> {
        match x {
            Act::Data(d) => Act::Data(d),
            Act::D2(t) => Act::D2(Tensor::from_inner(t).require_grad()),
            Act::D3(t) => Act::D3(Tensor::from_inner(t).require_grad()),
            Act::D4(t) => Act::D4(Tensor::from_inner(t).require_grad()),
            Act::WithStats(t, s) => Act::WithStats(
                Tensor::from_inner(t).require_grad(),
                Tensor::from_inner(s).require_grad(),
            ),
            Act::WithLoss(t, l) => Act::WithLoss(
                Tensor::from_inner(t).require_grad(),
                Tensor::from_inner(l).require_grad(),
            ),
        }
    }
    /// `x` on this backend outside the graph (nothing derived from it is tracked).
    pub fn untracked(x: Act<B::InnerBackend>) -> Act<B> {
        match x {
            Act::Data(d) => Act::Data(d),
            Act::D2(t) => Act::D2(Tensor::from_inner(t)),
            Act::D3(t) => Act::D3(Tensor::from_inner(t)),
            Act::D4(t) => Act::D4(Tensor::from_inner(t)),
            Act::WithStats(t, s) => Act::WithStats(Tensor::from_inner(t), Tensor::from_inner(s)),
            Act::WithLoss(t, l) => Act::WithLoss(Tensor::from_inner(t), Tensor::from_inner(l)),
        }
    }
    /// The gradient of this leaf in `tape`.
    pub fn grad(&self, tape: &B::Gradients) -> Option<Act<B::InnerBackend>> {
        match self {
            Act::Data(_) => None,
            Act::D2(t) => t.grad(tape).map(Act::D2),
            Act::D3(t) => t.grad(tape).map(Act::D3),
            Act::D4(t) => t.grad(tape).map(Act::D4),
            // (the statistics' gradient is zeros where nothing reached them)
            Act::WithStats(t, s) => Some(Act::WithStats(
                t.grad(tape)?,
                s.grad(tape)
                    .unwrap_or_else(|| s.clone().inner().zeros_like()),
            )),
            Act::WithLoss(t, l) => Some(Act::WithLoss(
                t.grad(tape)?,
                l.grad(tape)
                    .unwrap_or_else(|| l.clone().inner().zeros_like()),
            )),
        }
    }
    /// `sum(self * g)`: its backward gives the vector-Jacobian product of `g` with the stage
    /// that computed `self` (the gradient arriving at `self` is `g`, bit for bit).
    pub fn vjp(self, g: Act<B::InnerBackend>) -> Result<Tensor<B, 1>, ModelError> {
        Ok(match (self, g) {
            (Act::D2(y), Act::D2(g)) => (y * Tensor::from_inner(g)).sum(),
            (Act::D3(y), Act::D3(g)) => (y * Tensor::from_inner(g)).sum(),
            (Act::D4(y), Act::D4(g)) => (y * Tensor::from_inner(g)).sum(),
            // (the statistics are f32 whatever the hidden state's dtype)
            (Act::WithStats(y, s), Act::WithStats(g, gs)) => {
                (y * Tensor::from_inner(g)).sum().cast(FloatDType::F32)
                    + (s * Tensor::from_inner(gs)).sum().cast(FloatDType::F32)
            }
            (y, g) => {
                return Err(ModelError::Stage(format!(
                    "a stage's output ({}) and the gradient arriving at it ({}) differ in shape",
                    y.describe(),
                    g.describe()
                )))
            }
        })
    }
}

/// Per-sample results of an evaluation batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalOut {
    /// Each sample's mean loss over its targets, or (rows of documents) the sum.
    pub losses: Vec<f64>,
    /// The fraction of each sample's targets predicted right, or (rows of documents) their
    /// number.
    pub correct: Vec<f64>,
    /// Rows of documents: each sample's targets (tokens with a loss); empty otherwise.
    pub targets: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("the backend returned data of an unexpected type: {0}")]
    Data(String),
    #[error("a device buffer belongs to another backend")]
    ForeignBuffer,
    #[error("unit {unit} has {got} parameters, the layout says {want}")]
    UnitSize {
        unit: usize,
        got: usize,
        want: usize,
    },
    #[error("parameter `{name}` has shape {module:?} in the module but {layout:?} in the layout")]
    Shape {
        name: String,
        module: Vec<usize>,
        layout: Vec<usize>,
    },
    #[error("parameter `{0}` received no gradient (it is not used by the forward, or not a leaf)")]
    NoGrad(String),
    /// A family's stages do not fit together (a programming error in the family).
    #[error("model stages: {0}")]
    Stage(String),
    #[error("model `{kind}`: {reason}")]
    Build { kind: String, reason: String },
    /// A `[model]` value the registry or a family rejects, with its key and source.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

pub(crate) use super::forward::starts_mask;
pub use super::forward::{Forward, StepKey};

/// One architecture setting where a Hugging Face `config.json` and the model disagree.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigMismatch {
    /// The config.json key, e.g. `n_head`.
    pub theirs: String,
    /// Its value there, as JSON.
    pub value: String,
    /// The `[model]` key that sets it in kiln (`model.heads`), or what fixes it when no key
    /// does (`(kiln's llama MLP)`).
    pub key: String,
    /// kiln's value.
    pub ours: String,
}

/// A family's weights as other libraries name and lay them out (torchtitan's
/// `StateDictAdapter`): one object per family (`Family::weights`, handed out by
/// `Model::weights`), so a new hook is one method here, with its default, and the families that
/// have it override it. Every method has a default: PyTorch's names are Burn's paths, and there
/// is no other format.
pub trait WeightAdapter: Send + Sync {
    /// The name of parameter `path` in the PyTorch module this family mirrors, given after
    /// kiln's module-type renames (a norm's `gamma`/`beta` are already `weight`/`bias`). The
    /// default keeps Burn's path: right for a PyTorch module with the same field names.
    fn torch_name(&self, path: &str) -> String {
        path.to_string()
    }
    /// PyTorch names that hold a copy of another parameter, as `(alias, torch name)` (a tied
    /// `lm_head.weight` of `wte.weight`): an export writes both, an import accepts either.
    fn torch_aliases(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The LoRA adapters the model has (`[model.lora]`), for the exports that merge them or
    /// write them as PEFT does. Default: none.
    fn lora(&self) -> Option<&super::lora::LoraSpec> {
        None
    }
    /// Weight formats of other libraries this family reads and writes, besides PyTorch's names
    /// (`torch_name`) and Burn's, which every family has: the gpt's Hugging Face GPT-2 and
    /// nanoGPT names. `kiln export --format`, `model.init_format` and `auto`'s detection offer
    /// them for this family only. Default: none.
    fn formats(&self) -> Vec<WeightFormat> {
        Vec::new()
    }

    /// The tensors of this family's weights in `format` (one of `formats`), from PyTorch's
    /// (`torch`: one per parameter of `layout`, in order, no aliases): the names, layouts and
    /// tied copies that library uses. Default: PyTorch's.
    fn format_tensors(
        &self,
        _format: WeightFormat,
        _layout: &ParamLayout,
        torch: &[External],
    ) -> Vec<External> {
        torch.to_vec()
    }

    /// Whether `name` in a file of `format` is a buffer, not a parameter (GPT-2's causal
    /// masks): an import skips it. Default: none is.
    fn format_buffer(&self, _format: WeightFormat, _name: &str) -> bool {
        false
    }

    /// Which of `formats` a weight file holding `tensors` (name, shape) is in, when its names
    /// say so (`model.init_format = "auto"`). Default: none.
    fn detect_format(&self, _tensors: &[(&str, &[usize])]) -> Option<WeightFormat> {
        None
    }

    /// The `config.json` a Hugging Face export in `format` writes beside the weights (`Ok(None)`
    /// when the format has none), or why this model cannot be written in it.
    fn hf_config(&self, _format: WeightFormat) -> Result<Option<String>, String> {
        Ok(None)
    }

    /// Where the `config.json` found beside an imported file of `format` (`model.init_from`)
    /// disagrees with this model: one `ConfigMismatch` for each architecture setting that
    /// differs (a head count or an activation no tensor's shape
    /// shows). Default: none checked.
    fn hf_config_mismatches(
        &self,
        _format: WeightFormat,
        _config: &serde_json::Value,
    ) -> Vec<ConfigMismatch> {
        Vec::new()
    }
}

/// The adapter of a family whose PyTorch module has Burn's field names and no other format.
pub struct SameNames;

impl WeightAdapter for SameNames {}

/// A model family: a Burn `#[derive(Module)]` struct and how to run it. kiln owns the
/// parameters (flat buffers, sharded or not): it derives the layout by visiting the module,
/// installs the rank's parameters before each forward and reads the gradients back, so a family
/// only says how to build the module, how to initialise it and how its forward goes.
pub trait Family: Send + Sync + 'static {
    /// The Burn module, on any backend (autodiff for training, its inner backend for
    /// evaluation).
    type Module<B: Backend>: Module<B>;
    /// The `model.kind` it is registered under.
    fn kind(&self) -> &str;
    fn task(&self) -> Task;
    /// The module's structure. Its parameters may stay uninitialised (Burn's lazy init): kiln
    /// never reads them, it replaces every one before use.
    fn build<B: Backend>(&self, device: &B::Device) -> Self::Module<B>;
    /// Initial parameters in `layout`, every one drawn from kiln's RNG keyed by `seed` and a
    /// stable name of the parameter or its layer (see `model::init`).
    fn init(&self, layout: &ParamLayout, seed: u64) -> Vec<f32>;
    /// Logits `[rows, classes]` for inputs `x`: one row per sample for classification (`x` is
    /// f32 data), one row per position (`[samples * block, vocab]`) for a language model (`x` is
    /// i64 token ids `[samples, block]`).
    fn forward<B: Backend>(
        &self,
        module: &Self::Module<B>,
        x: TensorData,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Tensor<B, 2>;
    /// The forward's stages in order, each named by the layout units (`model::units_of`
    /// lists them: `blocks.0`, `wte`, ...) whose parameters it uses. kiln runs the training
    /// forward stage by stage and the backward stage by stage in reverse, so fsdp gathers one
    /// stage's units at a time, a unit's gradient is final (and reduced) as soon as the last
    /// stage using it is done, and activation checkpointing recomputes one stage at a time. A
    /// unit may appear in several stages (tied weights: each use gathers it, the gradients are
    /// summed). Default: one stage with every unit, the whole `forward` (fsdp then gathers the
    /// whole model before it starts).
    fn stages(&self, layout: &ParamLayout) -> Vec<Vec<String>> {
        vec![layout.units.iter().map(|u| u.name.clone()).collect()]
    }
    /// Stage `stage` of the forward: the batch's data (`Act::Data`) into stage 0, the previous
    /// stage's output after it; the last stage returns the logits (`Act::D2`) as `forward`
    /// does. Only the parameters of the stage's units are installed in `module`. Default (for
    /// the one default stage): `forward`.
    fn stage_forward<B: Backend>(
        &self,
        module: &Self::Module<B>,
        stage: usize,
        x: Act<B>,
        device: &B::Device,
        ctx: &mut Forward,
    ) -> Act<B> {
        let _ = stage;
        match x {
            Act::Data(d) => Act::D2(self.forward(module, d, device, ctx)),
            other => other,
        }
    }
    /// The family's weights as other libraries name and lay them out: PyTorch's names, the
    /// formats it reads and writes, Hugging Face's `config.json` (`WeightAdapter`, torchtitan's
    /// state-dict adapter). Default: PyTorch's names are Burn's paths, no other format
    /// (`SameNames`).
    fn weights(&self) -> &dyn WeightAdapter {
        &SameNames
    }

    /// An incremental decoder over `module` (holding trained parameters) on `device`, for `kiln
    /// sample`: `cache` keeps what the context computed (a KV cache) instead of running the
    /// whole context for each token; `fused` calls kiln's fused kernels (`backend.fused`).
    /// Default: none (`kiln sample` refuses the model, naming this hook).
    fn decoder<'a, B: Backend>(
        &'a self,
        _module: Self::Module<B>,
        _device: B::Device,
        _cache: bool,
        _fused: bool,
    ) -> Option<Box<dyn TokenDecoder + 'a>> {
        None
    }

    /// Whether the family's fused forward (`backend.fused`, flex, f32) reads every parameter
    /// through kiln's kernels, which keep a parameter for the backward through its unit's slot
    /// (`kernels::Resharded`): its parameters are then installed as views of their unit's
    /// buffer, and fsdp can drop a stage's gathered parameters after its forward
    /// (`strategy.reshard_after_forward`). Burn's ops keep what they read, and copy a view that
    /// does not start its buffer. Default: no.
    fn kernel_params(&self) -> bool {
        false
    }

    /// Which parameters weight decay applies to when `optim.decay` is not set. Default: all.
    fn default_decay(&self) -> DecayRule {
        DecayRule::All
    }

    /// Training FLOPs (forward and backward) per sample, when the family knows them; kiln
    /// reports FLOP/s (and MFU on a GPU) from it.
    fn flops_per_sample(&self) -> Option<f64> {
        None
    }
}

/// One stage per layout unit, in layout order (`Family::stages` of a model whose units run one
/// after the other: the mlp's layers, the cnn's convolutions and Linear layers).
pub fn stage_per_unit(layout: &ParamLayout) -> Vec<Vec<String>> {
    layout.units.iter().map(|u| vec![u.name.clone()]).collect()
}

/// Whether stage `stage` of `stages` is recomputed in the backward under activation
/// checkpointing (`checkpointing`): every stage but the last, whose backward follows its forward
/// at once (so it keeps its graph).
pub fn recomputed(stage: usize, stages: usize, checkpointing: bool) -> bool {
    checkpointing && stage + 1 < stages
}

/// Whether stage `stage` of `stages` needs its parameters again for its backward: recomputed
/// (`recomputed`), or resharded after its forward (`resharded`).
pub fn regathered(stage: usize, stages: usize, (checkpointing, reshard): (bool, bool)) -> bool {
    recomputed(stage, stages, checkpointing) || resharded(stage, stages, reshard)
}

/// Whether stage `stage` of `stages` drops its parameters after its forward under `reshard`:
/// every stage but the last two, whose backwards come first, right after the forward (torch
/// FSDP2 leaves the last module unsharded after its forward the same way).
pub fn resharded(stage: usize, stages: usize, reshard: bool) -> bool {
    reshard && stage + 2 < stages
}

/// One batch's evaluation, stage by stage (`Compute::eval_batch`).
pub trait StagedEval {
    /// Runs stage `stage` (stages in order) on its units' parameters, in stage order.
    fn forward(&mut self, stage: usize, params: Vec<UnitParams>) -> Result<(), ModelError>;
    /// Adds the batch's per-sample results to `out`, once the last stage ran.
    fn finish(self: Box<Self>, out: &mut EvalOut) -> Result<(), ModelError>;
}

/// One micro-step's math on backend `B`, for a model whose parameters live elsewhere, stage by
/// stage: the caller runs `forward` for every stage in order, then `backward` for every stage in
/// reverse, handing each the parameters of the stage's units (gathered just before, dropped
/// right after: a stage holds them only while it computes, or while its graph waits for the
/// backward when it is not recomputed).
pub trait MicroStep<B: AutodiffBackend> {
    /// Stage `stage`'s forward, with the parameters of its units in `Compute::stages` order.
    fn forward(&mut self, stage: usize, params: Vec<UnitParams>) -> Result<(), ModelError>;
    /// The unscaled mean loss, once the last stage's forward ran.
    fn loss(&self) -> f64;
    /// The part of `loss` that is the model's own (a mixture of experts' load-balancing loss),
    /// if it has one.
    fn own_loss(&self) -> Option<f64> {
        None
    }
    /// Stage `stage`'s backward (a vector-Jacobian step on the gradient arriving at its output):
    /// d(loss * scale)/d(params) of each of its units that trains (`ParamLayout::unit_frozen`:
    /// none of a frozen one's), flat, in f32, in stage order. A recomputed stage
    /// (`recomputed`) needs its parameters again; any other takes `None`.
    fn backward(
        &mut self,
        stage: usize,
        params: Option<Vec<UnitParams>>,
    ) -> Result<Vec<Tensor<B::InnerBackend, 1>>, ModelError>;
}

/// A model's math on backend `B`, for a model whose parameters live elsewhere.
pub trait Compute<B: AutodiffBackend> {
    /// The layout the parameters come in.
    fn layout(&self) -> &ParamLayout;
    /// The forward's stages, in order: the layout units whose parameters each uses.
    fn stages(&self) -> &[Vec<usize>];
    /// Starts one micro-step on `batch`, whose gradients are scaled as `grads` says; with
    /// `checkpointing`, every stage but the last keeps only its input and is recomputed in the
    /// backward (torch `checkpoint_wrapper`); with `reshard` (the caller's decision, `true`
    /// only where `reshards` and not `checkpointing`: `train::step` makes it), every stage but
    /// the last two keeps its graph without its parameters, which its backward is handed again
    /// (`resharded`; torch FSDP's `reshard_after_forward`).
    fn micro<'a>(
        &'a self,
        batch: Input,
        key: StepKey,
        grads: GradScale,
        checkpointing_reshard: (bool, bool),
    ) -> Box<dyn MicroStep<B> + 'a>;
    /// Whether a stage's graph can hold no parameter between its forward and its backward
    /// (`micro`'s `reshard`: a family whose fused forward reads its parameters through kiln's
    /// kernels, `Family::kernel_params`, on flex in f32). Default: no.
    fn reshards(&self) -> bool {
        false
    }
    /// Per-sample loss and correctness of the whole flat `params` on every batch of `batches`
    /// (no dropout); the parameters are installed once.
    fn evaluate(
        &self,
        params: &[f32],
        batches: &mut dyn Iterator<Item = Batch>,
    ) -> Result<EvalOut, ModelError>;
    /// The evaluation of one batch stage by stage, as `evaluate` computes it (the same bits):
    /// the caller hands each stage its units' parameters just before it runs (fsdp gathers
    /// them; they are freed after the stage), so no rank holds the whole model.
    fn eval_batch<'a>(&'a self, batch: Batch) -> Box<dyn StagedEval + 'a>;
    /// The logits (row-major `[rows, classes]`, no dropout) of the whole flat `params` for the
    /// model input `x` of `shape`: samples for classification (one row each); token ids
    /// `[samples, positions]` (at most `block` positions) for a language model, one row per
    /// position (the last row of a sample predicts its next token).
    fn logits(&self, params: &[f32], x: &Values, shape: &[usize]) -> Result<Vec<f32>, ModelError>;
}

/// How a micro-step's gradients come out of `Compute::micro`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradScale {
    /// The gradients are of the loss times this (the micro-batch's weight in the step).
    pub weight: f64,
    /// f16's dynamic loss scale (else 1): it multiplies the loss for the backward, so that small
    /// gradients survive the compute dtype, and each unit's gradient is divided by it again once
    /// it is f32, so the gradients handed out are of the loss times `weight` either way
    /// (non-finite where the scaled ones overflowed).
    pub loss_scale: f64,
    /// `strategy.reduce_dtype` below f32: each unit's gradient is rounded to it, while still
    /// scaled (so f16's loss scale protects it there too), before it is unscaled.
    pub round_to: Option<burn::tensor::FloatDType>,
}

impl GradScale {
    /// Gradients of the loss times `weight`, in f32, nothing else.
    pub fn plain(weight: f64) -> Self {
        GradScale {
            weight,
            loss_scale: 1.0,
            round_to: None,
        }
    }
}

/// One whole micro-step in one call (tests, benchmarks): every stage's forward and backward,
/// each unit's parameters from `params(unit)`, the gradients added into `grads` (flat, in the
/// layout; a device buffer of backend `B` or the host); returns the unscaled mean loss.
pub fn forward_backward<B: AutodiffBackend>(
    compute: &dyn Compute<B>,
    params: &mut dyn FnMut(usize) -> Result<UnitParams, ModelError>,
    batch: Input,
    key: StepKey,
    scale: f64,
    grads: &mut Grads,
    checkpointing: bool,
) -> Result<f64, ModelError> {
    let stages = compute.stages().to_vec();
    let layout = compute.layout().clone();
    let fetch = |params: &mut dyn FnMut(usize) -> Result<UnitParams, ModelError>,
                 s: usize|
     -> Result<Vec<UnitParams>, ModelError> {
        stages[s].iter().map(|&u| params(u)).collect()
    };
    let mut micro = compute.micro(batch, key, GradScale::plain(scale), (checkpointing, false));
    for s in 0..stages.len() {
        micro.forward(s, fetch(params, s)?)?;
    }
    for s in (0..stages.len()).rev() {
        let p = if recomputed(s, stages.len(), checkpointing) {
            Some(fetch(params, s)?)
        } else {
            None
        };
        for (&u, g) in stages[s].iter().zip(micro.backward(s, p)?) {
            let range = layout.unit_range(u);
            match grads {
                Grads::Host(host) => {
                    let g = g
                        .into_data()
                        .convert::<f32>()
                        .into_vec::<f32>()
                        .map_err(|e| ModelError::Data(format!("{e:?}")))?;
                    for (a, v) in host[range].iter_mut().zip(&g) {
                        *a += v;
                    }
                }
                Grads::Device(d) => d
                    .as_any_mut()
                    .downcast_mut::<crate::params::DeviceFlat<B::InnerBackend>>()
                    .ok_or(ModelError::ForeignBuffer)?
                    .add_at(range.start, g),
            }
        }
    }
    Ok(micro.loss())
}

/// A model as the rest of kiln sees it: a layout, an initialisation, a task, and its compute on
/// each backend kiln runs on.
pub trait Model: Send + Sync {
    fn kind(&self) -> &str;
    /// Whether the model is sound as built (its stages fit its layout); the registry asks after
    /// building it.
    fn check(&self) -> Result<(), ModelError> {
        Ok(())
    }
    fn layout(&self) -> &ParamLayout;
    /// The forward's stages: the layout units each uses (see `Family::stages`).
    fn stages(&self) -> &[Vec<usize>];
    fn num_params(&self) -> usize {
        self.layout().num_params()
    }
    fn task(&self) -> Task;
    /// The initial flat parameters for `seed`.
    fn init(&self, seed: u64) -> Vec<f32>;
    /// This model with the layout's parameters that `freeze` marks (by index) frozen
    /// (`ParamLayout::frozen_first`: they lead the buffer, the rest train), initialised as the
    /// unfrozen model is; `None` where nothing is marked or the model cannot (the default).
    fn with_frozen(&self, freeze: &[bool]) -> Option<SharedModel> {
        let _ = freeze;
        None
    }
    /// See `Family::weights`.
    fn weights(&self) -> &dyn WeightAdapter;
    /// See `Family::flops_per_sample`.
    fn flops_per_sample(&self) -> Option<f64>;
    /// `optim.decay`, or the family's default (`Family::default_decay`).
    fn decay_rule(&self, optim: &crate::config::OptimConfig) -> DecayRule;
    /// The family's decoder (`Family::decoder`) on backend `backend` (the `TypeId` of an inner
    /// backend of `model::for_each_backend!`) for `device`, holding `params`; `None` for a type
    /// the list lacks. `decoder_on` asks, typed.
    #[doc(hidden)]
    #[allow(clippy::type_complexity)]
    fn decoder_erased<'a>(
        &'a self,
        backend: std::any::TypeId,
        device: &dyn std::any::Any,
        params: &[f32],
        cache: bool,
        fused: bool,
    ) -> Option<Result<Option<Box<dyn TokenDecoder + 'a>>, ModelError>>;
    /// The model's compute on backend `backend` (the `TypeId` of one of
    /// `model::for_each_backend!`'s types) for `device` (its device), as a
    /// `Box<dyn Compute<B>>` in a `Box<dyn Any>`; `None` for a type the list lacks.
    /// `ComputeOn::compute` asks, typed.
    #[doc(hidden)]
    fn compute_erased(
        &self,
        backend: std::any::TypeId,
        device: &dyn std::any::Any,
        fused: bool,
    ) -> Option<Box<dyn std::any::Any>>;
}

/// Text one token at a time from a trained language model (`kiln sample`): the family's
/// incremental forward (`Family::decoder`; the gpt's keeps each block's keys and values).
pub trait TokenDecoder {
    /// Runs `ids` as the whole context (what came before is dropped); the logits of its last
    /// position, f32.
    fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, ModelError>;
    /// Appends `id` to the context and runs it; the logits of its position.
    fn step(&mut self, id: u32) -> Result<Vec<f32>, ModelError>;
    /// The ids of the context so far.
    fn context(&self) -> &[u32];
}

/// `model`'s decoder on backend `B` (no autodiff; one of `model::for_each_backend!`'s inner
/// backends) on `device`, holding the flat `params`; `Ok(None)` when its family has none.
/// `cache`: keep what the context computed instead of running it again for each token;
/// `fused`: kiln's fused kernels (`backend.fused`).
pub fn decoder_on<'a, B: Backend>(
    model: &'a dyn Model,
    params: &[f32],
    device: &B::Device,
    cache: bool,
    fused: bool,
) -> Result<Option<Box<dyn TokenDecoder + 'a>>, ModelError> {
    match model.decoder_erased(std::any::TypeId::of::<B>(), device, params, cache, fused) {
        Some(d) => d,
        None => not_for_each_backend::<B>(model, "decoder"),
    }
}

/// An erased call (`compute_erased`, `decoder_erased`) on a backend `model::for_each_backend!`
/// does not list: a programming error in the binary, not bad input.
fn not_for_each_backend<B>(model: &dyn Model, what: &str) -> ! {
    panic!(
        "model `{}` has no {what} on {}: the backend is not in `model::for_each_backend!`",
        model.kind(),
        std::any::type_name::<B>()
    )
}

/// The backends a model can be computed on: every Burn autodiff backend; a model computes on
/// the ones in `model::for_each_backend!`.
pub trait ComputeOn: AutodiffBackend {
    /// `model`'s compute on `device`; `fused`: it calls kiln's fused kernels where they apply
    /// (`backend.fused`: the CPU in f32; a family that has none ignores it).
    fn compute(model: &dyn Model, device: &Self::Device, fused: bool) -> Box<dyn Compute<Self>>;
}

impl<B: AutodiffBackend> ComputeOn for B {
    fn compute(model: &dyn Model, device: &Self::Device, fused: bool) -> Box<dyn Compute<Self>> {
        let erased = model
            .compute_erased(std::any::TypeId::of::<B>(), device, fused)
            .and_then(|c| c.downcast::<Box<dyn Compute<B>>>().ok());
        match erased {
            Some(c) => *c,
            None => not_for_each_backend::<B>(model, "compute"),
        }
    }
}

/// A shared model.
pub type SharedModel = Arc<dyn Model>;
