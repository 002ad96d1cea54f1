//! Namespace labels for policies (`namespaceObject`, as in ValidatingAdmissionPolicy).
//!
//! A policy such as "at least 2 replicas in namespaces labelled `environment=production`"
//! needs the namespace's labels, which an AdmissionReview does not carry. With
//! `--namespace-labels`, a metadata-only watch keeps every Namespace's name and labels
//! in memory, so answering a review still never calls the API server. The webhook is
//! not ready until the first list has arrived.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The in-memory view of Namespaces' metadata.
#[derive(Clone)]
pub struct NamespaceCache {
    store: Store<PartialObjectMeta<Namespace>>,
    synced: Arc<AtomicBool>,
}

impl std::fmt::Debug for NamespaceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceCache")
            .field("synced", &self.is_synced())
            .finish_non_exhaustive()
    }
}

impl NamespaceCache {
    /// Starts the watch; it runs until `shutdown` turns true.
    pub fn spawn(
        client: kube::Client,
        mut shutdown: watch::Receiver<bool>,
    ) -> (Self, JoinHandle<()>) {
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let cache = NamespaceCache {
            store: store.clone(),
            synced: synced.clone(),
        };
        let task = tokio::spawn(async move {
            // An Api of PartialObjectMeta lists and watches metadata only.
            let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
            let events = reflector(
                writer,
                watcher(api, watcher::Config::default()).default_backoff(),
            );
            let mut events = std::pin::pin!(events);
            let mark_synced = async {
                if store.wait_until_ready().await.is_ok() {
                    synced.store(true, Ordering::SeqCst);
                    tracing::info!(namespaces = store.state().len(), "namespace labels cached");
                }
                // Keep this branch pending: only the other two end the loop.
                std::future::pending::<()>().await;
            };
            let mut mark_synced = std::pin::pin!(mark_synced);
            loop {
                tokio::select! {
                    _ = shutdown.wait_for(|stop| *stop) => return,
                    () = &mut mark_synced => {}
                    event = events.next() => match event {
                        Some(Ok(_)) => {}
                        Some(Err(error)) => tracing::warn!(%error, "namespace watch failed; retrying"),
                        None => return,
                    },
                }
            }
        });
        (cache, task)
    }

    /// True once the first complete list of Namespaces is in memory.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// `namespaceObject` for a namespace: its name and labels. A namespace the watch has
    /// not delivered yet (created a moment ago) is bound with its name only.
    pub fn object(&self, name: &str) -> Value {
        let labels = self
            .store
            .get(&ObjectRef::new(name))
            .and_then(|ns| ns.metadata.labels.clone())
            .unwrap_or_default();
        namespace_object(name, &labels)
    }
}

/// The `namespaceObject` value for a name and labels.
pub fn namespace_object(name: &str, labels: &std::collections::BTreeMap<String, String>) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": labels},
    })
}
