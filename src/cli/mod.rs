//! Layer: cli (the top; only `main` is above it).
//!
//! The command line: one file per command. `main` prints errors and maps them to exit codes.

mod args;
mod bench;
mod check;
mod ckpt;
mod data;
mod env;
mod eval;
mod export;
mod init;
mod main;
mod report;
mod resume;
mod run;
mod sample;
mod submit;
mod sweep;
mod tokenize;
mod track;

pub use args::*;
pub use main::{main_with, main_with_args};
