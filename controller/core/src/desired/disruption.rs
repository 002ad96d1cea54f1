//! What keeps an AppService serving while its nodes are drained: a PodDisruptionBudget
//! over all its Pods (stable and canary), and a spread of its Pods over nodes.

use std::collections::BTreeMap;

use common::names::{MIN_REPLICAS_FOR_BUDGET, SPREAD_TOPOLOGY_KEY, budget_name, selector_labels};
use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::child_metadata;
use crate::subject::Subject;

/// The label every Deployment puts on the Pods of one ReplicaSet: spreading by it as
/// well as by our labels counts only the Pods of the same revision, so a rollout's new
/// Pods spread among themselves instead of around the old ones about to go.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// The PodDisruptionBudget `<name>` while the AppService runs at least
/// [`MIN_REPLICAS_FOR_BUDGET`] Pods: a voluntary eviction (a node drain, the cluster
/// autoscaler) may take one of its Pods at a time, never two, and waits until the one
/// taken is ready again elsewhere.
///
/// It selects the Service's labels, so the canary's Pods count too. Unhealthy Pods may
/// always be evicted (`unhealthyPodEvictionPolicy: AlwaysAllow`): a Pod that is not
/// ready serves nothing, and a budget that counted it would let an application that
/// crashes block every drain of its nodes.
pub fn desired_budget(app: &Subject) -> Option<PodDisruptionBudget> {
    if app.spec.replicas() < MIN_REPLICAS_FOR_BUDGET {
        return None;
    }
    let name = app.name();
    Some(PodDisruptionBudget {
        metadata: child_metadata(app, budget_name(name)),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(name)),
                ..LabelSelector::default()
            }),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".to_owned()),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// The spread of a Deployment's Pods over nodes: at most one more Pod on one node than
/// on another, counted among the Pods of the same Deployment (`selector`) and revision.
/// A preference, never a rule (`ScheduleAnyway`): on a single node, or with nodes full,
/// every Pod still runs.
pub fn spread(selector: &BTreeMap<String, String>) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: SPREAD_TOPOLOGY_KEY.to_owned(),
        when_unsatisfiable: "ScheduleAnyway".to_owned(),
        label_selector: Some(LabelSelector {
            match_labels: Some(selector.clone()),
            ..LabelSelector::default()
        }),
        match_label_keys: Some(vec![POD_TEMPLATE_HASH.to_owned()]),
        ..TopologySpreadConstraint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::subject::subject;
    use common::AppServiceSpec;
    use common::testing::stored;

    fn app(replicas: i32) -> common::AppService {
        stored(
            "checkout",
            AppServiceSpec {
                image: "registry.example.com/checkout:1".into(),
                replicas: Some(replicas),
                ..AppServiceSpec::default()
            },
        )
    }

    #[test]
    fn a_budget_only_from_two_replicas() {
        assert!(desired_budget(&subject(&app(0))).is_none());
        assert!(desired_budget(&subject(&app(1))).is_none());
        let two = app(2);
        let budget = desired_budget(&subject(&two)).expect("a budget at 2 replicas");
        assert_eq!(budget.metadata.name.as_deref(), Some("checkout"));
        let owners = budget.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].controller, Some(true));
        let spec = budget.spec.unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(spec.min_available, None);
        assert_eq!(
            spec.selector.unwrap().match_labels,
            Some(selector_labels("checkout"))
        );
        assert_eq!(
            spec.unhealthy_pod_eviction_policy.as_deref(),
            Some("AlwaysAllow")
        );
    }

    #[test]
    fn the_spread_never_blocks_scheduling() {
        let s = spread(&selector_labels("checkout"));
        assert_eq!(s.when_unsatisfiable, "ScheduleAnyway");
        assert_eq!(s.topology_key, SPREAD_TOPOLOGY_KEY);
        assert_eq!(s.max_skew, 1);
        assert_eq!(
            s.match_label_keys.as_deref(),
            Some(&[POD_TEMPLATE_HASH.to_owned()][..])
        );
    }
}
