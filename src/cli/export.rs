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
    /// The safetensors file to write (replaced atomically if it exists); for a directory format
    /// (`hf-gpt2`, `hf-llama`) the directory to write (a new one appears whole).
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
    /// `from_pretrained(DIR)`) and `nanogpt` (nanoGPT's `GPT` state dict), a llama's `hf-llama`
    /// (Hugging Face's `LlamaForCausalLM` directory, `Qwen2ForCausalLM` with `attn_bias`).
    /// A run with `[model.lora]` also has `peft` (`-o` is a directory that gets PEFT's
    /// adapter_config.json and adapter_model.safetensors, for `PeftModel.from_pretrained(base,
    /// DIR)`); its `hf-llama` / `hf-gpt2` export holds the adapters merged into the weights.
    #[arg(long, value_name = "FORMAT", default_value = "pytorch")]
    pub format: String,
    /// Also write a fixed input and kiln's logits for it to this safetensors file (for
    /// `scripts/check-export.py`).
    #[arg(long, value_name = "FILE")]
    pub probe: Option<PathBuf>,
    /// For a directory format (`hf-llama`, `hf-gpt2`): split the weights into shards of at most
    /// this size (`500MB`, `5GB`, `100KB` or bytes), listed in model.safetensors.index.json as
    /// transformers writes them. Default: 5GB.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// The dtype of the exported weights: f32, bf16 or f16 (rounded to nearest even, as
    /// PyTorch's `.to()`). Default: the dtype of the `model.init_from` weights the run started
    /// from (a bf16 model exports as bf16), else f32.
    #[arg(long, value_enum)]
    pub dtype: Option<crate::checkpoint::tensors::FloatDtype>,
}

/// `5GB`, `500MB`, `100KB` (powers of 1000, as transformers' `max_shard_size`), `2GiB`,
/// `64MiB`, `8KiB` (powers of 1024), or a number of bytes; at least 1.
fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => {
            return Err(format!(
                "`{s}` is not a size: give bytes, or a number with KB, MB, GB, KiB, MiB or GiB"
            ))
        }
    };
    if digits.is_empty() {
        return Err(format!("`{s}` is not a size: e.g. 5GB or 500MB"));
    }
    // (issue 58, defect 15: a size too large to count said "not a size of at least 1 byte")
    let too_large = || {
        format!("`{s}` is larger than any file system holds: give a size up to 16 EiB, e.g. 5GB (transformers' default)")
    };
    let n = digits.parse::<u64>().map_err(|_| too_large())?;
    match n.checked_mul(scale) {
        None => Err(too_large()),
        Some(0) => Err(format!(
            "`{s}` is not a size of at least 1 byte: e.g. 5GB or 500MB"
        )),
        Some(n) => Ok(n),
    }
}

pub fn export(a: &ExportArgs) -> Result<()> {
    let o = ExportOptions {
        from: a.from.clone(),
        out: a.out.clone(),
        format: a.format.clone(),
        probe: a.probe.clone(),
        max_shard_size: a.max_shard_size,
        dtype: a.dtype,
    };
    let rep = tools::export(&a.run_dir, &o)?;
    ui::out(&format!(
        "wrote {} ({} tensors, {} bytes of {}, {} names) from {} (step {})",
        a.out.display(),
        rep.tensors,
        rep.bytes,
        rep.dtype.name(),
        rep.format.name(),
        rep.checkpoint.display(),
        rep.step
    ));
    if let Some(p) = &a.probe {
        ui::out(&format!("wrote {} (input and logits)", p.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_too_large_zero_or_unitless_say_which() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert!(parse_size("99999999999999999999GB")
            .unwrap_err()
            .contains("larger than any file system holds"));
        assert!(parse_size("20000000000GB")
            .unwrap_err()
            .contains("larger than any file system holds"));
        assert!(parse_size("0MB").unwrap_err().contains("at least 1 byte"));
        assert!(parse_size("GB").unwrap_err().contains("is not a size"));
    }
}
