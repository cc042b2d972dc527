//! Layer: strategy (above `collective`, `params`, `config` and `checkpoint`; never `train`).
//!
//! Parallel strategies: where parameters, gradients and optimizer state live, and when ranks
//! synchronise. The step (`train::step`) asks a strategy for each unit's parameters just before a
//! stage computes and hands it each unit's gradient as soon as the unit's backward is done; what
//! the strategy does there (copy, gather, all-reduce, reduce-scatter) is its own.
//!
//! A new strategy is more than its file here. It takes:
//! - `config/strategy.rs`: a `StrategyKind` variant (with `StrategyConfig::kind`'s doc and the
//!   module header, which list the kinds) and, where its keys differ, `StrategyConfig::check`
//!   and `left_out` (the keys of a run's `config.toml` that a resume under it drops).
//! - here: its file with a `Strategy` impl (the trait is in `base.rs`), its `mod` and `pub use`
//!   below; in `base.rs` its arm of `build`, of `estimate` (its bytes by formula; the `_` arm
//!   counts a whole replica), and where it applies of `step_bytes`; if it shards (in groups),
//!   `config::Mesh::over` in `config/strategy.rs`, which says which strategies shard (`build`,
//!   `estimate` and `hybrid.rs` ask it).
//! - `plan/arithmetic.rs`: its `DataSplit` in `Plan::new` (how a step's samples are divided).
//! - checkpoints: its `snapshot` gives `Layout::Full` (`full_snapshot`) or `Layout::Sharded`;
//!   its name goes in `STRATEGIES` of `check_state` (`checkpoint/dir.rs`), with its rules on
//!   `world_size` and sharded layouts there, or resume, eval and export refuse its
//!   checkpoints. A new `Layout` would change `checkpoint/format.rs`, `ranks_of`
//!   (`checkpoint/dir.rs`) and `Background::start` (`train/save.rs`) too.
//! - the checks that name kinds: `nodes` and `shard_size` (`config/cross.rs`),
//!   `Resolved::notes` (`config/validate.rs`, fsdp's keys), `job_shape_ok` (`slurm/mod.rs`) and
//!   `job_configs` (`sweep/slurm.rs`), which refuse single across nodes, `fit_advice`
//!   (`launch/check.rs`), and `check` (`cli/check.rs`, fsdp's note).
//! - docs: `strategy.kind`'s doc comment (the configuration reference is generated from it),
//!   the book's strategies chapter (docs/src/strategies.md), the layer tables of
//!   `src/lib.rs` and `docs/src/architecture.md`.
//!
//! Only `build`, `Plan::new` and the tests in `base.rs` match every kind, so only they fail to
//! compile without the new one; the rest compare with `==` or fall to `_`, silently.

mod base;
mod ddp;
mod dp;
mod estimate;
mod fsdp;
mod hybrid;
mod single;

pub use base::*;
pub use ddp::Ddp;
pub use dp::Dp;
pub use estimate::{estimate, step_bytes};
pub use fsdp::Fsdp;
pub use hybrid::{hybrid_groups, Hybrid};
pub use single::Single;
