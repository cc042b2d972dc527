//! `kiln init`: writes a commented experiment file from a built-in template; never overwrites.

use std::path::PathBuf;

use clap::Args;

use crate::error::{Error, Result};

/// (name, description, text), embedded from `templates/`.
pub const TEMPLATES: &[(&str, &str, &str)] = &[
    (
        "mlp",
        "MLP classifier on a synthetic task, every key documented",
        include_str!("../../templates/mlp.toml"),
    ),
    (
        "csv",
        "MLP classifier on a local CSV file",
        include_str!("../../templates/csv.toml"),
    ),
];

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where to write the experiment file.
    #[arg(required_unless_present = "list")]
    pub path: Option<PathBuf>,
    /// Template to start from (see --list).
    #[arg(long, default_value = "mlp")]
    pub template: String,
    /// List the templates.
    #[arg(long)]
    pub list: bool,
}

pub fn init(a: &InitArgs) -> Result<()> {
    if a.list {
        for (name, about, _) in TEMPLATES {
            println!("{name:<8} {about}");
        }
        return Ok(());
    }
    let Some(path) = &a.path else {
        return Err(Error::Usage("kiln init needs a PATH (or --list)".into()));
    };
    let Some((_, _, text)) = TEMPLATES.iter().find(|(n, _, _)| *n == a.template) else {
        let names: Vec<&str> = TEMPLATES.iter().map(|t| t.0).collect();
        let hint = crate::config::closest(&a.template, &names)
            .map(|c| format!("did you mean `{c}`? "))
            .unwrap_or_default();
        return Err(Error::Usage(format!(
            "unknown template `{}`; {hint}available: {}",
            a.template,
            names.join(", ")
        )));
    };
    if path.exists() {
        return Err(Error::Usage(format!(
            "`{}` already exists; kiln init never overwrites a file: choose another path",
            path.display()
        )));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    // create_new: refuse to overwrite even if the file appeared meanwhile.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    println!(
        "wrote {} (template `{}`); check it with: kiln check {}",
        path.display(),
        a.template,
        path.display()
    );
    Ok(())
}
