//! `kiln tokenize IN.txt -o train.bin [--tokenizer gpt2] [--eval-fraction 0.1] [--eval-out
//! val.bin]`: nanoGPT-format token files from a text file, and the settings that train on them.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::tools::{self, TokenizeOptions};
use crate::ui;

#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// The text file.
    pub input: PathBuf,
    /// The token file to write (flat little-endian u16 ids; u32 above 65,536 tokens).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    /// `bytes`, `gpt2` (GPT-2's BPE, offline) or the path of a Hugging Face tokenizer.json.
    #[arg(long, default_value = "gpt2")]
    pub tokenizer: String,
    /// Hold out this fraction at the end of the text for evaluation, in a second file.
    #[arg(long, value_name = "F")]
    pub eval_fraction: Option<f64>,
    /// Where the held-out ids go (default: val.bin beside a train.bin, else <stem>.val.<ext>).
    #[arg(long, value_name = "FILE")]
    pub eval_out: Option<PathBuf>,
}

pub fn tokenize(a: &TokenizeArgs) -> Result<()> {
    let rep = tools::tokenize(&TokenizeOptions {
        input: a.input.clone(),
        out: a.out.clone(),
        tokenizer: a.tokenizer.clone(),
        eval_fraction: a.eval_fraction,
        eval_out: a.eval_out.clone(),
    })?;
    ui::out(&format!(
        "wrote {} ({} tokens, {})",
        rep.train.0.display(),
        rep.train.1,
        rep.dtype
    ));
    if let Some((p, n)) = &rep.eval {
        ui::out(&format!(
            "wrote {} ({n} tokens, {})",
            p.display(),
            rep.dtype
        ));
    }
    if rep.replaced > 0 {
        ui::out(&format!(
            "note: {} runs of bytes that are not UTF-8 were replaced by U+FFFD (the tokenizer.json takes text)",
            rep.replaced
        ));
    }
    let padded = rep.vocab.div_ceil(64) * 64;
    ui::out(&format!(
        "the largest id is {}; train with:\n[model]\nvocab_size = {}    # the tokenizer's; {padded} pads it to a multiple of 64, as nanoGPT does\n[data]\nkind = \"tokens\"\npath = \"{}\"{}\ndtype = \"{}\"\ntokenizer = \"{}\"",
        rep.max_id,
        rep.vocab,
        rep.train.0.display(),
        rep.eval
            .as_ref()
            .map(|(p, _)| format!("\neval_path = \"{}\"", p.display()))
            .unwrap_or_default(),
        rep.dtype,
        a.tokenizer
    ));
    Ok(())
}
