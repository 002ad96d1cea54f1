//! `cargo xtask deny` (a step of `cargo xtask supply-chain`): cargo-deny's license,
//! ban (duplicate versions included) and source checks against `deny.toml`, and its
//! advisory check when the RustSec database can be fetched; when it cannot (it lives on
//! GitHub), the check is skipped and the run says so and why.
//!
//! cargo-deny is installed and reused as every pinned tool is ([`crate::tools`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::Doing;
use crate::tools::{self, Tool};

/// The cargo-deny this project pins (its MSRV, 1.88, is below the workspace's toolchain).
pub const CARGO_DENY_VERSION: &str = "0.20.2";
/// Longest wait for the advisory database: where GitHub is unreachable a fetch may hang
/// rather than fail.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the advisory database comes from (as deny.toml says).
const ADVISORY_DB: &str = "https://github.com/rustsec/advisory-db";

/// The cargo-deny binary, installed first when it is missing or another version.
pub fn cargo_deny() -> Result<PathBuf> {
    tools::installed(&Tool {
        name: "cargo-deny",
        version: CARGO_DENY_VERSION,
        args: &[],
        note: "cargo install --locked; once, several minutes on 2 cores",
    })
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
