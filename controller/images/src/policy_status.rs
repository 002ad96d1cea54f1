//! The ImagePolicy's status: whether the controller can use it (every key parses and,
//! for a `secretRef`, its Secret and key exist), with the status contract kstatus reads
//! (`Stalled` while an admin must fix it). Written by the leader, every
//! [`INTERVAL`] and on each policy change, only when it changed; by a controller that
//! watches one namespace, only for the policies that select it
//! ([`super::Verifier::scoped_to`]).

use std::time::Duration;

use common::conditions::{self, FALSE, RECONCILING, STALLED, TRUE, reasons};
use common::image_policy::{ImagePolicy, ImagePolicyStatus, READY};
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tracing::warn;

use super::Verifier;
use controller_core::metrics::Written;
use controller_core::status::{Clock, SystemClock};
use controller_core::status_writer::{Guard, apply_status};

/// How often the leader looks at every policy (a key Secret may change meanwhile).
pub const INTERVAL: Duration = Duration::from_secs(10);

/// The status `policy` should have, given whether its keys are usable.
pub fn status_of(
    policy: &ImagePolicy,
    keys: &Result<usize, String>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> ImagePolicyStatus {
    let generation = policy.metadata.generation;
    let mut status = policy.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let (ready, reason, message) = match keys {
        Ok(n) => (
            TRUE,
            "KeysUsable",
            format!("{n} key{} usable", if *n == 1 { "" } else { "s" }),
        ),
        Err(why) => (FALSE, reasons::IMAGE_POLICY_NOT_USABLE, why.clone()),
    };
    let stalled = if ready == TRUE { FALSE } else { TRUE };
    for (type_, st, reason, message) in [
        (READY, ready, reason, message.clone()),
        (
            STALLED,
            stalled,
            if stalled == TRUE {
                reason
            } else {
                reasons::AS_EXPECTED
            },
            if stalled == TRUE {
                message
            } else {
                String::new()
            },
        ),
        (RECONCILING, FALSE, reasons::AS_EXPECTED, String::new()),
    ] {
        conditions::set(
            &mut status.conditions,
            conditions::new_condition(type_, st, reason, message, generation, now),
        );
    }
    status
}

/// Runs while the controller runs; writes only while `leading` is true.
pub async fn run(
    verifier: std::sync::Arc<Verifier>,
    leading: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ImagePolicy> = Api::all(verifier.client.clone());
    loop {
        if *leading.borrow()
            && let Some(stores) = verifier.stores.get()
        {
            for policy in stores.policies.state() {
                if !verifier.writes_status_of(stores, &policy) {
                    continue;
                }
                let keys = verifier.keys(&policy).await.map(|k| k.len());
                let now = SystemClock.now();
                let new = status_of(&policy, &keys, &now);
                let old = policy.status.clone().unwrap_or_default();
                if new.observed_generation == old.observed_generation
                    && conditions::same_set_ignoring_time(&new.conditions, &old.conditions)
                {
                    continue;
                }
                if let Err(e) = apply_status(
                    &api,
                    &policy,
                    &new,
                    Guard::None,
                    &[],
                    &verifier.writes,
                    Written::ImagePolicyStatus,
                )
                .await
                {
                    warn!(error = %e, policy = %policy.name_any(), "could not write ImagePolicy status")
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::image_policy::{ImagePattern, ImagePolicySpec, PolicyKey, PolicyMode};

    #[test]
    fn usable_keys_are_ready_and_an_unusable_one_stalls_with_its_reason() {
        let mut policy = ImagePolicy::new(
            "p",
            ImagePolicySpec {
                images: vec![ImagePattern {
                    glob: "registry.example.com/**".into(),
                }],
                namespace_selector: None,
                on_running_failure: Default::default(),
                mode: PolicyMode::Enforce,
                keys: vec![PolicyKey {
                    name: "k".into(),
                    public_key: None,
                    secret_ref: None,
                }],
            },
        );
        policy.metadata.generation = Some(4);
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        );
        let ok = status_of(&policy, &Ok(2), &now);
        assert_eq!(ok.observed_generation, Some(4));
        let ready = conditions::find(&ok.conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.message.as_str()),
            (TRUE, "2 keys usable")
        );
        assert!(!conditions::is_true(&ok.conditions, STALLED));
        let bad = status_of(
            &policy,
            &Err("key k: Secret ops/keys not found".into()),
            &now,
        );
        let ready = conditions::find(&bad.conditions, READY).unwrap();
        assert_eq!(ready.reason, reasons::IMAGE_POLICY_NOT_USABLE);
        assert!(conditions::is_true(&bad.conditions, STALLED));
    }
}
