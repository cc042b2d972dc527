//! Initialisation from kiln's RNG: every value is a pure function of the experiment seed and a
//! stable key of its layer, so it never touches Burn's process-wide RNG and never depends on the
//! order in which Burn would initialise lazily.

use crate::params::ParamLayout;
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

/// PyTorch's default for layers of Linear and Conv layers: every parameter of a unit (its weight
/// and bias) U(-b, b) with b = 1/sqrt(fan_in), from the unit's own stream (`named_stream`).
/// fan_in comes from the unit's first parameter, its weight: `in * k * k` for a Conv2d weight
/// `[out, in, k, k]`, `in` for a Burn Linear weight `[in, out]`.
pub fn pytorch_default(layout: &ParamLayout, seed: u64) -> Vec<f32> {
    let mut flat = vec![0f32; layout.num_params()];
    for unit in &layout.units {
        let shape = &layout.params[unit.params.start].shape;
        let fan_in: usize = match shape.as_slice() {
            [d_in, _] => *d_in,
            [_, rest @ ..] => rest.iter().product(),
            [] => 1,
        };
        let mut rng = named_stream(seed, &unit.name);
        uniform(
            &mut rng,
            &mut flat[unit.range.clone()],
            1.0 / (fan_in.max(1) as f64).sqrt(),
        );
    }
    flat
}
