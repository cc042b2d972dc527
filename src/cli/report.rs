//! `kiln report RUN_DIR... | SWEEP_DIR [-o report.html]`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::{report, rundir, ui};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run directories (their curves are overlaid), or one sweep directory.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The HTML file to write (default: `report.html` in the one run or sweep directory given,
    /// else in the current directory).
    #[arg(short = 'o', long = "out", value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn report(a: &ReportArgs) -> Result<()> {
    let input = report::load(&a.dirs)?;
    let html = report::render(&input)?;
    let default = report::default_output(&a.dirs);
    let out = a.out.clone().unwrap_or_else(|| default.clone());
    rundir::refuse_inside_run(&out, "-o", Some(&default))?;
    rundir::write_atomic(&out, html.as_bytes())?;
    ui::out(&format!("wrote {} ({} bytes)", out.display(), html.len()));
    Ok(())
}
