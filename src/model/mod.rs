//! Model families. Parameters live in one flat `f32` buffer described by a layout, so strategies
//! can all-reduce, shard and checkpoint them without knowing the model; each step the model is
//! assembled from that buffer as Burn tensors, run forward and backward, and its gradients are
//! flattened back in the same layout.

pub mod mlp;

pub use mlp::Mlp;

/// One parameter tensor inside the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}
