//! kiln's integration tests: one binary, one module per area.

mod cli;
mod common;
mod config;
mod experiments;
mod run;
