//! The files of a checkpoint: safetensors files of the model and the optimizer state, then
//! `state.json` and `MANIFEST.json`.
//!
//! A whole model (`Layout::Full`, written by rank 0) is `model.safetensors`, one tensor per
//! parameter under its module path, and `optim.safetensors`, the optimizer's state under torch's
//! names: `exp_avg.<name>` and `exp_avg_sq.<name>` (Adam, AdamW), `momentum_buffer.<name>` (SGD
//! with momentum). An fsdp rank writes `model-rank-<r>.safetensors` and
//! `optim-rank-<r>.safetensors`: its part of unit i as a flat tensor `flat.<i>.<unit>` (and
//! `exp_avg.flat.<i>.<unit>`, ...); where each part lies is in `state.json` (`params.units`) and in
//! each file's metadata.

use std::collections::HashMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::tensors::{self, TensorFile};

/// The checkpoint format this kiln writes and reads (`state.json` `format`). Checkpoints without
/// it were written by kiln 0.1's own binary format (`KILNF32`).
pub const FORMAT: &str = "safetensors-1";

/// Optimizer state of a whole model or of one rank's shards.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OptState {
    pub steps: u64,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
}

impl OptState {
    /// Its buffers under torch's names: Adam's first and second moments, or SGD's momentum.
    fn named(&self) -> Vec<(&'static str, &[f32])> {
        if !self.v.is_empty() {
            vec![("exp_avg", &self.m), ("exp_avg_sq", &self.v)]
        } else if !self.m.is_empty() {
            vec![("momentum_buffer", &self.m)]
        } else {
            Vec::new()
        }
    }
}

/// The optimizer buffer a tensor-name prefix fills.
const OPT_PREFIXES: [(&str, bool); 3] = [
    ("exp_avg", false),
    ("exp_avg_sq", true),
    ("momentum_buffer", false),
];

/// One fsdp unit in the flat parameter buffer and how it is split over the ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardUnit {
    /// The unit's name (`layers.0`, `blocks.3`, or `model` for the whole model).
    pub name: String,
    pub start: usize,
    pub len: usize,
    /// Elements per rank (the last ranks may own fewer, or none).
    pub shard_len: usize,
}

impl ShardUnit {
    /// Unit `name` over `range` of the flat parameters, split evenly over `world` ranks (the
    /// last shard padded).
    pub fn new(name: &str, range: Range<usize>, world: usize) -> Self {
        ShardUnit {
            name: name.to_string(),
            start: range.start,
            len: range.len(),
            shard_len: range.len().div_ceil(world),
        }
    }

    /// Where the unit lives in the flat parameter buffer.
    pub fn range(&self) -> Range<usize> {
        self.start..self.start + self.len
    }

    /// The unit's length padded to a multiple of `world` (every rank's shard the same length).
    pub fn padded_len(&self, world: usize) -> usize {
        self.shard_len * world
    }

    /// The part of the unit (in unit coordinates) that rank `rank` owns.
    pub fn owned(&self, rank: usize) -> Range<usize> {
        let lo = (rank * self.shard_len).min(self.len);
        let hi = ((rank + 1) * self.shard_len).min(self.len);
        lo..hi
    }

    /// The name of the flat shard tensor of unit `index` (unit names may repeat in a model of
    /// the user's: `enc`, `enc.layers.0`, ..., `enc`).
    pub fn tensor(&self, index: usize) -> String {
        format!("flat.{index}.{}", self.name)
    }
}

/// How the parameters and optimizer state are laid out in the files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "layout", rename_all = "lowercase")]
pub enum Layout {
    /// `model.safetensors` and `optim.safetensors` hold the whole model (written by rank 0).
    Full,
    /// `model-rank-<r>.safetensors` and `optim-rank-<r>.safetensors` hold rank r's part of every
    /// unit.
    Sharded { world: usize, units: Vec<ShardUnit> },
}

impl Layout {
    pub fn model_file(&self, rank: usize) -> String {
        match self {
            Layout::Full => "model.safetensors".into(),
            Layout::Sharded { .. } => format!("model-rank-{rank}.safetensors"),
        }
    }
    pub fn optim_file(&self, rank: usize) -> String {
        match self {
            Layout::Full => "optim.safetensors".into(),
            Layout::Sharded { .. } => format!("optim-rank-{rank}.safetensors"),
        }
    }
}

fn metadata(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// One tensor of a checkpoint file: its name, its shape and its values.
type Piece<'a> = (String, Vec<usize>, &'a [f32]);

/// The (name, shape, values) tensors of `params` and `opt` for `layout` on `rank`: the whole
/// model's parameters by `specs` (name and shape of each, in flat order), or each unit's owned
/// part (`params` and the optimizer buffers then hold the rank's parts of the units, in order).
/// Only the tensors from flat element `from` on are there (the optimizer state of a model
/// whose first `from` parameters are frozen: a boundary between parameters and units).
fn pieces<'a>(
    layout: &Layout,
    rank: usize,
    specs: &'a [(String, Vec<usize>)],
    from: usize,
    buf: &'a [f32],
) -> Result<Vec<Piece<'a>>, String> {
    let mut out = Vec::new();
    let mut off = 0;
    let mut take = |len: usize| -> Result<&'a [f32], String> {
        let s = buf.get(off..off + len).ok_or_else(|| {
            format!(
                "{} values for the checkpoint, the layout needs more",
                buf.len()
            )
        })?;
        off += len;
        Ok(s)
    };
    match layout {
        Layout::Full => {
            let mut at = 0;
            for (name, shape) in specs {
                let n: usize = shape.iter().product();
                at += n;
                if at > from {
                    out.push((name.clone(), shape.clone(), take(n)?));
                }
            }
        }
        Layout::Sharded { units, .. } => {
            for (i, u) in units.iter().enumerate().filter(|(_, u)| u.start >= from) {
                let n = u.owned(rank).len();
                out.push((u.tensor(i), vec![n], take(n)?));
            }
        }
    }
    if off != buf.len() {
        return Err(format!(
            "{} values for the checkpoint, the layout holds {off}",
            buf.len()
        ));
    }
    Ok(out)
}

/// The files rank `rank` writes for a checkpoint in `layout`: `params` and `opt` are the whole
/// model's (rank 0 of `Full`) or the rank's parts of every unit (`Sharded`); `opt` covers the
/// parameters after the first `frozen`.
pub fn encode_files(
    layout: &Layout,
    rank: usize,
    specs: &[(String, Vec<usize>)],
    frozen: usize,
    params: &[f32],
    opt: &OptState,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut meta = vec![("kiln.format", FORMAT.to_string())];
    if let Layout::Sharded { world, units } = layout {
        meta.push(("kiln.rank", rank.to_string()));
        meta.push(("kiln.world", world.to_string()));
        meta.push((
            "kiln.units",
            serde_json::to_string(units).map_err(|e| e.to_string())?,
        ));
    }
    let model = pieces(layout, rank, specs, 0, params)?;
    let refs: Vec<(&str, &[usize], &[f32])> = model
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), *d))
        .collect();
    let model_bytes = tensors::encode(&refs, metadata(&meta))?;
    let mut named = Vec::new();
    for (prefix, buf) in opt.named() {
        for (n, s, d) in pieces(layout, rank, specs, frozen, buf)? {
            named.push((format!("{prefix}.{n}"), s, d));
        }
    }
    let refs: Vec<(&str, &[usize], &[f32])> = named
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), *d))
        .collect();
    meta.push(("steps", opt.steps.to_string()));
    let optim_bytes = tensors::encode(&refs, metadata(&meta))?;
    Ok(vec![
        (layout.model_file(rank), model_bytes),
        (layout.optim_file(rank), optim_bytes),
    ])
}

/// Fills `out[range]` of each piece from `file`'s tensor `prefix + name`, checking its length;
/// false when the file has none of them (an optimizer buffer that was not written).
fn fill(
    file: &TensorFile,
    prefix: &str,
    pieces: &[(String, Range<usize>, Vec<usize>)],
    out: &mut [f32],
) -> Result<bool, String> {
    let by = file.by_name();
    let mut found = 0;
    for (name, range, shape) in pieces {
        let full = format!("{prefix}{name}");
        let Some(t) = by.get(full.as_str()) else {
            continue;
        };
        if let Some(dtype) = &t.unsupported {
            return Err(format!(
                "tensor `{full}` has dtype {dtype}, not a float type"
            ));
        }
        if t.data.len() != range.len() || &t.shape != shape {
            return Err(format!(
                "tensor `{full}` has shape {:?}, expected {shape:?}",
                t.shape
            ));
        }
        out[range.clone()].copy_from_slice(&t.data);
        found += 1;
    }
    match found {
        0 => Ok(false),
        n if n == pieces.len() => Ok(true),
        _ => {
            let missing: Vec<String> = pieces
                .iter()
                .filter(|(name, _, _)| !by.contains_key(format!("{prefix}{name}").as_str()))
                .take(5)
                .map(|(name, _, _)| format!("`{prefix}{name}`"))
                .collect();
            Err(format!("missing tensors {}", missing.join(", ")))
        }
    }
}

/// Where each tensor of rank `rank`'s files goes in the whole flat buffer: (name, range, shape);
/// with `from` > 0, only those from flat element `from` on, in a buffer that starts there (the
/// optimizer state of a model with frozen parameters).
pub(super) fn placements(
    layout: &Layout,
    rank: usize,
    specs: &[(String, Vec<usize>)],
    from: usize,
) -> Vec<(String, Range<usize>, Vec<usize>)> {
    let all = match layout {
        Layout::Full => {
            let mut off = 0;
            specs
                .iter()
                .map(|(name, shape)| {
                    let n: usize = shape.iter().product();
                    off += n;
                    (name.clone(), off - n..off, shape.clone())
                })
                .collect()
        }
        Layout::Sharded { units, .. } => units
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let own = u.owned(rank);
                (
                    u.tensor(i),
                    u.start + own.start..u.start + own.end,
                    vec![own.len()],
                )
            })
            .collect::<Vec<_>>(),
    };
    if from == 0 {
        return all;
    }
    // (a unit's owned part may be empty: it is there when its unit starts at or after `from`)
    let starts: Vec<usize> = match layout {
        Layout::Full => all.iter().map(|(_, r, _)| r.start).collect(),
        Layout::Sharded { units, .. } => units.iter().map(|u| u.start).collect(),
    };
    all.into_iter()
        .zip(starts)
        .filter(|(_, start)| *start >= from)
        .map(|((name, r, shape), _)| (name, r.start - from..r.end - from, shape))
        .collect()
}

/// A checkpoint's tensors made whole while its ranks' files are read.
pub(super) struct Whole {
    pub params: Vec<f32>,
    /// Elements of the optimizer state (the parameters that train).
    trained: usize,
    pub m: Option<Vec<f32>>,
    pub v: Option<Vec<f32>>,
    pub steps: u64,
    /// Ranks read, and in how many of them each kind of optimizer state was found.
    ranks: usize,
    seen: [usize; 3],
}

impl Whole {
    pub fn new(n: usize, trained: usize) -> Self {
        Whole {
            params: vec![0f32; n],
            trained,
            m: None,
            v: None,
            steps: 0,
            ranks: 0,
            seen: [0; 3],
        }
    }

    /// The whole parameters and optimizer state, once every rank was read: each kind of
    /// optimizer state must come from every rank (or none).
    pub fn finish(self) -> Result<(Vec<f32>, OptState), String> {
        for ((prefix, _), seen) in OPT_PREFIXES.iter().zip(self.seen) {
            if seen != 0 && seen != self.ranks {
                return Err(format!(
                    "`{prefix}.*` optimizer state is in {seen} of the {} ranks' files",
                    self.ranks
                ));
            }
        }
        let opt = OptState {
            steps: self.steps,
            m: self.m.unwrap_or_default(),
            v: self.v.unwrap_or_default(),
        };
        Ok((self.params, opt))
    }

    /// Reads one rank's model and optimizer files into place.
    /// `pieces` place the model's tensors, `opt_pieces` the optimizer state's.
    pub fn read(
        &mut self,
        model: &TensorFile,
        optim: &TensorFile,
        pieces: &[(String, Range<usize>, Vec<usize>)],
        opt_pieces: &[(String, Range<usize>, Vec<usize>)],
    ) -> Result<(), String> {
        if !fill(model, "", pieces, &mut self.params)? && pieces.iter().any(|p| !p.1.is_empty()) {
            let want: Vec<&str> = pieces.iter().take(3).map(|p| p.0.as_str()).collect();
            let have: Vec<&str> = model
                .tensors
                .iter()
                .take(3)
                .map(|t| t.name.as_str())
                .collect();
            return Err(format!(
                "the model file holds none of the model's tensors (wants {} ...; has {} ...)",
                want.join(", "),
                have.join(", ")
            ));
        }
        self.steps = optim
            .metadata
            .get("steps")
            .and_then(|s| s.parse().ok())
            .ok_or("the optimizer file's metadata has no `steps`")?;
        let n = self.trained;
        let pieces = opt_pieces;
        let owns = pieces.iter().any(|p| !p.1.is_empty());
        for (k, (prefix, second)) in OPT_PREFIXES.into_iter().enumerate() {
            let dotted = format!("{prefix}.");
            if !optim.tensors.iter().any(|t| t.name.starts_with(&dotted)) {
                continue;
            }
            let buf = if second { &mut self.v } else { &mut self.m };
            if !fill(
                optim,
                &dotted,
                pieces,
                buf.get_or_insert_with(|| vec![0f32; n]),
            )? && owns
            {
                return Err(format!(
                    "the optimizer file's `{dotted}*` tensors are not the model's (wants `{dotted}{}` ...)",
                    pieces.first().map(|p| p.0.as_str()).unwrap_or("")
                ));
            }
            self.seen[k] += 1;
        }
        self.ranks += 1;
        Ok(())
    }
}

/// Where the data stream stands, by a global cursor that any world size can continue from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub epoch: u64,
    /// Samples of the epoch's order consumed, over all ranks.
    pub cursor: usize,
    /// Where the current pass over the epoch started (non-zero after resuming mid-epoch).
    pub segment_start: usize,
    /// Micro-batches taken since `segment_start` (per rank).
    pub segment_micro: usize,
}

/// Where a stream of documents stands (`data.kind = "jsonl"` or `"parquet"`, or a `data.mix`
/// of text or token files, whose windows are its documents): each source's
/// next document, the documents drawn, and the rows packed from earlier documents that no step
/// has taken yet (their tokens: a checkpoint never needs the files read again to go on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct DocumentsPosition {
    /// The stream's passes ended (with `data.mix_stop = "first_exhausted"` or one source).
    pub pass: u64,
    /// Documents drawn from the sources so far (the mixture's draws are keyed by it).
    pub drawn: u64,
    /// Each source's place (`data.path`, or each of `data.mix`).
    pub sources: Vec<SourcePosition>,
    /// Rows handed out so far, over all passes: the global row the next step starts at.
    pub rows: u64,
    /// Rows packed and closed but not handed out, in order, then the rows still open (at most
    /// the packing window): each row its pieces, each its source's index and tokens.
    pub ready: Vec<Vec<(u32, Vec<u32>)>>,
    pub open: Vec<Vec<(u32, Vec<u32>)>>,
    /// Each source's shards when the checkpoint was taken, their file names and sizes: a
    /// resume over other files (a shard added to a directory, one rewritten) would read
    /// other documents at the same place, and is refused.
    #[serde(default)]
    pub files: Vec<Vec<(String, u64)>>,
}

/// Where one source of documents stands: its pass, the shard being read (by its place in the
/// pass's order of shards) and how many of its documents (in their shuffled order) were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SourcePosition {
    pub epoch: u64,
    pub shard: usize,
    pub doc: usize,
}

/// `state.json`: everything besides tensors that resume needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// The checkpoint format (`FORMAT`).
    pub format: String,
    pub step: usize,
    pub position: DataPosition,
    /// Micro-steps into the current accumulation (checkpoints are taken at step boundaries).
    pub accum_position: usize,
    /// Every draw is derived from these seeds and the counters above (see `rng.rs`), so they are
    /// the whole RNG state: init (experiment.seed), dropout (experiment.seed, step, micro-step,
    /// rank), shuffling (sampler.seed + epoch), synthetic data (data.seed).
    pub rng: RngState,
    pub world_size: usize,
    pub strategy: String,
    pub micro_batch: usize,
    pub grad_accum_steps: usize,
    pub num_params: usize,
    /// Leading flat parameters that do not train (`model.freeze`, LoRA's base): the optimizer
    /// state covers the parameters after them, and its files hold their tensors only.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen_params: usize,
    /// The shape of one input sample, to build the model again without its data (`kiln
    /// export`).
    pub input_shape: Vec<usize>,
    pub params: Layout,
    pub optimizer: OptimizerInfo,
    pub scheduler: SchedulerInfo,
    pub last_loss: f64,
    pub config_hash: String,
    pub kiln_version: String,
    /// Where `train.early_stopping` stands at this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<WatchState>,
    /// The best checkpoint so far (`checkpoint.keep_best`): retention keeps it, `--from best`
    /// names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best: Option<WatchState>,
    /// f16's dynamic loss scale at this step (`backend.precision = "f16"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScaleState>,
    /// Where a stream of documents (or a mixture's windows) stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<DocumentsPosition>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where f16's dynamic loss scaling stands (torch `GradScaler`'s `scale` and `_growth_tracker`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossScaleState {
    /// The scale the next step runs with.
    pub scale: f64,
    /// Steps in a row without an overflow since the scale last changed.
    pub growth_tracker: u64,
    /// Steps skipped so far because their gradient overflowed.
    pub skipped_steps: u64,
}

/// A watched evaluation metric: its best value, where it was reached, and the evaluations
/// since then that did not improve on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchState {
    pub metric: String,
    /// "min" or "max".
    pub mode: String,
    pub best: f64,
    pub best_step: usize,
    #[serde(default)]
    pub bad_evals: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RngState {
    pub init_seed: u64,
    pub dropout_seed: u64,
    pub sampler_seed: u64,
    pub data_seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimizerInfo {
    pub kind: String,
    pub steps: u64,
}

/// The LR schedule is a pure function of the step; this records where it stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulerInfo {
    pub kind: String,
    pub last_step: usize,
    pub last_lr: f64,
}

/// `MANIFEST.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub files: Vec<ManifestEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub name: String,
    pub size: u64,
    pub sha256: String,
}
