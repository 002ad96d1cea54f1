//! `cargo xtask deny` (also the first step of `cargo xtask test`): cargo-deny's license,
//! ban (duplicate versions included) and source checks against `deny.toml`, and its
//! advisory check when the RustSec database can be fetched; when it cannot (it lives on
//! GitHub), the check is skipped and the run says so and why.
//!
//! cargo-deny is installed by `cargo install --locked` into
//! `~/.cache/appservice-operator/tools` and reused while that binary reports the pinned
//! version.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::Doing;

/// The cargo-deny this project pins (its MSRV, 1.88, is below the workspace's toolchain).
pub const CARGO_DENY_VERSION: &str = "0.20.2";
/// Longest wait for the advisory database: where GitHub is unreachable a fetch may hang
/// rather than fail.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the advisory database comes from (as deny.toml says).
const ADVISORY_DB: &str = "https://github.com/rustsec/advisory-db";

/// Where the developer tools this project installs live (cargo-deny, mdbook).
pub(crate) fn tools_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache/appservice-operator/tools"))
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The cargo-deny binary, installed first when it is missing or another version.
pub fn cargo_deny() -> Result<PathBuf> {
    let root = tools_dir()?;
    let bin = root.join("bin/cargo-deny");
    let installed = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if installed
        .as_deref()
        .is_some_and(|v| v.ends_with(CARGO_DENY_VERSION))
    {
        return Ok(bin);
    }
    eprintln!(
        "xtask: installing cargo-deny {CARGO_DENY_VERSION} into {} (cargo install --locked; once, several minutes on 2 cores)",
        root.display()
    );
    let started = Instant::now();
    let status = Command::new(cargo())
        .args(["install", "--locked", "--force", "cargo-deny", "--version"])
        .arg(CARGO_DENY_VERSION)
        .arg("--root")
        .arg(&root)
        // Its own temporary target directory, not the workspace's.
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .doing("running cargo install")?;
    if !status.success() {
        bail!("cargo install cargo-deny {CARGO_DENY_VERSION} failed ({status}); see above");
    }
    eprintln!("xtask: cargo-deny installed in {:.0?}", started.elapsed());
    Ok(bin)
}

/// Runs `command` until it exits or `timeout` passes; `Err` says which, with its output.
fn run_with_timeout(mut command: Command, timeout: Duration) -> Result<(), String> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(200));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {timeout:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    let reason = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim()
        .to_owned();
    Err(reason)
}

/// The checks, from the workspace at `root`.
pub fn run(root: &Path) -> Result<()> {
    let bin = cargo_deny()?;
    let manifest = root.join("Cargo.toml");
    let check = |checks: &[&str], extra: &[&str]| -> Result<()> {
        let status = Command::new(&bin)
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("check")
            // An allowance or skip that matches nothing is stale: fail, so deny.toml
            // says only what is true.
            .args([
                "-D",
                "unmatched-skip",
                "-D",
                "unnecessary-skip",
                "-D",
                "license-not-encountered",
            ])
            .args(extra)
            .args(checks)
            .status()
            .doing("running cargo-deny")?;
        if !status.success() {
            bail!(
                "cargo deny check {} failed ({status}); see above (deny.toml says what is allowed and why)",
                checks.join(" ")
            );
        }
        Ok(())
    };
    check(&["licenses", "bans", "sources"], &[])?;
    println!("cargo-deny: licenses, bans (duplicate versions included) and sources passed");

    let mut fetch = Command::new(&bin);
    fetch
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["fetch", "db"]);
    match run_with_timeout(fetch, FETCH_TIMEOUT) {
        Ok(()) => {
            check(&["advisories"], &["--disable-fetch"])?;
            println!("cargo-deny: advisories passed");
        }
        Err(why) => println!(
            "cargo-deny: advisories check SKIPPED: the RustSec advisory database ({ADVISORY_DB}) could not be fetched: {why}. Licenses, bans and sources were checked; run `cargo xtask deny` where GitHub is reachable to check advisories too."
        ),
    }
    Ok(())
}
