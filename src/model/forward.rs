//! What one forward draws from and sees besides its input: the dropout stream of a micro-step
//! (`StepKey`), and the forward's context (`Forward`: training or evaluation, the fused kernels,
//! the documents packed in each row and the padding after them).

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::kernels::Starts;
use crate::rng::Rng;

/// Which positions of rows of documents are padding (past the row's documents), `[n * t]` row
/// by row.
pub type Padding = std::sync::Arc<[bool]>;

/// Where the random draws of one micro-step come from (dropout masks): kiln's RNG keyed by the
/// seed, the optimizer step, each sample's index in the data and the dropout call, so that a
/// sample gets the same mask whichever rank and micro-step hold it: single, dp, ddp and fsdp
/// train to the same parameters with dropout too, at any world size and accumulation (issue
/// 58, defect 29: the masks were keyed by (step, micro-step, rank) and drawn in call order, so
/// ddp(2) and single differed by 1e-2 with dropout 0.1), and every resume reproduces them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepKey {
    pub seed: u64,
    /// (step, micro-step, rank): the step keys every mask; the other two only the masks of a
    /// micro-batch without `rows`.
    pub counters: [u64; 3],
    /// The data index of each sample of the micro-batch, in batch order (empty: the masks are
    /// drawn for the whole micro-batch from `counters`, as tests and benchmarks do).
    pub rows: std::sync::Arc<[u64]>,
}

impl StepKey {
    /// A key without sample indices (tests, benchmarks).
    pub fn new(seed: u64, counters: [u64; 3]) -> Self {
        StepKey {
            seed,
            counters,
            rows: std::sync::Arc::from(Vec::new()),
        }
    }
}

/// What a family's forward may ask for besides its inputs. Cloned at each stage's start, so a
/// recomputed stage (activation checkpointing) draws the same dropout masks again.
#[derive(Clone)]
pub struct Forward {
    /// A training forward's key (`None`: evaluation, no dropout).
    key: Option<StepKey>,
    /// Dropout calls so far: each call's masks are keyed by its number (a recomputed stage
    /// starts from the same count, so it draws the same masks).
    calls: u64,
    /// Whether the family calls kiln's fused kernels (`kiln::kernels`) where they apply
    /// (`backend.fused`).
    fused: bool,
    /// Packed rows: where each position's document starts in its row.
    segments: Option<Starts>,
    /// Rows of documents: which positions are padding (`None`: none is).
    padding: Option<Padding>,
}

impl Forward {
    /// A training forward: dropout draws from `key`'s stream.
    pub fn train(key: StepKey) -> Self {
        Forward {
            key: Some(key),
            calls: 0,
            fused: true,
            segments: None,
            padding: None,
        }
    }
    /// An evaluation forward: dropout is the identity.
    pub fn eval() -> Self {
        Forward {
            key: None,
            calls: 0,
            fused: true,
            segments: None,
            padding: None,
        }
    }
    /// This forward with the fused kernels on or off (`backend.fused`; on by default).
    pub fn with_fused(mut self, on: bool) -> Self {
        self.fused = on;
        self
    }
    /// This forward over rows packed with documents: `starts[b * t + i]` is where the
    /// document of row b's position i starts in the row (at most i; a larger value counts as
    /// i). A family keeps attention and
    /// positions inside each document (`segments`, `positions`, `document_mask`), so each
    /// document's logits are the ones it has alone. `None`: each row is one sequence.
    pub fn with_segments(mut self, starts: Option<Starts>) -> Self {
        self.segments = starts;
        self
    }
    /// The documents' starts of packed rows, if the rows are packed.
    pub fn segments(&self) -> Option<&Starts> {
        self.segments.as_ref()
    }
    /// This forward over rows whose `padding` positions are past their documents (`None`:
    /// no position is). Attention already keeps padding to itself (each padding position is
    /// a document of one token, without a target); a family that sums over a row's positions
    /// besides the loss leaves them out, as transformers' `attention_mask` does.
    pub fn with_padding(mut self, padding: Option<Padding>) -> Self {
        self.padding = padding;
        self
    }
    /// Which of `rows` positions are padding; `None` when none is (or the padding is of
    /// another shape).
    pub fn padding(&self, rows: usize) -> Option<&[bool]> {
        self.padding.as_deref().filter(|p| p.len() == rows)
    }
    /// Each position's place in its document, `[n * t]` row by row (packed rows of `n` x
    /// `t`); `None` when the rows are not packed (or the starts are of another shape).
    pub fn positions(&self, n: usize, t: usize) -> Option<Vec<i64>> {
        let s = self.segments.as_ref().filter(|s| s.len() == n * t)?;
        Some(
            s.iter()
                .enumerate()
                .map(|(j, &start)| (j % t - (start as usize).min(j % t)) as i64)
                .collect(),
        )
    }
    /// The additive mask of Burn's attention over packed rows, `[n, 1, t, t]`: 0 where a
    /// position may attend (its document, up to itself), -1e9 elsewhere (as the causal mask);
    /// `None` when the rows are not packed.
    pub fn document_mask<B: Backend>(
        &self,
        n: usize,
        t: usize,
        device: &B::Device,
    ) -> Option<Tensor<B, 4>> {
        let s = self.segments.as_ref().filter(|s| s.len() == n * t)?;
        Some(starts_mask(s, (n, t), device))
    }
    /// Whether the family should call kiln's fused kernels (`kiln::kernels`), which run on
    /// flex in f32 and fall back to Burn's ops elsewhere.
    pub fn fused(&self) -> bool {
        self.fused
    }
    /// Whether `dropout(x, rate)` would draw a mask (a training forward and `rate` > 0): a
    /// kernel that fuses past a dropout point must not run then.
    pub fn drops(&self, rate: f64) -> bool {
        self.key.is_some() && rate > 0.0
    }
    /// Inverted dropout with probability `rate`, its mask drawn from kiln's RNG (never Burn's
    /// process-wide one). `x` is sample-major (its leading dimension the micro-batch's samples,
    /// or samples x positions): each sample's part of the mask comes from a stream of its own,
    /// keyed by (step, the sample's data index, this call's number), element by element.
    pub fn dropout<B: Backend, const D: usize>(
        &mut self,
        x: Tensor<B, D>,
        rate: f64,
    ) -> Tensor<B, D> {
        let Some(key) = self.key.as_ref().filter(|_| rate > 0.0) else {
            return x;
        };
        let call = self.calls;
        self.calls += 1;
        let keep = 1.0 - rate;
        let scale = (1.0 / keep) as f32;
        let shape = x.shape();
        let n = shape.num_elements();
        let mut mask: Vec<f32> = Vec::with_capacity(n);
        let mut draw = |rng: &mut Rng, count: usize| {
            for _ in 0..count {
                mask.push(if rng.next_f64() < keep { scale } else { 0.0 });
            }
        };
        let rows = &key.rows;
        if !rows.is_empty() && n.is_multiple_of(rows.len()) {
            let per = n / rows.len();
            for &id in rows.iter() {
                let mut rng = Rng::stream(key.seed, "dropout", &[key.counters[0], id, call]);
                draw(&mut rng, per);
            }
        } else {
            let [step, micro, rank] = key.counters;
            let mut rng = Rng::stream(key.seed, "dropout-batch", &[step, micro, rank, call]);
            draw(&mut rng, n);
        }
        let mask = Tensor::<B, D>::from_data(TensorData::new(mask, shape), &x.device());
        x * mask
    }
}

/// The additive attention mask `[n, 1, t, t]` of rows whose position `b * t + i` attends from
/// `starts[b * t + i]` (at most i) up to itself: 0 there, -1e9 elsewhere (packed documents,
/// sliding windows).
pub(crate) fn starts_mask<B: Backend>(
    starts: &[u32],
    (n, t): (usize, usize),
    device: &B::Device,
) -> Tensor<B, 4> {
    let mut mask = vec![-1e9f32; n * t * t];
    for b in 0..n {
        for i in 0..t {
            let row = &mut mask[(b * t + i) * t..(b * t + i + 1) * t];
            let lo = (starts[b * t + i] as usize).min(i);
            row[lo..=i].fill(0.0);
        }
    }
    Tensor::from_data(TensorData::new(mask, [n, 1, t, t]), device)
}
