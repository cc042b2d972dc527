//! Terminal output: the only module that imports indicatif. Rank 0 shows a progress bar
//! (step/total, loss, samples/s, ETA) when stderr is a terminal and `--quiet` is not given.

mod progress;

pub use progress::*;
