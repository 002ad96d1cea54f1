//! The real `appservice-webhook` binary as a child process: started with the test
//! certificates, its memory read from `/proc/<pid>/status`, its metrics scraped, its log
//! lines awaited, stopped with SIGTERM (or killed).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use harness::Binary;
use harness::binary::{ServingWebhook, start_webhook, webhook_command};
use serde_json::Value;
use tokio::process::Child;
use tokio::sync::mpsc;

use super::{TestCerts, get};

/// Upper bound of any wait; reaching it is a failure, not a timing assertion.
pub const GIVE_UP: Duration = Duration::from_secs(60);

/// A running webhook binary and what it logged.
pub struct Webhook {
    pub child: Child,
    pub pid: u32,
    pub tls: SocketAddr,
    pub ops: SocketAddr,
    pub logs: mpsc::UnboundedReceiver<Value>,
}

impl Webhook {
    /// Starts the binary with the test certificates and `env`; waits until it serves.
    pub async fn start(certs: &TestCerts, env: &[(&str, &str)]) -> Webhook {
        let mut command = webhook_command(
            env!("CARGO_BIN_EXE_appservice-webhook"),
            &certs.cert_path,
            &certs.key_path,
        );
        command
            .env("WEBHOOK_SHUTDOWN_DELAY", "0s")
            .env("WEBHOOK_RELOAD_INTERVAL", "100ms")
            .envs(env.iter().copied());
        let ServingWebhook {
            binary: Binary { child, pid, logs },
            tls,
            ops,
        } = start_webhook(command, GIVE_UP).await.unwrap();
        Webhook {
            child,
            pid,
            tls,
            ops,
            logs,
        }
    }

    /// A field of `/proc/<pid>/status`, in bytes.
    pub fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field} missing from /proc/{}/status", self.pid));
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap();
        kb * 1024
    }

    pub fn rss(&self) -> u64 {
        self.status_bytes("VmRSS:")
    }

    /// Resets VmHWM to the current RSS (`echo 5 > /proc/<pid>/clear_refs`).
    pub fn reset_peak(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").unwrap();
    }

    pub fn peak(&self) -> u64 {
        self.status_bytes("VmHWM:")
    }

    /// Waits for a log line with `message`.
    pub async fn logged(&mut self, message: &str) -> Value {
        tokio::time::timeout(GIVE_UP, async {
            while let Some(line) = self.logs.recv().await {
                if line["message"] == message {
                    return line;
                }
            }
            panic!("the webhook exited before logging {message:?}");
        })
        .await
        .unwrap_or_else(|_| panic!("no {message:?} logged"))
    }

    pub async fn metric(&self, prefix: &str) -> f64 {
        let (_, text) = get(self.ops, "/metrics").await;
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{prefix} missing from the metrics"))
    }

    /// SIGKILL, as the kernel's OOM killer does: no drain, sockets closed by the kernel.
    pub async fn kill(mut self) {
        harness::process::signal(self.pid, "KILL").unwrap();
        let status = tokio::time::timeout(GIVE_UP, self.child.wait())
            .await
            .expect("the webhook did not die")
            .unwrap();
        assert!(!status.success(), "exit status {status}");
    }

    pub async fn terminate(mut self) {
        harness::process::signal(self.pid, "TERM").unwrap();
        let status = tokio::time::timeout(GIVE_UP, self.child.wait())
            .await
            .expect("the webhook did not stop")
            .unwrap();
        assert!(status.success(), "exit status {status}");
    }
}

/// A TCP connection to `addr` from the local address `source` (any 127.0.0.0/8 address
/// works over loopback), so one test can be several peers.
pub async fn connect_from(
    source: std::net::IpAddr,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = if source.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(addr).await
}
