//! `kiln data preview FILE [--rows N] [--eval] [--json]` and `kiln data stats FILE [--eval]`:
//! what a run of an experiment trains on, before it runs.

use std::io::IsTerminal;

use clap::{Args, Subcommand};

use super::ConfigArgs;
use crate::error::Result;
use crate::tools::data as tool;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// The rows a run trains on, in its order: each document on a line, its first token (which
    /// no token before predicts) marked, padding counted; `--json` gives transformers'
    /// `input_ids`, `labels` (-100: no loss), `position_ids` and each token's `source`.
    Preview(PreviewArgs),
    /// Count a run's documents and tokens: a length histogram, each source's share, the rows
    /// packing makes and their padding (tokenizes every document once).
    Stats(StatsArgs),
}

#[derive(Debug, Args)]
pub struct PreviewArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// How many rows.
    #[arg(long, default_value_t = 4)]
    pub rows: usize,
    /// The evaluation rows instead of the training rows.
    #[arg(long)]
    pub eval: bool,
    /// One JSON object per row.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The evaluation documents instead of the training documents.
    #[arg(long)]
    pub eval: bool,
}

pub fn data(cmd: &DataCommand) -> Result<()> {
    match cmd {
        DataCommand::Preview(a) => {
            let r = a.config.resolve()?;
            let (rows, tokenizer) = tool::preview_rows(&r, a.rows, a.eval)?;
            let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            let mixed = r.config.data.mix.len() > 1;
            for (i, row) in rows.iter().enumerate() {
                if a.json {
                    crate::ui::out(&tool::row_json(i, row).to_string());
                } else {
                    // (the text is escaped; the only escape sequences are the dim marks)
                    crate::ui::out_raw(&tool::row_text(i, row, &tokenizer, colour, mixed));
                }
            }
            Ok(())
        }
        DataCommand::Stats(a) => {
            let r = a.config.resolve()?;
            let st = tool::stats(&r, a.eval)?;
            let names: Vec<String> = if r.config.data.mix.is_empty() {
                vec!["data.path".into()]
            } else {
                (0..r.config.data.mix.len())
                    .map(|i| format!("data.mix[{i}]"))
                    .collect()
            };
            let width = r.config.model.block_size.unwrap_or(128) + 1;
            for line in tool::stats_text(&st, &names, width) {
                crate::ui::out(&line);
            }
            Ok(())
        }
    }
}
