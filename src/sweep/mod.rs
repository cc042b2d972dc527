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
//! `results.rs` (the ranked table, `kiln sweep status`), `policy.rs` (what runs next: the
//! `Policy` trait, `Grid` and `AshaPolicy`; what runs it: the `Executor` trait; `fill`, where
//! they meet), `asha.rs` (ASHA's rungs and promotions), `local.rs` (the local executor: child
//! processes and the loop that waits for them), `slurm.rs` (the Slurm executor: a job array, or
//! a job per asha segment), `asha_slurm.rs` (an asha segment's job going on with the sweep,
//! `kiln sweep advance`). A spec goes down once: `run_trials` (`local.rs`) or `submit`
//! (`slurm.rs`) plans it, picks the policy and fills the executor.

mod asha;
mod asha_slurm;
mod dir;
mod expand;
mod ledger;
mod local;
mod plan;
mod policy;
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
