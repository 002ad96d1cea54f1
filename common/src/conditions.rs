//! Conditions in the `metav1.Condition` shape, kept without churn.
//!
//! A condition's `lastTransitionTime` moves only when its `status` changes; a write is
//! needed only when something other than timestamps changed. The clock is a parameter so
//! callers (and tests) decide what "now" is.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the application serves with all desired replicas ready.
pub const READY: &str = "Ready";
/// Condition type: a rollout is under way.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: something is wrong that needs attention.
pub const DEGRADED: &str = "Degraded";
/// Condition type (kstatus' abnormal-true convention): the controller is working towards
/// the spec and progress is possible; True only then.
pub const RECONCILING: &str = "Reconciling";
/// Condition type (kstatus' abnormal-true convention): the controller cannot make
/// progress until a human acts (fix the spec, free a name, admit the Pods, fix the
/// DatabaseClass); True only then.
pub const STALLED: &str = "Stalled";
/// Condition type: the database exists and its credentials are in place.
pub const DATABASE_READY: &str = "DatabaseReady";
/// Condition type: the images an `ImagePolicy` governs are verified (present only while
/// one governs the AppService's images).
pub const IMAGE_VERIFIED: &str = "ImageVerified";

/// Condition status values.
pub const TRUE: &str = "True";
pub const FALSE: &str = "False";
pub const UNKNOWN: &str = "Unknown";

/// Machine-readable reasons used by the controller.
pub mod reasons {
    pub const AVAILABLE: &str = "Available";
    pub const ROLLING_OUT: &str = "RollingOut";
    pub const SCALED_TO_ZERO: &str = "ScaledToZero";
    pub const RECONCILED: &str = "Reconciled";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const RESOURCE_CONFLICT: &str = "ResourceConflict";
    /// A ConfigMap or Secret the Pods read (`spec.config`, or a key `env` takes from one
    /// that is not optional) does not exist; the message names each. Nothing is rolled out
    /// until it does.
    pub const CONFIG_SOURCE_MISSING: &str = "ConfigSourceMissing";
    /// `spec.expose` asks for a route, and no Gateway is configured to attach it to.
    pub const EXPOSURE_UNAVAILABLE: &str = "ExposureUnavailable";
    /// A host name of `spec.expose` is held by another (older) AppService.
    pub const EXPOSURE_CONFLICT: &str = "ExposureConflict";
    /// The route is written and the Gateway has not accepted it yet.
    pub const EXPOSING: &str = "Exposing";
    /// The Gateway refused the route (its `Accepted` condition is False).
    pub const EXPOSURE_REFUSED: &str = "ExposureRefused";
    /// The Deployment's `ReplicaFailure`: Pods could not be created (Pod Security
    /// admission, a ResourceQuota, a LimitRange refused them); the message says which.
    pub const REPLICA_FAILURE: &str = "ReplicaFailure";
    /// A Pod of the rollout waits for a human: the kubelet refuses or cannot pull or
    /// start its container (`CreateContainerConfigError`, `ImagePullBackOff`,
    /// `CrashLoopBackOff`, ...), or the scheduler finds no node for it. The message names
    /// the Pod, the container and the kubelet's words.
    pub const PODS_FAILING: &str = "PodsFailing";
    /// The Deployment's rollout exceeded its progress deadline.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    pub const AS_EXPECTED: &str = "AsExpected";
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// The API server rejected a child the controller built (e.g. a field `validate`
    /// does not check); retried when the AppService changes.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// `ImageVerified`: each governed image is signed by a key of each policy.
    pub const VERIFIED: &str = "Verified";
    /// No signature at all for the image's digest.
    pub const IMAGE_UNSIGNED: &str = "ImageUnsigned";
    /// Signatures exist but none is valid for a policy's keys (or signs another image).
    pub const SIGNATURE_INVALID: &str = "SignatureInvalid";
    /// The registry has no such image or tag.
    pub const IMAGE_NOT_FOUND: &str = "ImageNotFound";
    /// The registry refused the controller's credentials.
    pub const REGISTRY_DENIED: &str = "RegistryDenied";
    /// The registry did not answer in time or failed; retried with backoff.
    pub const REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
    /// The registry sent more than the controller reads of one answer (a manifest, a
    /// signature manifest, a token): the message names the bound. Held until it changes.
    pub const REGISTRY_RESPONSE_TOO_LARGE: &str = "RegistryResponseTooLarge";
    /// The registry answered something the protocol does not allow (a redirect loop, a
    /// digest that does not match the bytes, malformed JSON). Held until it changes.
    pub const REGISTRY_RESPONSE_INVALID: &str = "RegistryResponseInvalid";
    /// The signature that verified a digest before is gone from the registry: what runs
    /// keeps running, nothing new rolls out.
    pub const SIGNATURE_REVOKED: &str = "SignatureRevoked";
    /// A governing policy cannot be used (a key that does not parse, its Secret missing).
    pub const IMAGE_POLICY_NOT_USABLE: &str = "ImagePolicyNotUsable";
    /// The controller has not listed the ImagePolicies yet (just started).
    pub const IMAGE_POLICIES_LOADING: &str = "ImagePoliciesLoading";
}

/// Builds a condition stamped with `now` and the generation it describes.
pub fn new_condition(
    type_: &str,
    status: &str,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        observed_generation,
        last_transition_time: now.clone(),
    }
}

/// The condition of the given type, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == TRUE)
}

/// Equal in everything but `lastTransitionTime`.
pub fn same_ignoring_time(a: &Condition, b: &Condition) -> bool {
    a.type_ == b.type_
        && a.status == b.status
        && a.reason == b.reason
        && a.message == b.message
        && a.observed_generation == b.observed_generation
}

/// Two condition lists describe the same state (order and timestamps aside).
pub fn same_set_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|ca| find(b, &ca.type_).is_some_and(|cb| same_ignoring_time(ca, cb)))
}

/// Sets `new` into `conditions`, replacing the entry of the same type.
///
/// When the status is unchanged the existing `lastTransitionTime` is kept, whatever `new`
/// carries. Returns whether anything other than timestamps changed.
pub fn set(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            let changed = !same_ignoring_time(existing, &new);
            *existing = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// Removes the condition of `type_`; returns whether one was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
    }

    fn ready(status: &str, reason: &str, generation: i64, now: i64) -> Condition {
        new_condition(READY, status, reason, "m", Some(generation), &at(now))
    }

    #[test]
    fn adds_missing_condition() {
        let mut conds = vec![];
        assert!(set(&mut conds, ready(FALSE, reasons::ROLLING_OUT, 1, 10)));
        assert_eq!(conds.len(), 1);
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn same_status_keeps_transition_time_and_reports_no_change() {
        let mut conds = vec![ready(TRUE, reasons::AVAILABLE, 1, 10)];
        assert!(!set(&mut conds, ready(TRUE, reasons::AVAILABLE, 1, 99)));
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn same_status_new_reason_is_a_change_but_keeps_time() {
        let mut conds = vec![ready(FALSE, reasons::ROLLING_OUT, 1, 10)];
        assert!(set(&mut conds, ready(FALSE, reasons::INVALID_SPEC, 1, 99)));
        assert_eq!(conds[0].reason, reasons::INVALID_SPEC);
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn new_generation_is_a_change() {
        let mut conds = vec![ready(TRUE, reasons::AVAILABLE, 1, 10)];
        assert!(set(&mut conds, ready(TRUE, reasons::AVAILABLE, 2, 99)));
        assert_eq!(conds[0].observed_generation, Some(2));
        assert_eq!(conds[0].last_transition_time, at(10));
    }

    #[test]
    fn status_change_moves_transition_time() {
        let mut conds = vec![ready(FALSE, reasons::ROLLING_OUT, 1, 10)];
        assert!(set(&mut conds, ready(TRUE, reasons::AVAILABLE, 1, 20)));
        assert_eq!(conds[0].last_transition_time, at(20));
        assert!(is_true(&conds, READY));
    }

    #[test]
    fn replaces_by_type_without_duplicates() {
        let mut conds = vec![
            new_condition(PROGRESSING, TRUE, reasons::ROLLING_OUT, "", Some(1), &at(1)),
            ready(FALSE, reasons::ROLLING_OUT, 1, 1),
        ];
        set(&mut conds, ready(TRUE, reasons::AVAILABLE, 1, 2));
        assert_eq!(conds.len(), 2);
        assert_eq!(
            find(&conds, PROGRESSING).map(|c| c.status.as_str()),
            Some(TRUE)
        );
    }

    #[test]
    fn set_comparison_ignores_order_and_time() {
        let a = vec![
            ready(TRUE, reasons::AVAILABLE, 1, 1),
            new_condition(DEGRADED, FALSE, reasons::AS_EXPECTED, "", Some(1), &at(1)),
        ];
        let b = vec![
            new_condition(DEGRADED, FALSE, reasons::AS_EXPECTED, "", Some(1), &at(5)),
            ready(TRUE, reasons::AVAILABLE, 1, 7),
        ];
        assert!(same_set_ignoring_time(&a, &b));
        assert!(!same_set_ignoring_time(&a, &b[..1]));
        let c = vec![b[0].clone(), ready(FALSE, reasons::AVAILABLE, 1, 7)];
        assert!(!same_set_ignoring_time(&a, &c));
    }

    #[test]
    fn remove_by_type() {
        let mut conds = vec![ready(TRUE, reasons::AVAILABLE, 1, 1)];
        assert!(!remove(&mut conds, DEGRADED));
        assert!(remove(&mut conds, READY));
        assert!(conds.is_empty());
    }
}
