//! Why the Pods of a rollout do not start, as the kubelet and the scheduler say it: a
//! Deployment's status counts Pods that are not ready but never says why, so a Pod the
//! kubelet refuses (an image that runs as root under `runAsNonRoot`, a missing Secret
//! key), cannot pull, or that crashes, would show as "rolling out" until the progress
//! deadline. While a rollout is in progress, reconcile lists the AppService's Pods (one
//! bounded, namespaced list per pass; no watch, no cache) and status names the first
//! Pod that waits for a human.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::Api;
use kube::api::ListParams;

/// Waiting reasons of a container that do not go away by waiting: the kubelet retries,
/// but the same spec or image fails the same way until someone changes it.
/// (`ErrImagePull` is the first failed pull, which may be a blip; `ImagePullBackOff`
/// follows it when it is not.)
pub const STUCK_REASONS: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "RunContainerError",
];

/// At most this many Pods are read per pass (a rollout's new Pods are few; the first
/// that is stuck is enough to say why).
pub const POD_LIST_LIMIT: u32 = 50;

/// A Pod that waits for a human, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodTrouble {
    /// The kubelet's waiting reason (`CreateContainerConfigError`, ...) or the
    /// scheduler's `Unschedulable`.
    pub reason: String,
    /// `Pod <name>: container <c>: <the kubelet's message>`.
    pub message: String,
}

/// The first Pod (by name) of `pods` that waits for a human: a container (init
/// containers first) waiting with one of [`STUCK_REASONS`], or a Pod the scheduler
/// found no node for. Pods being deleted are passed over.
pub fn trouble_of(pods: &[Pod]) -> Option<PodTrouble> {
    let mut pods: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    pods.into_iter().find_map(trouble_of_pod)
}

fn trouble_of_pod(pod: &Pod) -> Option<PodTrouble> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref()?;
    let containers = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten());
    for container in containers {
        if let Some((reason, message)) = stuck_waiting(container) {
            return Some(PodTrouble {
                reason: reason.to_owned(),
                message: if message.is_empty() {
                    format!("Pod {name}: container {}: {reason}", container.name)
                } else {
                    format!(
                        "Pod {name}: container {}: {reason}: {message}",
                        container.name
                    )
                },
            });
        }
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
        .map(|c| PodTrouble {
            reason: "Unschedulable".to_owned(),
            message: format!(
                "Pod {name}: Unschedulable: {}",
                c.message.as_deref().unwrap_or("no node fits")
            ),
        })
}

fn stuck_waiting(container: &ContainerStatus) -> Option<(&str, &str)> {
    let waiting = container.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    STUCK_REASONS
        .contains(&reason)
        .then(|| (reason, waiting.message.as_deref().unwrap_or_default()))
}

/// Lists the Pods of AppService `name` (its instance label) in `namespace`, at most
/// [`POD_LIST_LIMIT`], and returns the first one's trouble. A failed list says nothing:
/// status then shows the rollout as the Deployment does, and the next pass looks again.
pub async fn pod_trouble(client: &kube::Client, namespace: &str, name: &str) -> Option<PodTrouble> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default()
        .labels(&common::names::selector_string(name))
        .limit(POD_LIST_LIMIT);
    match pods.list(&params).await {
        Ok(list) => trouble_of(&list.items),
        Err(error) => {
            tracing::debug!(%error, "listing the rollout's Pods failed; status says what the Deployment says");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn pod(name: &str, status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": name}, "status": status})).unwrap()
    }

    fn waiting(reason: &str, message: &str) -> serde_json::Value {
        json!({"containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": message}},
        }]})
    }

    #[test]
    fn a_container_the_kubelet_refuses_is_named_with_the_kubelets_words() {
        let pods = [
            pod("b", waiting("ContainerCreating", "")),
            pod(
                "a",
                waiting(
                    "CreateContainerConfigError",
                    "container has runAsNonRoot and image will run as root",
                ),
            ),
        ];
        assert_eq!(
            trouble_of(&pods),
            Some(PodTrouble {
                reason: "CreateContainerConfigError".into(),
                message: "Pod a: container app: CreateContainerConfigError: container has runAsNonRoot and image will run as root".into(),
            })
        );
    }

    #[test]
    fn starting_pulling_once_and_running_pods_are_no_trouble() {
        let running = json!({"containerStatuses": [{
            "name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"running": {}},
        }]});
        let pods = [
            pod("a", waiting("ContainerCreating", "")),
            pod("b", waiting("ErrImagePull", "a blip")),
            pod("c", running),
            pod("d", json!({})),
        ];
        assert_eq!(trouble_of(&pods), None);
    }

    #[test]
    fn init_containers_crash_loops_and_unschedulable_pods_are_trouble() {
        let init = json!({"initContainerStatuses": [{
            "name": "migrate", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
        }]});
        assert_eq!(
            trouble_of(&[pod("a", init)]).unwrap().message,
            "Pod a: container migrate: CrashLoopBackOff: back-off 40s"
        );
        let unschedulable = json!({"conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient cpu."}]});
        assert_eq!(
            trouble_of(&[pod("a", unschedulable)]).unwrap(),
            PodTrouble {
                reason: "Unschedulable".into(),
                message: "Pod a: Unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
                    .into(),
            }
        );
    }

    #[test]
    fn a_pod_being_deleted_is_passed_over() {
        let mut gone = pod("a", waiting("CrashLoopBackOff", ""));
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(trouble_of(&[gone]), None);
    }
}
