//! Layer: sweep (above `launch`; below `cli`).
//!
//! Sweeps: one experiment file plus `[sweep]` expands into trials (grid and random samples), each
//! checked before any runs; trials run as child `kiln` processes, up to `parallel` at once, each
//! with its share of the CPU; the ledger makes a re-run skip done trials, resume interrupted ones
//! from their checkpoints and retry failed ones; results are ranked by the chosen metric.
//!
//! Its files, one thing each: `spec.rs` (what `kiln sweep` was given, `sweep.json`), `plan.rs`
//! (the trials resolved and checked, their ids), `dir.rs` (the sweep directory and its lock),
//! `expand.rs` (grid and random samples), `ledger.rs` (what happened to each trial),
//! `results.rs` (the ranked table, `kiln sweep status`), `local.rs` (trials as child processes
//! here: the grid and random loop), `asha.rs` (ASHA's rungs and promotions, and its local
//! loop), `slurm.rs` (a job array on Slurm), `asha_slurm.rs` (ASHA on Slurm: a job per
//! segment, `kiln sweep advance`). The local loop still exists twice (`local.rs`, `asha.rs`)
//! and the two Slurm submits are near-copies: one executor trait (local, Slurm) and one policy
//! trait (grid/random, ASHA) are the next step.

mod asha;
mod asha_slurm;
mod dir;
mod expand;
mod ledger;
mod local;
mod plan;
mod results;
mod slurm;
mod spec;

pub use asha::{Asha, Progress};
pub use asha_slurm::{advance, check_segment, Segment};
pub use dir::*;
pub use expand::{expand, ExpandError, Trial};
pub use ledger::{Ledger, Record, TrialState};
pub use local::*;
pub use plan::*;
pub use results::{results, row, sort, status, to_csv, to_markdown, to_text, Row};
use results::{rows, write_results};
pub use slurm::{refresh, submit};
pub use spec::*;
