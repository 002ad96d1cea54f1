//! A binary under test (the webhook's or the controller's), spawned by a test: its
//! stderr is read in the background, one JSON log line at a time, so a chatty binary
//! never blocks on a full pipe, and the test waits for the lines it expects (the one
//! that names the addresses it serves on, for example).

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::error::{Error, Result, io};

/// How many of the last log lines an error shows.
const SHOWN_LINES: usize = 20;

/// Whether a stderr line is a notice of the C allocator linked into the binaries, not a
/// line of their log.
fn is_allocator_notice(line: &str) -> bool {
    line.starts_with("<jemalloc>:")
}

/// A running binary, killed when dropped.
pub struct Binary {
    pub child: Child,
    pub pid: u32,
    /// Every line it logs, in order: JSON values, or a JSON string for a line that is not
    /// JSON (which [`Binary::wait_log`] reports as an error, unless the allocator wrote it).
    pub logs: mpsc::UnboundedReceiver<Value>,
}

impl Binary {
    /// Spawns `command` with stdin and stdout closed and stderr read as its log.
    pub fn spawn(mut command: Command) -> Result<Binary> {
        let program = command
            .as_std()
            .get_program()
            .to_string_lossy()
            .into_owned();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("spawning {program}")))?;
        let (Some(pid), Some(stderr)) = (child.id(), child.stderr.take()) else {
            return Err(Error::Binary(format!("{program} exited at once")));
        };
        let mut lines = BufReader::new(stderr).lines();
        let (tx, logs) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let value = serde_json::from_str(&line).unwrap_or(Value::String(line));
                if tx.send(value).is_err() {
                    break;
                }
            }
        });
        Ok(Binary { child, pid, logs })
    }

    /// Reads the log until a line `matches`, and returns it. Fails when a line is not
    /// JSON, when the binary exits first, or after `timeout`; the error shows `what` was
    /// awaited and the last lines read.
    pub async fn wait_log(
        &mut self,
        what: &str,
        timeout: Duration,
        mut matches: impl FnMut(&Value) -> bool,
    ) -> Result<Value> {
        let mut seen = Vec::new();
        let read = async {
            while let Some(line) = self.logs.recv().await {
                if let Value::String(text) = &line {
                    // jemalloc reports on stderr what it could not do (a background
                    // thread it could not start, say) and carries on; every other line
                    // must be one of the binary's JSON log lines.
                    if !is_allocator_notice(text) {
                        return Err(format!("a log line is not JSON: {text}"));
                    }
                    seen.push(line);
                    continue;
                }
                if matches(&line) {
                    return Ok(line);
                }
                seen.push(line);
            }
            Err("the binary exited".to_owned())
        };
        let failure = match tokio::time::timeout(timeout, read).await {
            Ok(Ok(line)) => return Ok(line),
            Ok(Err(failure)) => failure,
            Err(_) => format!("timed out after {timeout:?}"),
        };
        let last = seen
            .iter()
            .skip(seen.len().saturating_sub(SHOWN_LINES))
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n");
        Err(Error::Binary(format!(
            "waiting for {what}: {failure}; last lines logged:\n{last}"
        )))
    }

    /// [`Binary::wait_log`] for the line whose message is `message` (both binaries put
    /// an event's fields at the top level of their JSON lines).
    pub async fn wait_message(&mut self, message: &str, timeout: Duration) -> Result<Value> {
        self.wait_log(&format!("{message:?}"), timeout, |line| {
            line["message"] == message
        })
        .await
    }

    /// Keeps reading the log in the background and hands the child back: for a test
    /// that needs no more of the log, so the binary never blocks on a full pipe.
    pub fn drain_logs(self) -> Child {
        let mut logs = self.logs;
        tokio::spawn(async move { while logs.recv().await.is_some() {} });
        self.child
    }
}

/// The socket address in the string field `field` of a log line (`"tls_addr"`).
pub fn logged_addr(line: &Value, field: &str) -> Result<SocketAddr> {
    line[field]
        .as_str()
        .and_then(|addr| addr.parse().ok())
        .ok_or_else(|| Error::Binary(format!("no socket address in {field:?} of {line}")))
}

/// The command of the webhook binary at `program` (tests have it as
/// `env!("CARGO_BIN_EXE_appservice-webhook")`) configured the way every test starts it:
/// from environment variables only, info logs, both listeners on free ports of
/// 127.0.0.1 (it logs them: [`logged_addr`]) and the serving certificate and key at
/// `cert` and `key`. Tests add their own variables.
pub fn webhook_command(program: impl AsRef<OsStr>, cert: &Path, key: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("RUST_LOG", "info")
        .env("WEBHOOK_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_OPS_LISTEN", "127.0.0.1:0")
        .env("WEBHOOK_TLS_CERT", cert)
        .env("WEBHOOK_TLS_KEY", key);
    command
}

/// A webhook binary that serves, with the addresses it logged.
pub struct ServingWebhook {
    pub binary: Binary,
    /// Where it answers reviews over TLS.
    pub tls: SocketAddr,
    /// Its operations port (`/readyz`, `/metrics`, profiles).
    pub ops: SocketAddr,
}

/// Spawns the webhook `command` (see [`webhook_command`]) and waits, at most `timeout`,
/// until it logs that it serves.
pub async fn start_webhook(command: Command, timeout: Duration) -> Result<ServingWebhook> {
    let mut binary = Binary::spawn(command)?;
    let serving = binary.wait_message("webhook serving", timeout).await?;
    Ok(ServingWebhook {
        tls: logged_addr(&serving, "tls_addr")?,
        ops: logged_addr(&serving, "ops_addr")?,
        binary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allocators_notices_may_interrupt_the_json_log() {
        assert!(is_allocator_notice(
            "<jemalloc>: background thread creation failed (11)"
        ));
        assert!(!is_allocator_notice("2026-12-01T00:00:00Z  INFO serving"));
        assert!(!is_allocator_notice(""));
    }
}
