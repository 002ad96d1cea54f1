//! `cargo xtask book`: builds the documentation, an mdBook whose source is `docs/`
//! (`book.toml` at the repository's root, the table of contents in `docs/SUMMARY.md`),
//! and fails when mdBook reports an error or a warning (a summary entry without its
//! file, an include that names no file), or when a page under `docs/` is in no entry of
//! the summary: mdBook would leave such a page out of the book without a word.
//! Broken links and paths are `cargo xtask paths`'s.
//!
//! mdBook is installed and reused as every pinned tool is ([`crate::tools`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Result, bail};

use crate::Doing;
use crate::tools::{self, Tool};

/// The mdBook this project pins: the newest on crates.io when it was chosen (its MSRV,
/// 1.88, is below the workspace's toolchain).
pub const MDBOOK_VERSION: &str = "0.5.4";

/// The mdbook binary, installed first when it is missing or another version.
fn mdbook() -> Result<PathBuf> {
    tools::installed(&Tool {
        name: "mdbook",
        version: MDBOOK_VERSION,
        // `build` is all this command runs: the web server and file watcher of
        // `mdbook serve` would only lengthen the install.
        args: &["--no-default-features", "--features", "search"],
        note: "cargo install --locked, without the `serve` and `watch` features; once, a few minutes on 2 cores",
    })
}

/// Where the book is written: `book/` under the cargo target directory, as the rest of
/// the build output.
fn dest_dir(root: &Path) -> PathBuf {
    crate::target_dir(root).join("book")
}

/// The lines of mdBook's log that make the build fail: its errors and its warnings.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.split_whitespace()
                .take(3)
                .any(|w| matches!(w, "WARN" | "ERROR" | "[WARN]" | "[ERROR]"))
        })
        .collect()
}

/// The Markdown files under `dir`, as paths relative to it with `/` separators.
fn pages(dir: &Path, prefix: &str, found: &mut Vec<String>) -> Result<()> {
    let entries = std::fs::read_dir(dir).doing(format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.doing(format!("reading {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_dir() {
            pages(&path, &format!("{prefix}{name}/"), found)?;
        } else if name.ends_with(".md") {
            found.push(format!("{prefix}{name}"));
        }
    }
    Ok(())
}

/// The pages (relative to `docs/`) that no entry of the summary links, but the summary.
fn left_out(summary: &str, pages: &[String]) -> Vec<String> {
    let linked: Vec<&str> = summary
        .match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &summary[i + 2..];
            let target = &rest[..rest.find(')')?];
            Some(target.split('#').next().unwrap_or(target))
        })
        .map(|t| t.trim_start_matches("./"))
        .collect();
    let mut missing: Vec<String> = pages
        .iter()
        .filter(|p| p.as_str() != "SUMMARY.md" && !linked.contains(&p.as_str()))
        .cloned()
        .collect();
    missing.sort();
    missing
}

/// Builds the book of the repository at `root`.
pub fn run(root: &Path) -> Result<()> {
    let src = root.join("docs");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md"))
        .doing(format!("reading {}", src.join("SUMMARY.md").display()))?;
    let mut found = Vec::new();
    pages(&src, "", &mut found)?;
    let missing = left_out(&summary, &found);
    if !missing.is_empty() {
        bail!(
            "{} page(s) under docs/ are in no entry of docs/SUMMARY.md, so the book would leave them out: {}",
            missing.len(),
            missing.join(", ")
        );
    }
    let bin = mdbook()?;
    let dest = dest_dir(root);
    let started = Instant::now();
    let out = Command::new(&bin)
        .current_dir(root)
        .arg("build")
        .arg("--dest-dir")
        .arg(&dest)
        .arg(root)
        .output()
        .doing(format!("running {}", bin.display()))?;
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{log}");
    if !out.status.success() {
        bail!(
            "mdbook build failed ({}); see its messages above",
            out.status
        );
    }
    let complaints = complaints(&log);
    if !complaints.is_empty() {
        bail!(
            "mdbook build reported {} warning(s) or error(s), which fail this check:\n{}",
            complaints.len(),
            complaints.join("\n")
        );
    }
    println!(
        "book of {} pages built with mdbook {MDBOOK_VERSION} in {:.1?}: {}",
        found.len() - 1,
        started.elapsed(),
        dest.join("index.html").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{complaints, left_out};

    #[test]
    fn a_page_in_no_summary_entry_is_left_out() {
        let summary = "# Summary\n\n[Intro](introduction.md)\n\n# For users\n\n\
                       - [API](users/api.md)\n  - [Status](./users/status.md#top)\n";
        let pages = [
            "SUMMARY.md",
            "introduction.md",
            "users/api.md",
            "users/status.md",
            "users/forgotten.md",
            "design/old.md",
        ]
        .map(str::to_owned);
        assert_eq!(
            left_out(summary, &pages),
            ["design/old.md", "users/forgotten.md"]
        );
    }

    #[test]
    fn warnings_and_errors_are_complaints_and_information_is_not() {
        let log = "2026-12-07 03:40:01 [INFO] (mdbook_driver): Book building has started\n\
                   2026-12-07 03:40:01 [WARN] (mdbook_core): chapter not found\n \
                   WARN mdbook::book: Duplicate file in SUMMARY.md\n\
                   ERROR mdbook: Rendering failed\n\
                   INFO a page mentions WARN in its title";
        assert_eq!(
            complaints(log),
            [
                "2026-12-07 03:40:01 [WARN] (mdbook_core): chapter not found",
                " WARN mdbook::book: Duplicate file in SUMMARY.md",
                "ERROR mdbook: Rendering failed",
            ]
        );
    }
}
