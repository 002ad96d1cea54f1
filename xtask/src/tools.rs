//! The developer tools this project installs (cargo-deny, mdbook): each pinned, installed
//! by `cargo install --locked` into `~/.cache/appservice-operator/tools` on first use,
//! and reused while the binary there reports the pinned version.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::Doing;

/// A pinned tool from crates.io.
pub struct Tool<'a> {
    /// The crate, and the binary it installs.
    pub name: &'a str,
    pub version: &'a str,
    /// More arguments of `cargo install` (features).
    pub args: &'a [&'a str],
    /// What the install message adds: how it is built, how long it takes.
    pub note: &'a str,
}

/// Where the tools live.
fn tools_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/appservice-operator/tools"))
}

/// The cargo running this command.
pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The binary of `tool`, installed first when it is missing or another version.
pub fn installed(tool: &Tool) -> Result<PathBuf> {
    let Tool {
        name,
        version,
        args,
        note,
    } = tool;
    let root = tools_dir()?;
    let bin = root.join("bin").join(name);
    let reported = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if reported.as_deref().is_some_and(|v| v.ends_with(version)) {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing {name} {version} into {} ({note})",
        root.display()
    );
    let started = Instant::now();
    let status = Command::new(cargo())
        .args(["install", "--locked", "--force", name, "--version", version])
        .args(*args)
        .arg("--root")
        .arg(&root)
        // Its own temporary target directory, not the workspace's.
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .doing("running cargo install")?;
    if !status.success() {
        bail!("cargo install {name} {version} failed ({status}); see above");
    }
    eprintln!("xtask: {name} installed in {:.0?}", started.elapsed());
    Ok(bin)
}
