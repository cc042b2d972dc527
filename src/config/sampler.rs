//! `[sampler]`: the order of the samples (torch DistributedSampler semantics).

use serde::{Deserialize, Serialize};

#[allow(unused_imports)]
use super::*;

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
