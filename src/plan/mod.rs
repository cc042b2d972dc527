//! Layer: plan (above `config` and `data`).
//!
//! Config -> plan: the batch and step arithmetic, checked up front. Pure: touches no device and
//! no file, so every number a run will use can be unit-tested and printed by `kiln check`.

mod arithmetic;

pub use arithmetic::*;
