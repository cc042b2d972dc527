//! Initialisation from kiln's RNG: every value is a pure function of the experiment seed and a
//! stable key of its layer, so it never touches Burn's process-wide RNG and never depends on the
//! order in which Burn would initialise lazily.

use crate::rng::Rng;

/// The stream a layer draws its initial values from, keyed by `key` (e.g. the layer's index).
pub fn stream(seed: u64, key: &[u64]) -> Rng {
    Rng::stream(seed, "init", key)
}

/// Fills `out` with U(-bound, bound), in order (torch's default for Linear and Conv layers uses
/// bound = 1/sqrt(fan_in)).
pub fn uniform(rng: &mut Rng, out: &mut [f32], bound: f64) {
    for v in out {
        *v = rng.uniform(-bound, bound) as f32;
    }
}

/// The stream a layer draws from, keyed by its module path (e.g. `convs.0`): stable when other
/// layers are added or removed.
pub fn named_stream(seed: u64, path: &str) -> Rng {
    Rng::stream(seed, &format!("init/{path}"), &[])
}
