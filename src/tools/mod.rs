//! Layer: tools (above launch; below sweep and cli).
//!
//! The commands around runs that are not a training session: `kiln bench` (throughput per CPU
//! backend, through a real training session), `kiln eval` (a checkpoint on held-out data),
//! `kiln sample` (text from a language model's checkpoint), `kiln tokenize` (text to a token file) and
//! `kiln export` (a checkpoint's weights for PyTorch, Burn, nanoGPT or Hugging Face).

mod bench;
pub mod data;
mod eval;
mod export;
mod sample;
mod tokenize;

pub use bench::{bench, BenchEvent};
pub use eval::{eval, EvalOptions, EvalReport};
pub use export::{export, ExportOptions, ExportReport};
pub use sample::{sample, ChatOptions, SampleOptions};
pub use tokenize::{tokenize, TokenizeOptions, TokenizeReport};
