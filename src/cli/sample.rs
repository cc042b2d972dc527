//! `kiln sample RUN_DIR --prompt "..."`: parses the arguments, runs `tools::sample`, streams
//! the generated text to stdout and says on stderr how many tokens it made how fast.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};
use crate::tools::{self, SampleOptions};

#[derive(Debug, Args)]
pub struct SampleArgs {
    /// The run directory of a language model run, e.g. a gpt's (it holds config.toml and checkpoints/).
    pub run_dir: PathBuf,
    /// Sample from this checkpoint (e.g. `step-00000600`, or `best`) instead of the newest
    /// verified one.
    #[arg(long, value_name = "step-N")]
    pub from: Option<String>,
    /// The text to continue.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 200)]
    pub tokens: usize,
    /// Softmax temperature: lower is more predictable, 0 always takes the most likely token.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Draw only from the k most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Draw only from the smallest set of most likely tokens whose probability reaches p.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Stop once the output ends with this text (repeatable).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Go on past the tokenizer's end-of-text token (GPT-2's `<|endoftext|>`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Run the whole context for every token instead of caching its keys and values.
    #[arg(long)]
    pub no_cache: bool,
    /// The same seed gives the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Continue these token ids (comma-separated, e.g. `1,2,3`) instead of `--prompt`'s text.
    #[arg(
        long,
        value_name = "IDS",
        value_delimiter = ',',
        conflicts_with = "prompt"
    )]
    pub prompt_ids: Option<Vec<u32>>,
    /// Print the generated ids as one JSON list on stdout instead of their text.
    #[arg(long)]
    pub ids: bool,
    /// Talk to a chat model: the message is rendered with the run's chat template and the
    /// generation prompt, the reply stops at the template's end of turn (or the EOS id), and
    /// only the reply is printed. `-` reads a turn per line of stdin, the conversation kept.
    #[arg(long, value_name = "MESSAGE", conflicts_with_all = ["prompt", "prompt_ids"])]
    pub chat: Option<String>,
    /// With --chat: the system message the conversation starts with.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
}

pub fn sample(a: &SampleArgs) -> Result<()> {
    let o = SampleOptions {
        from: a.from.clone(),
        prompt: a.prompt.clone(),
        tokens: a.tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        seed: a.seed,
        cache: !a.no_cache,
        prompt_ids: a.prompt_ids.clone(),
        ids: a.ids,
        chat: a.chat.as_ref().map(|m| tools::ChatOptions {
            message: m.clone(),
            system: a.system.clone(),
        }),
    };
    if a.ids && !a.stop.is_empty() {
        return Err(Error::Usage(
            "--stop matches text, but --ids prints no text: drop one of them".into(),
        ));
    }
    if a.prompt_ids.as_ref().is_some_and(|p| p.is_empty()) {
        return Err(Error::Usage("--prompt-ids: give at least one id".into()));
    }
    if a.chat.as_ref().is_some_and(|m| m.trim().is_empty()) {
        return Err(Error::Usage(
            "--chat: give a message (or `-` to read a turn per line of stdin)".into(),
        ));
    }
    // `--chat -` ends each reply with its own line
    let turns = a.chat.as_deref() == Some("-");
    let mut out = std::io::stdout().lock();
    let mut failed = None;
    // the first failed write stops the sampling (`| head` closed the pipe)
    let rep = tools::sample(&a.run_dir, &o, &mut |b| {
        if failed.is_none() {
            if let Err(e) = out.write_all(b).and_then(|_| out.flush()) {
                failed = Some(e);
            }
        }
        failed.is_none()
    })?;
    if turns {
    } else if a.ids {
        let list = serde_json::to_string(&rep.ids).unwrap_or_default();
        if let Err(e) = writeln!(out, "{list}") {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(Error::io("writing the ids to stdout", e));
            }
        }
    } else {
        let _ = out.write_all(b"\n");
    }
    match failed {
        // a closed pipe (`| head`) is the reader's choice, not a failure
        Some(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(Error::io("writing the sample to stdout", e))
        }
        _ => {}
    }
    crate::ui::note(&format!(
        "{} tokens in {:.2}s ({:.1} tokens/s, {}, {}){}",
        rep.tokens,
        rep.seconds,
        rep.tokens as f64 / rep.seconds.max(1e-9),
        rep.backend,
        if o.cache { "KV cache" } else { "no cache" },
        rep.stopped
            .map(|s| format!("; stopped at {s}"))
            .unwrap_or_default()
    ));
    Ok(())
}
