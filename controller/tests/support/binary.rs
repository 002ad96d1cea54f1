//! The controller's binary as a child process, for the tests that need processes (a
//! killed leader, shards that come and go): the shipped defaults but for the flags a test
//! names, its ops server on a free port, its JSON log in a file, killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;
use tokio::process::{Child, Command};

/// A running controller binary.
pub struct Binary {
    /// Its `--identity`: its name in Leases, logs and failure messages.
    pub identity: String,
    pub child: Child,
    /// Where `/metrics`, `/healthz` and `/readyz` answer, on loopback.
    pub ops_port: u16,
    /// Its log (`<identity>.log` in the test's directory).
    pub log: PathBuf,
}

/// Starts the controller binary with `--kubeconfig`, `--identity`, `--ops-addr` and JSON
/// logs, then `flags`. `RUST_LOG` is `CONTROLLER_TEST_LOG`, `info` by default.
pub fn spawn(
    kubeconfig: &Path,
    identity: &str,
    dir: &Path,
    flags: &[&str],
) -> anyhow::Result<Binary> {
    let ops_port = harness::process::free_port()?;
    let log = dir.join(format!("{identity}.log"));
    let out = std::fs::File::create(&log)?;
    let child = Command::new(env!("CARGO_BIN_EXE_appservice-controller"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--identity", identity])
        .args(["--ops-addr", &format!("127.0.0.1:{ops_port}")])
        .args(["--log-format", "json"])
        .args(flags)
        .env(
            "RUST_LOG",
            std::env::var("CONTROLLER_TEST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .context("spawning the controller binary")?;
    Ok(Binary {
        identity: identity.to_owned(),
        child,
        ops_port,
        log,
    })
}

impl Binary {
    /// Sends `sig` (`"TERM"`, `"KILL"`, `"STOP"`, …) to the process.
    pub fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("process already reaped")?;
        Ok(harness::process::signal(pid, sig)?)
    }

    /// The last `lines` lines of its log, under its identity.
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "--- {}:\n{}",
            self.identity,
            harness::process::tail(&self.log, lines)
        )
    }
}
