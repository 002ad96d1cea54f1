//! Nothing a control plane started outlives the process that started it, even when
//! that process is SIGKILLed and never runs a destructor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "APPSERVICE_TESTS_ORPHAN_CHILD";

/// Run by the test below in a child process: starts a control plane, prints its
/// directory and waits to be killed. Does nothing when run on its own.
#[tokio::test]
#[ignore = "helper: runs only as the child of killed_test_process_leaves_no_component"]
async fn child_holds_a_control_plane() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let cp = harness::ControlPlane::start(harness::Options::full())
        .await
        .unwrap();
    let root = cp.kubeconfig_path().parent().unwrap().to_owned();
    println!("ROOT={}", root.display());
    tokio::time::sleep(Duration::from_secs(600)).await;
}

fn processes_under(root: &str) -> Vec<String> {
    let out = Command::new("pgrep")
        .args(["-a", "-f", root])
        .output()
        .expect("pgrep runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn killed_test_process_leaves_no_component() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holds_a_control_plane",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let root = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("ROOT=").map(str::to_owned))
        .expect("the child prints its control plane directory");
    let before = processes_under(&root);
    // etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok + wrappers.
    assert!(before.len() >= 5, "{before:#?}");

    child.kill().unwrap(); // SIGKILL: no destructor, no atexit
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = processes_under(&root);
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "orphans: {left:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&root);
}
