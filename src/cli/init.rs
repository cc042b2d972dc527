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
    (
        "gpt-text",
        "a small GPT trained from scratch on a text file, byte-level",
        include_str!("../../templates/gpt-text.toml"),
    ),
    (
        "llama-finetune",
        "fine-tune a Hugging Face Llama directory (model.init_from) on a text file",
        include_str!("../../templates/llama-finetune.toml"),
    ),
    (
        "hsdp",
        "hybrid sharded data parallel: 4 ranks in 2 fsdp groups of 2",
        include_str!("../../templates/hsdp.toml"),
    ),
];

/// The text the text templates train on: the Rust book's prose (MIT OR Apache-2.0;
/// experiments/data/README.md).
const SAMPLE_TEXT: &str = include_str!("../../experiments/data/text/rust-book.txt");

/// The data file a template reads, written beside it: (file name, bytes, what it is).
fn companion(
    template: &str,
) -> Option<(&'static str, std::borrow::Cow<'static, [u8]>, &'static str)> {
    match template {
        "csv" => Some((
            "train.csv",
            sample_csv().into_bytes().into(),
            "150 rows: 4 features, 3 classes",
        )),
        "gpt-text" | "llama-finetune" => Some((
            "train.txt",
            SAMPLE_TEXT.as_bytes().into(),
            "350 KB of English prose: the Rust book's",
        )),
        _ => None,
    }
}

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
            crate::outln!("{name:<16} {about}");
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
    // a dangling symbolic link exists too (`exists` follows it and says no)
    if std::fs::symlink_metadata(path).is_ok() {
        let what = if path.exists() {
            "already exists"
        } else {
            "is a symbolic link to nothing"
        };
        return Err(Error::Usage(format!(
            "`{}` {what}; kiln init never overwrites a file: choose another path",
            path.display()
        )));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    }
    // the experiment is named after the file (`kiln init my-exp.toml` -> `my-exp`)
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let named = !stem.is_empty()
        && stem.len() <= 200
        && stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !stem.starts_with('.');
    let text = if named {
        name_experiment(text, &stem)
    } else {
        text.to_string()
    };
    // a template that reads a data file gets one beside it (never replacing a file)
    let data_note = match companion(&a.template) {
        Some((name, bytes, what)) => {
            let dir = path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(std::path::Path::new("."));
            let file = dir.join(name);
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&file)
            {
                Ok(mut f) => {
                    use std::io::Write as _;
                    f.write_all(&bytes)
                        .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
                    format!("\nwrote {} ({what}) for it to train on", file.display())
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => format!(
                    "\n{} exists and is left as it is: the experiment reads it",
                    file.display()
                ),
                Err(e) => return Err(Error::io(format!("creating {}", file.display()), e)),
            }
        }
        None => String::new(),
    };
    // create_new: refuse to overwrite even if the file appeared meanwhile.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::Usage(format!(
                "`{}` already exists; kiln init never overwrites a file: choose another path",
                path.display()
            )),
            _ => Error::io(format!("creating {}", path.display()), e),
        })?;
    f.write_all(text.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    crate::outln!(
        "wrote {} (template `{}`){data_note}\ncheck it with: kiln check {}\nrun it with:   kiln run {}",
        path.display(),
        a.template,
        path.display(),
        path.display()
    );
    Ok(())
}

/// The template with `[experiment] name` set to `name`.
fn name_experiment(text: &str, name: &str) -> String {
    let mut in_experiment = false;
    let mut done = false;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[') {
            in_experiment = t.starts_with("[experiment]");
        }
        if in_experiment && !done && t.starts_with("name") && t.contains('=') {
            // keep the comment after the value
            let comment = line.find('#').map(|i| &line[i..]).unwrap_or("\n");
            let value = format!("name = \"{name}\"");
            let pad = 24usize.saturating_sub(value.len()).max(1);
            out.push_str(&value);
            if comment.starts_with('#') {
                out.push_str(&" ".repeat(pad));
            }
            out.push_str(comment);
            if !comment.ends_with('\n') {
                out.push('\n');
            }
            done = true;
            continue;
        }
        out.push_str(line);
    }
    out
}

/// 150 rows of three well-separated classes in 4 features (seeded: always the same file).
fn sample_csv() -> String {
    let mut rng = crate::rng::Rng::new(2024);
    let centers = [
        [5.0, 3.4, 1.5, 0.2],
        [5.9, 2.8, 4.3, 1.3],
        [6.6, 3.0, 5.6, 2.0],
    ];
    let mut out = String::from("f0,f1,f2,f3,label\n");
    for i in 0..150 {
        let label = i % 3;
        let row: Vec<String> = centers[label]
            .iter()
            .map(|c| format!("{:.2}", c + 0.3 * rng.normal()))
            .collect();
        out.push_str(&format!("{},{label}\n", row.join(",")));
    }
    out
}
