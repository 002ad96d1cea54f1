//! Supervised child processes that cannot outlive the test process.
//!
//! Each component runs under a small bash wrapper whose stdin is a pipe held open by us.
//! A watcher in the wrapper blocks reading that pipe; end-of-file (we closed it, or our
//! process died in any way, including SIGKILL, or exited without running destructors,
//! as it does for statics) makes it SIGKILL the component at once. Graceful shutdown
//! buys nothing for throw-away test data and took etcd and kube-apiserver more than five
//! seconds (each waits for the other's connections), long enough to be seen as orphans. The wrapper exits with the component's status, so an early exit is
//! visible through [`Component::exited`]. No `unsafe` (no `pre_exec`/`PR_SET_PDEATHSIG`)
//! is needed. Each wrapper gets its own process group, so a Ctrl-C in a terminal reaches
//! only the test process (or `cargo xtask up`), which then stops components in order.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result, io};

/// The wrapper. `$1..` is the component's command line. `APPSERVICE_RM_AFTER_EXIT`, if
/// set, is a directory removed after the component exited (etcd's data: the shared
/// control plane is never dropped, so only the wrapper can clean it up).
const WRAPPER: &str = r#"
exec 3<&0 0</dev/null
"$@" 3<&- &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM HUP INT
{ read -r -u 3 _ || true; kill -KILL "$child" 2>/dev/null; } 2>/dev/null &
watcher=$!
exec 3<&-
while :; do
  wait "$child"; status=$?
  kill -0 "$child" 2>/dev/null || break
done
kill "$watcher" 2>/dev/null
if [ -n "${APPSERVICE_RM_AFTER_EXIT:-}" ]; then rm -rf -- "$APPSERVICE_RM_AFTER_EXIT"; fi
exit "$status"
"#;

/// Environment variables that would route the components' HTTP through a proxy.
const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

/// One running component (etcd, kube-apiserver, ...).
#[derive(Debug)]
pub struct Component {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

/// What to start.
pub struct Spec<'a> {
    pub name: &'a str,
    pub program: &'a Path,
    pub args: Vec<String>,
    pub log_dir: &'a Path,
    /// Removed by the wrapper after the component exits.
    pub remove_after_exit: Option<&'a Path>,
}

impl Component {
    /// Starts the component; its stdout and stderr go to `<log_dir>/<name>.log`.
    pub fn spawn(spec: Spec<'_>) -> Result<Self> {
        let log = spec.log_dir.join(format!("{}.log", spec.name));
        let out = File::create(&log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io(format!("duplicating {}", log.display())))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(WRAPPER)
            .arg(format!("wrapper-{}", spec.name))
            .arg(spec.program)
            .args(&spec.args)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        for var in PROXY_VARS {
            cmd.env_remove(var);
        }
        if let Some(dir) = spec.remove_after_exit {
            cmd.env("APPSERVICE_RM_AFTER_EXIT", dir);
        }
        let mut child = cmd
            .spawn()
            .map_err(io(format!("starting {} under bash", spec.name)))?;
        let stdin = child.stdin.take();
        Ok(Self {
            name: spec.name.to_owned(),
            child,
            stdin,
            log,
        })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the component has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// A startup error for this component, with the end of its log.
    pub fn startup_error(&self, reason: impl Into<String>, log_dir: &Path) -> Error {
        Error::Startup {
            component: self.name.clone(),
            reason: reason.into(),
            log: self.log.clone(),
            log_dir: log_dir.to_owned(),
            tail: tail(&self.log, 40),
        }
    }

    /// Stops the component: closes the pipe (the wrapper SIGKILLs the component) and waits
    /// up to `timeout` for the wrapper; kills the wrapper if it is still there after that.
    pub fn stop(&mut self, timeout: Duration) {
        drop(self.stdin.take());
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The watcher's SIGKILL should have ended it; if bash itself is stuck, end it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// The last `lines` lines of a log file (at most 64 KiB are read).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return format!("(cannot read {})", path.display());
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Directories of earlier runs older than this are removed at startup.
const PRUNE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Removes the directories under the system temporary directory whose names start with
/// `prefix` and that are older than a day: what a killed test process left behind (its
/// components were killed with it by the wrapper; only the files remain).
pub(crate) fn prune_old_dirs(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > PRUNE_AFTER);
        if old && entry.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Sends `signal` (`"TERM"`, `"KILL"`) to the process `pid`, through kill(1): no unsafe
/// code. A graceful stop of a binary under test is a SIGTERM.
pub fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .map_err(io(format!("running kill -{signal} {pid}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Binary(format!(
            "kill -{signal} {pid} failed ({status})"
        )))
    }
}

/// A finished command's `(success, stdout, stderr)`, its output read as UTF-8 (lossily).
pub fn outcome(output: &std::process::Output) -> (bool, String, String) {
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A plain HTTP/1.0 GET of `path` on `127.0.0.1:port` (an operations port: `/readyz`,
/// `/metrics`), returning the whole response, status line included. Keeps tests free of
/// an HTTP client.
pub async fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// Whether a component's startup log says another process had bound its port (Go's
/// "bind: address already in use", PostgreSQL's "Address already in use").
pub fn lost_the_port(log: &str) -> bool {
    log.to_ascii_lowercase().contains("address already in use")
}

/// A TCP port on 127.0.0.1 that was free a moment ago. Another process may take it
/// before the component binds it; [`crate::ControlPlane::start`], the OCI registry and
/// [`crate::postgres::Postgres::start`] start again when [`lost_the_port`] says so.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("finding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io("finding a free port"))?
        .port();
    Ok(port)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_port_taken_meanwhile_is_told_from_other_startup_failures() {
        // PostgreSQL 15's words when its port is bound already.
        assert!(lost_the_port(
            "LOG:  could not bind IPv4 address \"127.0.0.1\": Address already in use\n\
             FATAL:  could not create any TCP/IP sockets"
        ));
        // Go's (kube-apiserver, etcd, the registry).
        assert!(lost_the_port(
            "listen tcp 127.0.0.1:2379: bind: address already in use"
        ));
        assert!(!lost_the_port(
            "FATAL:  data directory \"/x\" has invalid permissions"
        ));
    }

    #[test]
    fn tail_returns_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let text: String = (1..=100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        assert_eq!(tail(&log, 2), "line 99\nline 100");
        assert!(tail(&dir.path().join("missing"), 2).contains("cannot read"));
    }

    #[test]
    fn a_component_reports_its_exit_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Component::spawn(Spec {
            name: "failing",
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), "echo boom; exit 3".into()],
            log_dir: dir.path(),
            remove_after_exit: None,
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            if let Some(status) = c.exited() {
                break status;
            }
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.code(), Some(3));
        let err = c.startup_error("exited", dir.path()).to_string();
        assert!(err.contains("boom"), "{err}");
        assert!(err.contains("failing.log"), "{err}");
    }

    #[test]
    fn stopping_kills_the_component_and_runs_the_cleanup() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let mut c = Component::spawn(Spec {
            name: "sleeper",
            program: Path::new("/bin/sleep"),
            args: vec!["1000".into()],
            log_dir: dir.path(),
            remove_after_exit: Some(&data),
        })
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(c.exited().is_none(), "still running");
        let started = Instant::now();
        c.stop(Duration::from_secs(5));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "SIGKILL, not a timeout"
        );
        assert!(c.exited().is_some());
        assert!(!data.exists(), "the wrapper removed the data directory");
    }
}
