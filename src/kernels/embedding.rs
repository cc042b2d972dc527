//! An embedding lookup whose backward keeps only the ids (Burn's keeps the whole table for
//! the table's shape): the rows of `weight` picked by `ids`, and in the backward each output
//! row's gradient added into its id's row, in row order (the same bits whatever the threads).
//! Without the table in the graph, a resharded unit's embeddings are freed after the forward.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_flex::{Flex, FlexTensor};

use super::dense;
use super::route::{self, Routes};

fn forward(w: &FlexTensor, ids: &[usize], shape: [usize; 2]) -> FlexTensor {
    let w = dense::contiguous(w.clone());
    let (ws, d) = (dense::values(&w), dense::dims(&w)[1]);
    let mut y = dense::for_output(ids.len() * d);
    for (row, &id) in y.chunks_exact_mut(d.max(1)).zip(ids) {
        row.copy_from_slice(&ws[id * d..(id + 1) * d]);
    }
    dense::tensor(y, &[shape[0], shape[1], d])
}

/// What the backward keeps: the ids and the table's shape.
#[derive(Debug, Clone)]
struct Saved {
    ids: Arc<[usize]>,
    vocab: usize,
    d: usize,
}

#[derive(Debug)]
struct EmbeddingBackward;

impl Backward<Flex, 1> for EmbeddingBackward {
    type State = Saved;

    fn backward(self, ops: Ops<Saved, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dy = dense::contiguous(grads.consume::<Flex>(&ops.node));
        let Saved { ids, vocab, d } = ops.state;
        let [parent] = ops.parents;
        if let Some(p) = parent {
            let mut dw = dense::zeros(vocab * d);
            for (row, &id) in dense::values(&dy).chunks_exact(d.max(1)).zip(ids.iter()) {
                for (a, &g) in dw[id * d..(id + 1) * d].iter_mut().zip(row) {
                    *a += g;
                }
            }
            grads.register::<Flex>(p.id, dense::tensor(dw, &[vocab, d]));
        }
    }
}

/// The rows of `weight` `[vocab, d]` picked by `ids` `[n, t]`: `[n, t, d]` (Burn's
/// `embedding`), on flex in f32 with a backward that keeps only the ids; `None` elsewhere or
/// for an id outside the table (the caller runs Burn's op, which says so).
pub fn embedding<B: Backend>(weight: Tensor<B, 2>, ids: Tensor<B, 2, Int>) -> Option<Tensor<B, 3>> {
    let [vocab, d] = weight.dims();
    let shape = ids.dims();
    let ids: Vec<i64> = ids.into_data().convert::<i64>().into_vec::<i64>().ok()?;
    if ids.iter().any(|&i| i < 0 || i as usize >= vocab) {
        return None;
    }
    let ids: Arc<[usize]> = ids.into_iter().map(|i| i as usize).collect();
    match route::route1(weight).ok()? {
        Routes::Autodiff([w]) => {
            let y = forward(&w.primitive, &ids, shape);
            let y = match EmbeddingBackward
                .prepare::<NoCheckpointing>([w.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => prep.finish(Saved { ids, vocab, d }, y),
                OpsKind::UnTracked(prep) => prep.finish(y),
            };
            route::back::<B, _, 3>(y)
        }
        Routes::Plain([w]) => route::back::<B, _, 3>(forward(&w, &ids, shape)),
    }
}
