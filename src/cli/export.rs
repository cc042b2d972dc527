//! `kiln export RUN_DIR -o model.safetensors [--from step-N] [--format pytorch|burn]
//! [--probe probe.safetensors]`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::tools::{self, ExportOptions};
use crate::ui;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The run directory (it holds config.toml and checkpoints/).
    pub run_dir: PathBuf,
    /// The safetensors file to write (replaced atomically if it exists); for `--format hf-gpt2`
    /// the directory to write (made if it does not exist).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: PathBuf,
    /// Export this checkpoint (e.g. `step-00000600`, or `best`) instead of the newest verified
    /// one.
    #[arg(long, value_name = "step-N")]
    pub from: Option<String>,
    /// Names and layouts of the tensors: `pytorch` (PyTorch's state_dict names and layouts,
    /// Linear weights [out, in]: `model.load_state_dict(safetensors.torch.load_file(path))`),
    /// `burn` (Burn's module paths, Linear weights [in, out], as Burn's `SafetensorsStore`
    /// writes them), or one of the model family's own: a gpt's `hf-gpt2` (Hugging Face's
    /// `GPT2LMHeadModel`: `-o` is a directory that gets model.safetensors and config.json, for
    /// `from_pretrained(DIR)`) and `nanogpt` (nanoGPT's `GPT` state dict).
    #[arg(long, value_name = "FORMAT", default_value = "pytorch")]
    pub format: String,
    /// Also write a fixed input and kiln's logits for it to this safetensors file (for
    /// `scripts/check-export.py`).
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
}

pub fn export(a: &ExportArgs) -> Result<()> {
    let o = ExportOptions {
        from: a.from.clone(),
        out: a.out.clone(),
        format: a.format.clone(),
        probe: a.probe.clone(),
    };
    let rep = tools::export(&a.run_dir, &o)?;
    ui::out(&format!(
        "wrote {} ({} tensors, {} bytes, {} names) from {} (step {})",
        a.out.display(),
        rep.tensors,
        rep.bytes,
        rep.format.name(),
        rep.checkpoint.display(),
        rep.step
    ));
    if let Some(p) = &a.probe {
        ui::out(&format!("wrote {} (input and logits)", p.display()));
    }
    Ok(())
}
