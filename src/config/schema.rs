//! The typed experiment schema: one struct per TOML section, every field documented with its
//! default, unknown keys rejected. Range checks that serde cannot express live in
//! [`crate::config::validate`].

use serde::{Deserialize, Serialize};

pub use super::nccl::NcclConfig;

/// A whole experiment, as resolved from all layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub experiment: ExperimentConfig,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
    pub optim: OptimConfig,
    pub schedule: ScheduleConfig,
    pub sampler: SamplerConfig,
    pub strategy: StrategyConfig,
    pub backend: BackendConfig,
    pub checkpoint: CheckpointConfig,
    pub sweep: SweepConfig,
    pub launch: LaunchConfig,
    pub profile: ProfileConfig,
    /// Left out of the stored config (and so of its hash) while it is all defaults.
    #[serde(skip_serializing_if = "LogConfig::is_default")]
    pub log: LogConfig,
    /// Left out of the stored config (and so of its hash) while it is all defaults.
    #[serde(skip_serializing_if = "SlurmConfig::is_default")]
    pub slurm: SlurmConfig,
}

/// `[log]`: where a run's metrics go besides `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Also write TensorBoard event files (`tb/events.out.tfevents.<time>.<host>` in the run
    /// directory: every number of `metrics.jsonl` by step; `tensorboard --logdir runs`).
    /// Default: `false`.
    pub tensorboard: bool,
}

impl LogConfig {
    pub fn is_default(&self) -> bool {
        *self == LogConfig::default()
    }
}

/// A config choice as the user writes it (`ddp`, not `Ddp`): its serde name.
pub fn choice_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Top-level section names, in the order they are printed.
pub const SECTIONS: &[&str] = &[
    "experiment",
    "model",
    "data",
    "train",
    "optim",
    "schedule",
    "sampler",
    "strategy",
    "backend",
    "checkpoint",
    "sweep",
    "launch",
    "profile",
    "log",
    "slurm",
];

/// `[experiment]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExperimentConfig {
    /// Name of the run directory under `output_dir`. Default: `"experiment"`.
    pub name: String,
    /// Seed for model initialisation and dropout. Default: `0`.
    pub seed: u64,
    /// Where run directories are created. Default: `"runs"`.
    pub output_dir: String,
}

impl Default for ExperimentConfig {
    fn default() -> Self {
        ExperimentConfig {
            name: "experiment".into(),
            seed: 0,
            output_dir: "runs".into(),
        }
    }
}

/// Activation between hidden layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    Relu,
    Gelu,
    Tanh,
    Sigmoid,
}

/// `model.gelu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeluKind {
    Exact,
    Tanh,
}

/// `model.init_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitFormat {
    Auto,
    Kiln,
    HfGpt2,
    Nanogpt,
}

/// `[model]`. Keys kiln does not know are kept in `extra`: a model family registered by the
/// user's own binary reads them with `Resolved::model_keys`; for kiln's own families they are
/// unknown keys (an error naming the key, its source and the closest key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// Model family: a name in the model registry (built in: `"mlp"`, `"cnn"`, `"gpt"`).
    /// Default: `"mlp"`.
    pub kind: String,
    /// mlp: input features. Default: `1000`.
    pub input_size: usize,
    /// Widths of the hidden Linear layers, in order (cnn: after the convolutions). Default:
    /// `[500]`.
    pub hidden_sizes: Vec<usize>,
    /// cnn: output channels of each stage Conv2d -> ReLU -> MaxPool2d(2), in order; required for
    /// cnn. Default: `[]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<usize>,
    /// cnn: the (odd) kernel size of every Conv2d, padded to keep the image size. Default: `3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_size: Option<usize>,
    /// gpt: vocabulary size (at least 256 for byte-level text). Default: `256`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// gpt: tokens of context (and of each training window). Default: `128`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    /// gpt: transformer blocks. Default: `4`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// gpt: attention heads (`dim` must be a multiple). Default: `4`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    /// gpt: embedding width. Default: `128`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim: Option<usize>,
    /// gpt: biases in the Linear and LayerNorm layers. Default: `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias: Option<bool>,
    /// gpt: the output layer shares the token embedding's weights. Default: `true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tie_embeddings: Option<bool>,
    /// gpt: the MLP's GELU, `"exact"` (erf; nanoGPT's and PyTorch's `nn.GELU()`) or `"tanh"`
    /// (the tanh approximation: GPT-2's, Hugging Face's `gelu_new`). Default: `"exact"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gelu: Option<GeluKind>,
    /// Start training from these weights instead of the seeded initialisation: a safetensors
    /// file from `kiln export` (either format) or PyTorch's
    /// `safetensors.torch.save_file(model.state_dict(), path)` (f16/bf16/f64 are converted to
    /// f32). Every tensor must be there with its shape, and nothing else. A relative path is
    /// relative to the experiment file. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
    /// The names and layouts `init_from` holds: `"auto"` (kiln's exports by their metadata,
    /// gpt files by their names and shapes), `"kiln"` (a `kiln export`, either format),
    /// `"hf-gpt2"` (Hugging Face's `GPT2LMHeadModel`: `transformer.h.<i>.attn.c_attn.weight`,
    /// Conv1D weights `[in, out]`) or `"nanogpt"` (nanoGPT's `GPT`: the same names, Linear
    /// weights `[out, in]`, a `_orig_mod.` prefix of `torch.compile` taken off). Default:
    /// `"auto"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_format: Option<InitFormat>,
    /// The keys of a family kiln does not know (a user's model). Default: none.
    #[serde(flatten)]
    pub extra: std::collections::BTreeMap<String, toml::Value>,
    /// Output classes. Default: `10`.
    pub classes: usize,
    /// Activation after each hidden layer: relu, gelu, tanh, sigmoid. Default: `"relu"`.
    pub activation: Activation,
    /// Dropout probability after each hidden activation, in [0, 1). Default: `0.0`.
    pub dropout: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            kind: "mlp".into(),
            input_size: 1000,
            hidden_sizes: vec![500],
            channels: Vec::new(),
            kernel_size: None,
            vocab_size: None,
            block_size: None,
            layers: None,
            heads: None,
            dim: None,
            bias: None,
            tie_embeddings: None,
            gelu: None,
            init_from: None,
            init_format: None,
            extra: Default::default(),
            classes: 10,
            activation: Activation::Relu,
            dropout: 0.0,
        }
    }
}

/// Dataset source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataKind {
    Synthetic,
    Csv,
    Idx,
    Text,
    /// nanoGPT's token files: little-endian `u16` (or `u32`) ids, mapped.
    Tokens,
}

fn is_bytes(s: &String) -> bool {
    s == "bytes"
}

/// `data.dtype`: the element type of a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenFileDtype {
    U16,
    U32,
}

/// `[data]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// `"synthetic"` (a learnable classification task from a fixed random teacher), `"csv"`,
    /// `"idx"` (MNIST-style IDX image and label files, raw or `.gz`), `"text"` (any file as
    /// byte-level tokens, for `model.kind = "gpt"`) or `"tokens"` (nanoGPT's token files,
    /// memory-mapped, for `model.kind = "gpt"`). Default: `"synthetic"`.
    pub kind: DataKind,
    /// tokens: the file's element type, `"u16"` (nanoGPT's `prepare.py`) or `"u32"` (for
    /// vocabularies over 65,535). Default: `"u16"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<TokenFileDtype>,
    /// text, tokens: `"bytes"` (each byte a token), `"gpt2"` (GPT-2's BPE) or the path of a
    /// Hugging Face `tokenizer.json`; text files are tokenized with it as they load, and
    /// `kiln sample` encodes the prompt and decodes the output with it (a token file's ids must
    /// come from it: `kiln tokenize`). Default: `"bytes"`.
    #[serde(skip_serializing_if = "is_bytes")]
    pub tokenizer: String,
    /// synthetic: training samples. Default: `1000`.
    pub samples: usize,
    /// synthetic: evaluation samples (drawn from the same teacher). Default: `200`.
    pub eval_samples: usize,
    /// synthetic: features per sample. Default: `1000`.
    pub features: usize,
    /// synthetic: make every sample an image of shape `[C, H, W]` (its C*H*W values replace
    /// `features`). Default: `[]` (flat samples of `features` values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image: Vec<usize>,
    /// synthetic: make every sample a window of `model.block_size + 1` random tokens in
    /// 0..tokens (for gpt benchmarks). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<usize>,
    /// Number of classes (csv: labels must be integers in 0..classes). Default: `10`.
    pub classes: usize,
    /// synthetic: seed of the teacher and the samples. Default: `0`.
    pub seed: u64,
    /// csv: training file; idx: training images. Relative to the experiment file that sets it.
    /// No default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// csv: evaluation file; idx: evaluation images (optional). Relative to the experiment file
    /// that sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_path: Option<String>,
    /// idx: training labels (IDX1). Relative to the experiment file that sets it. No default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels_path: Option<String>,
    /// idx: evaluation labels, with `eval_path`. Relative to the experiment file that sets it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_labels_path: Option<String>,
    /// idx: `[mean, std]` applied to pixels after scaling them to [0, 1]. Default: `[]` (none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub normalize: Vec<f64>,
    /// text, tokens: tokens between the starts of consecutive training windows (each window is
    /// `model.block_size + 1` tokens). Default: `model.block_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stride: Option<usize>,
    /// text, tokens: the fraction at the end of the file held out for evaluation, in [0, 1)
    /// (tokens: without `data.eval_path`). Default: `0.1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_fraction: Option<f64>,
    /// csv: the label column, by header name or 0-based index (a string or an integer).
    /// Default: `"label"`.
    #[serde(deserialize_with = "name_or_index")]
    pub label_column: String,
    /// csv: whether the first line is a header. Default: `true`.
    pub header: bool,
    /// Loader threads of each rank that assemble the next micro-batches while the rank computes
    /// (torch `DataLoader(num_workers=N)`); 0 assembles them on the rank's own thread, between
    /// steps. They come out of the rank's share of the cores. The samples and every loss are the
    /// same for any value. Default: `0`.
    pub workers: usize,
    /// With `workers` > 0: micro-batches each rank has assembled or in assembly ahead of the one
    /// it computes on (torch `prefetch_factor`, but per rank rather than per worker). Default:
    /// `2`.
    pub prefetch: usize,
    /// `[data.augment]`: random transformations of training images (samples of shape
    /// `[C, H, W]`), drawn by (experiment seed, epoch, sample index), so the same under any
    /// number of workers or ranks and across a resume. Evaluation data is never augmented.
    /// Default: unset (none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augment: Option<AugmentConfig>,
}

/// `[data.augment]`, torchvision's `RandomCrop(size, padding)` then `RandomHorizontalFlip()`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AugmentConfig {
    /// Pads each side of the image by this many pixels (with the value of a black pixel, after
    /// `data.normalize`) and crops a window of the original size at a random offset; 0 off.
    /// Default: `0`.
    pub random_crop: usize,
    /// Mirrors the image left to right with probability 1/2. Default: `false`.
    pub hflip: bool,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            kind: DataKind::Synthetic,
            dtype: None,
            tokenizer: "bytes".into(),
            samples: 1000,
            eval_samples: 200,
            features: 1000,
            image: Vec::new(),
            tokens: None,
            classes: 10,
            seed: 0,
            path: None,
            eval_path: None,
            labels_path: None,
            eval_labels_path: None,
            normalize: Vec::new(),
            stride: None,
            eval_fraction: None,
            label_column: "label".into(),
            header: true,
            workers: 0,
            prefetch: 2,
            augment: None,
        }
    }
}

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Passes over the training data. Default: `1`.
    pub epochs: usize,
    /// When set, training ends after this many optimizer steps whatever `epochs` says.
    /// Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Micro-batch size of one device (rank). Default: `32`.
    pub batch_size: usize,
    /// Micro-batches per optimizer step. Default: `1`.
    pub grad_accum_steps: usize,
    /// Evaluate every N optimizer steps; 0 evaluates only at the end. Default: `0`.
    pub eval_every: usize,
    /// Log a metrics line every N optimizer steps (and always the last). Default: `10`.
    pub log_every: usize,
    /// `[train.early_stopping]`: stop when the metric stops improving (Lightning's
    /// EarlyStopping), checked at each evaluation. Default: unset (off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStoppingConfig>,
    /// none, or units: the forward keeps only each stage's input and the backward recomputes
    /// the stage (torch `checkpoint_wrapper` on every block), trading a second forward for the
    /// activations; fsdp with full sharding needs it for its memory (a kept graph holds the
    /// gathered parameters). Losses are the same bits either way. Default: `"none"`.
    pub activation_checkpointing: ActivationCheckpointing,
}

/// `train.activation_checkpointing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActivationCheckpointing {
    None,
    Units,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            epochs: 1,
            max_steps: None,
            batch_size: 32,
            grad_accum_steps: 1,
            eval_every: 0,
            log_every: 10,
            early_stopping: None,
            activation_checkpointing: ActivationCheckpointing::None,
        }
    }
}

/// An evaluation metric that early stopping and the best checkpoint watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalMetric {
    EvalLoss,
    /// Classification only.
    EvalAccuracy,
    /// Language models only.
    EvalPerplexity,
}

impl EvalMetric {
    pub fn name(self) -> &'static str {
        match self {
            EvalMetric::EvalLoss => "eval_loss",
            EvalMetric::EvalAccuracy => "eval_accuracy",
            EvalMetric::EvalPerplexity => "eval_perplexity",
        }
    }
    /// Which way is better when the config does not say: up for accuracy, down otherwise.
    pub fn default_mode(self) -> MetricMode {
        match self {
            EvalMetric::EvalAccuracy => MetricMode::Max,
            _ => MetricMode::Min,
        }
    }
}

/// `[train.early_stopping]`: after `patience` evaluations in a row in which `metric` did not
/// improve on its best by more than `min_delta`, training stops and saves a checkpoint there
/// (whatever `checkpoint.at_end` says: a resume must know the run is complete).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EarlyStoppingConfig {
    /// eval_loss, eval_accuracy (classification) or eval_perplexity (language model).
    /// Default: `"eval_loss"`.
    pub metric: EvalMetric,
    /// min or max. Default: `"max"` for eval_accuracy, else `"min"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<MetricMode>,
    /// Evaluations without improvement before stopping. Default: `3`.
    pub patience: usize,
    /// The least change that counts as an improvement. Default: `0.0`.
    pub min_delta: f64,
}

impl Default for EarlyStoppingConfig {
    fn default() -> Self {
        EarlyStoppingConfig {
            metric: EvalMetric::EvalLoss,
            mode: None,
            patience: 3,
            min_delta: 0.0,
        }
    }
}

impl EarlyStoppingConfig {
    pub fn mode(&self) -> MetricMode {
        self.mode.unwrap_or(self.metric.default_mode())
    }
}

/// `[checkpoint] keep_best = { metric = "eval_loss", mode = "min" }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeepBestConfig {
    /// eval_loss, eval_accuracy (classification) or eval_perplexity (language model).
    pub metric: EvalMetric,
    /// min or max. Default: `"max"` for eval_accuracy, else `"min"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MetricMode>,
}

impl KeepBestConfig {
    pub fn mode(&self) -> MetricMode {
        self.mode.unwrap_or(self.metric.default_mode())
    }
}

/// Optimizer algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimKind {
    Sgd,
    Adam,
    Adamw,
}

/// `[optim]` (PyTorch semantics for every algorithm).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimConfig {
    /// sgd, adam or adamw. Default: `"sgd"`.
    pub kind: OptimKind,
    /// Peak learning rate. Default: `0.01`.
    pub lr: f64,
    /// sgd: momentum factor in [0, 1). Default: `0.0`.
    pub momentum: f64,
    /// sgd: Nesterov momentum (needs momentum > 0). Default: `false`.
    pub nesterov: bool,
    /// L2 penalty (sgd, adam) or decoupled decay (adamw). Default: `0.0`.
    pub weight_decay: f64,
    /// adam/adamw: (beta1, beta2). Default: `[0.9, 0.999]`.
    pub betas: [f64; 2],
    /// adam/adamw: denominator epsilon. Default: `1e-8`.
    pub eps: f64,
    /// Clip the global gradient norm to this value. Default: unset (no clipping).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_clip_norm: Option<f64>,
    /// Which parameters `weight_decay` applies to: `"matrices"` (those of two or more
    /// dimensions: weights and embeddings, not biases or norms; nanoGPT's and torchtitan's
    /// rule) or `"all"`. Default: `"matrices"` for gpt, `"all"` for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay: Option<DecayRule>,
}

/// `optim.decay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecayRule {
    Matrices,
    All,
}

impl Config {
    /// `optim.decay`, or its default for the model.
    pub fn decay_rule(&self) -> DecayRule {
        self.optim.decay.unwrap_or(if self.model.kind == "gpt" {
            DecayRule::Matrices
        } else {
            DecayRule::All
        })
    }
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            kind: OptimKind::Sgd,
            lr: 0.01,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            betas: [0.9, 0.999],
            eps: 1e-8,
            grad_clip_norm: None,
            decay: None,
        }
    }
}

/// Learning-rate schedule shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    Constant,
    Step,
    Cosine,
}

/// `[schedule]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// constant, step or cosine. Default: `"constant"`.
    pub kind: ScheduleKind,
    /// Linear warm-up from 0 to `optim.lr` over this many steps. Default: `0`.
    pub warmup_steps: usize,
    /// step: multiply the lr by `gamma` every `step_size` steps. Default: `100`.
    pub step_size: usize,
    /// step: decay factor. Default: `0.1`.
    pub gamma: f64,
    /// cosine: the lr reached at the last step. Default: `0.0`.
    pub min_lr: f64,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            kind: ScheduleKind::Constant,
            warmup_steps: 0,
            step_size: 100,
            gamma: 0.1,
            min_lr: 0.0,
        }
    }
}

/// `[sampler]` (torch DistributedSampler semantics).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplerConfig {
    /// Shuffle the training data each epoch. Default: `true`.
    pub shuffle: bool,
    /// Seed of the shuffle (the permutation of epoch e uses seed + e). Default: `0`.
    pub seed: u64,
    /// Drop the tail that does not divide evenly over ranks instead of padding. Default: `false`.
    pub drop_last: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            shuffle: true,
            seed: 0,
            drop_last: false,
        }
    }
}

/// Parallel strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StrategyKind {
    /// One device.
    Single,
    /// torch DataParallel: one optimizer on the main device, replicas every step.
    Dp,
    /// torch DistributedDataParallel: one optimizer per rank, gradients averaged by all-reduce.
    Ddp,
    /// torch FullyShardedDataParallel: parameters, gradients and optimizer state sharded.
    Fsdp,
}

/// `strategy.devices`: a count or a list of device ordinals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    Count(usize),
    List(Vec<usize>),
}

impl Devices {
    /// Ranks on this node.
    pub fn count(&self) -> usize {
        match self {
            Devices::Count(n) => *n,
            Devices::List(l) => l.len(),
        }
    }

    /// The device ordinal of each rank, given how many devices exist (`count` wraps around).
    pub fn ordinals(&self, available: usize) -> Vec<usize> {
        match self {
            Devices::Count(n) => (0..*n).map(|r| r % available.max(1)).collect(),
            Devices::List(l) => l.clone(),
        }
    }
}

/// `strategy.collective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveKind {
    Auto,
    Host,
    Nccl,
}

/// `backend.autotune`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutotuneLevel {
    Minimal,
    Balanced,
    Extensive,
    Full,
}

/// `backend.precision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

/// `[backend.loss_scale]`: with `backend.precision = "f16"` the loss is multiplied by a scale
/// before the backward, so that small gradients do not flush to zero in f16, and each gradient
/// is divided by it again in f32. A step whose gradient has an infinite or NaN value (on any
/// rank) is skipped and the scale multiplied by `backoff_factor`; after `growth_interval`
/// steps in a row without one it is multiplied by `growth_factor` (torch `GradScaler`). The
/// scale and its count are saved in checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LossScaleConfig {
    /// The first scale. Default: `65536` (2^16).
    pub init_scale: f64,
    /// Greater than 1. Default: `2`.
    pub growth_factor: f64,
    /// Between 0 and 1. Default: `0.5`.
    pub backoff_factor: f64,
    /// Steps in a row without an overflow before the scale grows, at least 1. Default: `2000`.
    pub growth_interval: u64,
}

impl Default for LossScaleConfig {
    fn default() -> Self {
        LossScaleConfig {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaleConfig {
    pub fn is_default(&self) -> bool {
        *self == LossScaleConfig::default()
    }
}

/// fsdp: what is sharded (torch `ShardingStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharding {
    /// FULL_SHARD (ZeRO-3): parameters, gradients and optimizer state.
    Full,
    /// SHARD_GRAD_OP (ZeRO-2): gradients and optimizer state; parameters stay whole.
    GradOp,
    /// NO_SHARD: nothing (like ddp).
    None,
}

/// Where a device backend keeps the parameters and optimizer state between steps (torch FSDP
/// `CPUOffload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Offload {
    /// On the device, where the update runs: a step moves no parameter or optimizer state
    /// across the host boundary.
    None,
    /// On the host, where the optimizer runs: parameters are uploaded for each forward and
    /// gradients read back (saves device memory, costs transfers). The same numbers.
    Cpu,
}

/// fsdp: what is flattened and gathered together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsdpUnit {
    /// The whole model is one flat unit.
    Model,
    /// Each top-level layer is its own unit, gathered one at a time.
    Layer,
}

/// `[strategy]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StrategyConfig {
    /// single, dp, ddp or fsdp. Default: `"single"`.
    pub kind: StrategyKind,
    /// Devices (ranks) on this node: a count, or (CUDA) a list of GPU ordinals such as `[0, 1]`.
    /// CPU devices are virtual, one thread each. Default: `1`.
    pub devices: Devices,
    /// How ranks communicate: auto, host (shared memory; on CUDA host-staged) or nccl (CUDA).
    /// `auto` is nccl on CUDA when every rank has its own GPU, else host. Default: `"auto"`.
    pub collective: CollectiveKind,
    /// Seconds a collective op waits for every rank before failing. Default: `300`.
    pub timeout_secs: u64,
    /// ddp: gradients are all-reduced in buckets of at most this many MiB. Default: `25`.
    pub bucket_cap_mb: f64,
    /// ddp: skip communication on accumulation micro-steps before the last (torch `no_sync`).
    /// Default: `true`.
    pub no_sync: bool,
    /// ddp and fsdp: communication runs on a thread beside the compute (ddp all-reduces each
    /// unit's buckets as soon as its backward is done, fsdp prefetches the next unit's
    /// all-gather and reduce-scatters behind the backward); over NCCL the ops run on NCCL's own
    /// CUDA stream instead of a thread. `false` runs every op where the step reaches it, for
    /// comparison and debugging. Results are the same bits either way. Default: `true`.
    pub overlap: bool,
    /// fsdp: full, grad_op or none. Default: `"full"`.
    pub sharding: Sharding,
    /// fsdp: model or layer. Default: `"model"`.
    pub unit: FsdpUnit,
    /// Device backends (cuda, wgpu): none (parameters and optimizer state stay on the device)
    /// or cpu (kept on the host, like torch's CPU offload). Nothing changes on the CPU.
    /// Default: `"none"`.
    pub offload: Offload,
    /// dp, ddp and fsdp: the dtype gradients are reduced in, f32, bf16 or f16 (torch FSDP's
    /// `reduce_dtype`). Each unit's gradient is rounded to it as it comes out of the backward
    /// (still loss-scaled under f16), so the reduction sums the values a reduction in that
    /// dtype would send; the sum itself is taken in f32 and the collectives carry f32 (no
    /// bytes saved yet).
    /// Default: `"f32"`.
    pub reduce_dtype: Precision,
}

impl Default for StrategyConfig {
    fn default() -> Self {
        StrategyConfig {
            kind: StrategyKind::Single,
            devices: Devices::Count(1),
            collective: CollectiveKind::Auto,
            timeout_secs: 300,
            bucket_cap_mb: 25.0,
            no_sync: true,
            overlap: true,
            sharding: Sharding::Full,
            unit: FsdpUnit::Model,
            offload: Offload::None,
            reduce_dtype: Precision::F32,
        }
    }
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    /// Burn's wgpu backend (the `wgpu` feature): Vulkan, Metal or DX12, on a GPU or on a
    /// software driver (Mesa's lavapipe).
    Wgpu,
}

/// Which wgpu adapter the ranks compute on (`backend.device = "wgpu"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Adapter {
    /// wgpu's default choice (a discrete GPU, else an integrated one, else a software one).
    Auto,
    /// A software adapter (on Linux, Mesa's lavapipe).
    Cpu,
    /// The first discrete GPU.
    Discrete,
    /// The first integrated GPU.
    Integrated,
}

/// Which Burn CPU backend runs the math.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CpuBackend {
    /// The measured default (see CHANGELOG.md).
    Auto,
    Ndarray,
    Flex,
}

/// `[backend]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// cpu, cuda (needs the `cuda` feature) or wgpu (needs the `wgpu` feature). Default:
    /// `"cpu"`.
    pub device: Device,
    /// wgpu: the adapter, auto, cpu (a software one such as lavapipe), discrete or integrated.
    /// Default: `"auto"`.
    pub adapter: Adapter,
    /// CPU backend: auto, ndarray or flex. Default: `"auto"`.
    pub cpu: CpuBackend,
    /// CPU threads for the math of each rank; 0 shares the cores evenly among the ranks.
    /// Default: `0`.
    pub threads: usize,
    /// The compute dtype: f32, bf16 or f16 (CUDA, flex, and wgpu where the adapter has it).
    /// Below f32 it is mixed precision, like torch's autocast with FSDP's
    /// `MixedPrecisionPolicy`: the parameters and optimizer state stay f32 (the masters), each
    /// unit's parameters are cast to this dtype as it is installed, activations are in it, the
    /// loss is taken in f32 and the gradients come back in f32. f16 turns on dynamic loss
    /// scaling (`[backend.loss_scale]`). Default: `"f32"`.
    pub precision: Precision,
    /// `[backend.loss_scale]`: f16's dynamic loss scaling (torch `GradScaler`). Default: torch's
    /// values.
    #[serde(skip_serializing_if = "LossScaleConfig::is_default")]
    pub loss_scale: LossScaleConfig,
    /// CUDA: how hard cubecl searches for the fastest kernel variant the first time it meets a
    /// shape: minimal, balanced, extensive or full (its results are cached with the compiled
    /// kernels, see `kiln env`). Default: unset (cubecl's `balanced`, or
    /// `CUBECL_AUTOTUNE_LEVEL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autotune: Option<AutotuneLevel>,
    /// `[backend.nccl]`: NCCL's environment variables for this experiment, exported before
    /// NCCL loads, the same on every node (node 0's values), and recorded in the run's
    /// `config.toml` together with any other `NCCL_*` variable the environment had. Default:
    /// nothing set.
    #[serde(skip_serializing_if = "NcclConfig::is_default")]
    pub nccl: NcclConfig,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            device: Device::Cpu,
            adapter: Adapter::Auto,
            cpu: CpuBackend::Auto,
            threads: 0,
            precision: Precision::F32,
            loss_scale: LossScaleConfig::default(),
            autotune: None,
            nccl: NcclConfig::default(),
        }
    }
}

/// `[checkpoint]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Save every N optimizer steps; 0 never. Default: `0`.
    pub every_steps: usize,
    /// Save at the end of every N epochs; 0 never. Default: `0`.
    pub every_epochs: usize,
    /// Save when training ends. Default: `true`.
    pub at_end: bool,
    /// Keep the newest N checkpoints (at least 1). Default: `3`.
    pub keep_last: usize,
    /// Also keep every checkpoint whose step is a multiple of N, forever; 0 off. Default: `0`.
    pub keep_every: usize,
    /// Where checkpoints go, relative to the run directory. Default: `"checkpoints"`.
    pub dir: String,
    /// `kiln run` resumes the newest unfinished run of the experiment, as with `--resume`.
    /// Default: `false`.
    pub auto_resume: bool,
    /// Save a checkpoint at each evaluation that improves this metric; retention never deletes
    /// the best one, and `--from best` names it. Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keep_best: Option<KeepBestConfig>,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            every_steps: 0,
            every_epochs: 0,
            at_end: true,
            keep_last: 3,
            keep_every: 0,
            dir: "checkpoints".into(),
            auto_resume: false,
            keep_best: None,
        }
    }
}

/// `[profile]`: Chrome traces of chosen steps (torch.profiler's schedule): skip `wait` steps,
/// `warmup` steps more, record `active` steps; `repeat` such cycles (0: until the end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProfileConfig {
    /// Write `trace/rank-<r>.json` and `trace/all.json`. Default: `false`.
    pub enabled: bool,
    /// Steps skipped at the start of each cycle. Default: `1`.
    pub wait: usize,
    /// Steps run (not recorded) before the recorded ones. Default: `1`.
    pub warmup: usize,
    /// Steps recorded per cycle (at least 1). Default: `3`.
    pub active: usize,
    /// Cycles; 0 repeats until training ends. Default: `1`.
    pub repeat: usize,
    /// Ranks traced; empty means every rank. Default: `[]`.
    pub ranks: Vec<usize>,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig {
            enabled: false,
            wait: 1,
            warmup: 1,
            active: 3,
            repeat: 1,
            ranks: Vec::new(),
        }
    }
}

impl ProfileConfig {
    /// Whether step `i` of this session (0-based) is recorded.
    pub fn records(&self, i: usize) -> bool {
        let cycle = self.wait + self.warmup + self.active.max(1);
        if !self.enabled || (self.repeat > 0 && i >= self.repeat * cycle) {
            return false;
        }
        i % cycle >= self.wait + self.warmup
    }
    /// Whether `rank` is traced.
    pub fn traces(&self, rank: usize) -> bool {
        self.enabled && (self.ranks.is_empty() || self.ranks.contains(&rank))
    }
}

/// `[slurm]`: defaults for `kiln submit` and `kiln sweep --executor slurm` (each also a flag).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlurmConfig {
    /// Nodes (`sbatch --nodes`). Default: `1`.
    pub nodes: usize,
    /// kiln processes per node, each one kiln node of the job. Default: `1` (one process
    /// drives all of a node's devices); more is for CPU jobs. Default: `1`.
    pub tasks_per_node: usize,
    /// GPUs per node (`--gpus-per-node`). Default: unset (`strategy.devices` on CUDA, none on
    /// the CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<usize>,
    /// CPUs per task (`--cpus-per-task`; also kiln's `backend.threads` budget). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<usize>,
    /// Time limit, `HH:MM:SS` or `D-HH:MM:SS` (`--time`). Default: unset (the partition's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Default: unset (the cluster's default partition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Seconds before the time limit at which Slurm sends SIGUSR1 (`--signal=USR1@N`): kiln
    /// checkpoints, stops and the job requeues itself. Default: `120`.
    pub signal_secs: u64,
    /// Requeue the job after a preemption or a stop before the time limit, and continue it in
    /// the same run directory (`--requeue`). Default: `true`.
    pub requeue: bool,
    /// More `sbatch` options, each written as an `#SBATCH` line. Default: `[]`.
    pub sbatch_args: Vec<String>,
}

impl Default for SlurmConfig {
    fn default() -> Self {
        SlurmConfig {
            nodes: 1,
            tasks_per_node: 1,
            gpus_per_node: None,
            cpus_per_task: None,
            time: None,
            partition: None,
            account: None,
            signal_secs: 120,
            requeue: true,
            sbatch_args: Vec::new(),
        }
    }
}

impl SlurmConfig {
    pub fn is_default(&self) -> bool {
        *self == SlurmConfig::default()
    }
}

/// A column given by name (`"label"`) or 0-based index (`0` or `"0"`).
fn name_or_index<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        Name(String),
        Index(u64),
    }
    V::deserialize(d)
        .map(|v| match v {
            V::Name(s) => s,
            V::Index(i) => i.to_string(),
        })
        .map_err(|_| {
            serde::de::Error::custom("expected a column name (string) or a 0-based index (integer)")
        })
}

/// A Slurm time limit (`MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM` or `D-HH:MM:SS`; not a bare
/// count of minutes, which reads too easily as hours) in seconds.
pub fn parse_slurm_time(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a time limit; write HH:MM:SS (e.g. 04:00:00) or D-HH:MM:SS");
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, s),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    // each part is a few digits: a year is the most any cluster grants
    if parts.iter().any(|p| p.len() > 6) || days > 3660 {
        return Err(bad());
    }
    let n: Vec<u64> = parts.iter().map(|p| p.parse().unwrap_or(0)).collect();
    let (h, m, sec) = match (s.contains('-'), n.as_slice()) {
        (false, [m, sec]) => (0, *m, *sec),
        (_, [h, m, sec]) => (*h, *m, *sec),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        _ => return Err(bad()),
    };
    if m >= 60 || sec >= 60 || (s.contains('-') && h >= 24) {
        return Err(bad());
    }
    let total = days * 86400 + h * 3600 + m * 60 + sec;
    if total > 3660 * 86400 {
        return Err(format!("`{s}` is longer than ten years"));
    }
    if total == 0 {
        return Err(format!("`{s}` is a time limit of zero"));
    }
    Ok(total)
}

/// Whether `v` is a Slurm partition or account name kiln passes on: letters, digits, `_`, `-`,
/// `.`, and `,` between partitions.
pub fn slurm_name_ok(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 200
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.,".contains(c))
        && !v.starts_with(['-', ','])
}

/// Whether `a` is one sbatch option kiln can write as an `#SBATCH` line: `--name[=value]` or
/// `-X[value]`, no whitespace, quotes or control characters.
pub fn sbatch_option_ok(a: &str) -> bool {
    a.len() >= 2
        && a.len() <= 500
        && a.starts_with('-')
        && a != "--"
        && !a
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "'\"\\`$".contains(c))
}

/// Whether a sweep metric is minimised or maximised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricMode {
    Min,
    Max,
}

/// A distribution of `[sweep.random] space`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Distribution {
    /// Log-uniform between two positive bounds.
    LogUniform([f64; 2]),
    /// Uniform between two bounds.
    Uniform([f64; 2]),
    /// One of the listed values.
    Choice(Vec<toml::Value>),
}

/// `[sweep] random`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomSearch {
    /// How many samples to draw.
    pub samples: usize,
    /// Seed of the draws. Default: `0`.
    #[serde(default)]
    pub seed: u64,
    /// Dotted key -> distribution.
    pub space: std::collections::BTreeMap<String, Distribution>,
}

/// `[sweep]`: only `kiln sweep` reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweepConfig {
    /// The sweep directory under `experiment.output_dir`. Default: `experiment.name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Dotted key -> values; the trials are the cartesian product. Default: empty.
    pub grid: std::collections::BTreeMap<String, Vec<toml::Value>>,
    /// Random samples (combined with every grid point when both are given). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random: Option<RandomSearch>,
    /// The summary field that ranks trials (e.g. eval_loss, eval_accuracy, final_loss).
    /// Default: `"eval_loss"`.
    pub metric: String,
    /// min or max. Default: `"min"`.
    pub mode: MetricMode,
    /// Trials run at once. Default: `1`.
    pub parallel: usize,
    /// How often a failed trial is tried again. Default: `0`.
    pub retries: usize,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            name: None,
            grid: Default::default(),
            random: None,
            metric: "eval_loss".into(),
            mode: MetricMode::Min,
            parallel: 1,
            retries: 0,
        }
    }
}

/// `[launch]`: several node processes (machines, or processes on one machine) in one job. Also set
/// by `--nnodes/--node-rank/--master-addr/--master-port`, torchrun's `WORLD_SIZE`, `RANK`,
/// `MASTER_ADDR`, `MASTER_PORT` and Slurm's variables (inside `srun`: one kiln node per task,
/// `SLURM_NTASKS` and `SLURM_PROCID`; outside: `SLURM_NNODES` and `SLURM_NODEID`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LaunchConfig {
    /// Node processes in the job. Default: `1`.
    pub nnodes: usize,
    /// This process's node, 0..nnodes. Node 0 serves the rendezvous store. Default: `0`.
    pub node_rank: usize,
    /// Address of node 0's rendezvous store (it binds only this address). Default: `"127.0.0.1"`.
    pub master_addr: String,
    /// Port of the rendezvous store. Default: `29500`. Under torchrun, `MASTER_PORT` + 1
    /// (torchrun's agent serves its own store on `MASTER_PORT`).
    pub master_port: u16,
    /// The GPU of a process that a launcher starts one per GPU (torchrun's `LOCAL_RANK`): the
    /// process is one node of one device, GPU `local_rank` (of those `CUDA_VISIBLE_DEVICES`
    /// shows). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<usize>,
    /// File holding the job token (else `KILN_JOB_TOKEN`; node 0 generates one when neither is
    /// set). Default: unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// Seconds the rendezvous waits for every node. Default: `300`.
    pub rendezvous_timeout_secs: u64,
    /// Restarts of the whole job (from the newest verified checkpoint) after a node's worker
    /// dies, like torchrun `--max-restarts`. Default: `0`.
    pub max_restarts: usize,
    /// A node silent for this many seconds stops the job; 0 turns heartbeats off. Default: `10`.
    pub heartbeat_secs: u64,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        LaunchConfig {
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            local_rank: None,
            token_file: None,
            rendezvous_timeout_secs: 300,
            max_restarts: 0,
            heartbeat_secs: 10,
        }
    }
}
