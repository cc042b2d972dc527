//! Layer: sweep (above `launch`; below `cli`).
//!
//! Sweeps: one experiment file plus `[sweep]` expands into trials (grid and random samples), each
//! checked before any runs; trials run as child `kiln` processes, up to `parallel` at once, each
//! with its share of the CPU; the ledger makes a re-run skip done trials, resume interrupted ones
//! from their checkpoints and retry failed ones; results are ranked by the chosen metric.

mod asha;
mod asha_slurm;
mod expand;
mod ledger;
mod results;
mod scheduler;
mod slurm;

pub use asha::{Asha, Progress};
pub use asha_slurm::{advance, check_segment, Segment};
pub use expand::{expand, ExpandError, Trial};
pub use ledger::{Ledger, Record, TrialState};
pub use results::{row, sort, to_csv, to_markdown, to_text, Row};
pub use scheduler::*;
pub use slurm::{refresh, submit};
