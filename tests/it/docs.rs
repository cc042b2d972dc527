//! The book (`docs/`, an mdBook: `mdbook build docs`) and README.md: every chapter SUMMARY.md
//! lists exists, every chapter is listed, and every relative link resolves to a file and, with a
//! `#fragment`, to a heading of it (mdBook's anchors). The configuration page itself is
//! generated and checked against the schema by `config::reference` (a unit test).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common::root;

/// mdBook's anchor of a heading's text: alphanumerics, `_` and `-` kept (lowercase),
/// whitespace to `-`, the rest (backticks, brackets, punctuation) dropped.
fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The lines of a Markdown file outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated heading's later ones get `-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let Some(h) = line.strip_prefix('#') else {
            continue;
        };
        let base = anchor(h.trim_start_matches('#').trim());
        let mut id = base.clone();
        let mut n = 0;
        while out.contains(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        out.insert(id);
    }
    out
}

/// The targets of a Markdown file's inline links `[text](target)`, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        // inline code holds no links
        let line: String = line.split('`').step_by(2).collect::<Vec<_>>().join("``");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

/// Every relative link of the Markdown file `file` that does not resolve, with why.
fn broken_links(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = file.parent().unwrap();
    let mut out = Vec::new();
    for target in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = match target.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (target.as_str(), None),
        };
        let linked: PathBuf = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !linked.exists() {
            out.push(format!("{}: `{target}`: no such file", file.display()));
            continue;
        }
        if let Some(f) = fragment {
            let page = std::fs::read_to_string(&linked).unwrap_or_default();
            if !anchors(&page).contains(f) {
                out.push(format!(
                    "{}: `{target}`: no heading of {} has the anchor `{f}`",
                    file.display(),
                    linked.display()
                ));
            }
        }
    }
    out
}

#[test]
fn every_chapter_of_the_book_is_listed_and_every_link_resolves() {
    let src = root().join("docs/src");
    assert!(root().join("docs/book.toml").is_file(), "docs/book.toml");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let chapters: BTreeSet<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "SUMMARY.md")
        .collect();
    assert_eq!(
        listed, chapters,
        "SUMMARY.md's chapters and the files of docs/src differ"
    );
    assert!(chapters.len() >= 15, "{chapters:?}");
    let mut broken = Vec::new();
    for name in chapters.iter().map(String::as_str).chain(["SUMMARY.md"]) {
        broken.extend(broken_links(&src.join(name)));
    }
    broken.extend(broken_links(&root().join("README.md")));
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_fits_on_a_few_screens_and_links_into_the_book() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 220,
        "README.md has {lines} lines: the manual is the book"
    );
    for command in [
        "cargo run --release -- run experiments/quickstart.toml",
        "cargo test --release",
    ] {
        assert!(readme.contains(command), "README.md lacks `{command}`");
    }
    assert!(
        links(&readme).iter().any(|l| l.starts_with("docs/src/")),
        "README.md links into the book"
    );
}

#[test]
fn anchors_follow_mdbook() {
    assert_eq!(
        anchor("Unit by unit: memory and activation checkpointing"),
        "unit-by-unit-memory-and-activation-checkpointing"
    );
    assert_eq!(anchor("`[train.early_stopping]`"), "trainearly_stopping");
    assert_eq!(
        anchor("wgpu (Vulkan, Metal, DX12)"),
        "wgpu-vulkan-metal-dx12"
    );
    let page = "# A\n## B\n## B\n```\n# not a heading\n```\n";
    assert_eq!(
        anchors(page).into_iter().collect::<Vec<_>>(),
        ["a", "b", "b-1"]
    );
}
