//! Reloading files when they change: a file-system watcher on the directories that hold
//! them, plus a periodic check as a fallback.
//!
//! Directories, not files, are watched: Kubernetes updates a mounted Secret or ConfigMap
//! by writing a new `..<timestamp>` directory and atomically renaming the `..data`
//! symlink, so the watched files' inodes never change; the rename is an event in the
//! directory. The reload function itself compares contents, so spurious events are cheap.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

/// Events arrive in bursts (a Secret update touches several entries); wait this long
/// after the first one so the files are read once, complete.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Runs `reload` (on a blocking thread) whenever a file in the directories of `paths`
/// changes, every `interval`, until `shutdown` turns true.
pub fn spawn<F>(
    what: &'static str,
    paths: &[&Path],
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
    reload: F,
) -> JoinHandle<()>
where
    F: Fn() + Send + Sync + 'static,
{
    let changed = Arc::new(Notify::new());
    let watcher = watch_dirs(what, paths, changed.clone());
    let reload = Arc::new(reload);
    tokio::spawn(async move {
        // Keep the watcher alive as long as the task.
        let _watcher = watcher;
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            tokio::select! {
                () = changed.notified() => {
                    tokio::select! {
                        () = tokio::time::sleep(DEBOUNCE) => {}
                        _ = shutdown.changed() => return,
                    }
                }
                _ = ticker.tick() => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let reload = reload.clone();
            if let Err(error) = tokio::task::spawn_blocking(move || reload()).await {
                tracing::error!(%error, what, "reload task failed");
            }
        }
    })
}

/// The directories holding `paths`, each watched once.
fn dirs(paths: &[&Path]) -> BTreeSet<PathBuf> {
    paths
        .iter()
        .map(|p| match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        })
        .collect()
}

fn watch_dirs(
    what: &'static str,
    paths: &[&Path],
    changed: Arc<Notify>,
) -> Option<RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            changed.notify_one();
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(watcher) => watcher,
        Err(error) => {
            tracing::warn!(%error, what, "cannot watch files; relying on the periodic check");
            return None;
        }
    };
    for dir in dirs(paths) {
        if let Err(error) = watcher.watch(&dir, RecursiveMode::NonRecursive) {
            tracing::warn!(%error, what, dir = %dir.display(), "cannot watch directory; relying on the periodic check");
        }
    }
    Some(watcher)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_directories() {
        let dirs = dirs(&[
            Path::new("/a/tls.crt"),
            Path::new("/a/tls.key"),
            Path::new("p.yaml"),
        ]);
        assert_eq!(
            dirs,
            BTreeSet::from([PathBuf::from("."), PathBuf::from("/a")])
        );
    }

    #[tokio::test]
    async fn reloads_on_change_and_stops_on_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "1").unwrap();
        let (tx, rx) = watch::channel(false);
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let path = file.clone();
        // A long interval: the reload below must come from the watcher.
        let task = spawn("test", &[&file], Duration::from_secs(3600), rx, move || {
            let _ = seen_tx.send(std::fs::read_to_string(&path).unwrap_or_default());
        });
        // The watcher is registered before `spawn` returns.
        std::fs::write(&file, "2").unwrap();
        loop {
            let seen = seen_rx.recv().await.unwrap();
            if seen == "2" {
                break;
            }
        }
        tx.send(true).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn the_periodic_check_works_without_a_watcher() {
        let dir = tempfile::tempdir().unwrap();
        // The directory does not exist yet, so it cannot be watched: only the timer runs.
        let file = dir.path().join("later").join("f");
        let (tx, rx) = watch::channel(false);
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        let path = file.clone();
        let task = spawn("test", &[&file], Duration::from_millis(20), rx, move || {
            if let Ok(text) = std::fs::read_to_string(&path) {
                let _ = seen_tx.send(text);
            }
        });
        std::fs::create_dir(dir.path().join("later")).unwrap();
        std::fs::write(&file, "late").unwrap();
        assert_eq!(seen_rx.recv().await.unwrap(), "late");
        tx.send(true).unwrap();
        task.await.unwrap();
    }
}
