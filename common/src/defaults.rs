//! Defaulting: the one place that decides what an omitted field means.
//!
//! The webhook turns the difference into a JSON patch; the controller applies the same
//! function before building children, so both agree even when the webhook is bypassed.
//! Every function here is idempotent: defaulting a defaulted object changes nothing.
//!
//! Each version has its own defaults for the fields it alone has (`ports` and their
//! protocols in `v1beta1`, `port` in `v1alpha1`); they mean the same thing, which the
//! property tests check by converting defaulted objects.

//!
//! The values themselves are the constants below; the CRD's schema defaults, the
//! accessors that read a spec with its defaults applied (`AppServiceSpec::replicas`,
//! `ports`, `port`) and the controller's builders all use them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::LABEL_NAME;
use crate::types::{AppService, AppServiceSpec};
use crate::v1alpha1;

pub use crate::limits::{
    DEFAULT_CANARY_REPLICAS, DEFAULT_MAX_SURGE, DEFAULT_MAX_UNAVAILABLE, DEFAULT_MIN_REPLICAS,
    DEFAULT_PORT, DEFAULT_REPLICAS, DEFAULT_TARGET_CPU_UTILIZATION,
};
pub use crate::v1beta1::{
    DEFAULT_PORT_NAME, DEFAULT_PROTOCOL, DEFAULT_SECURITY_PROFILE, default_port_list, default_ports,
};

/// Fills every omitted field of a spec with its default: one replica, the `http` port
/// 8080 when no port is given, `TCP` for every port without a protocol, the
/// `Restricted` profile in a `podSecurity` without one, and `25%` for each setting a
/// `rollout` leaves out. An absent `podSecurity` stays
/// absent: it means the defaults already, and a `v1alpha1` reader would otherwise see
/// every object carry it in an annotation.
pub fn default_spec(spec: &mut AppServiceSpec) {
    spec.replicas.get_or_insert(DEFAULT_REPLICAS);
    default_port_list(&mut spec.ports);
    if let Some(security) = &mut spec.pod_security {
        security.profile.get_or_insert(DEFAULT_SECURITY_PROFILE);
    }
    // Like `podSecurity`, an absent `rollout` stays absent: the Deployment keeps the
    // strategy it always had (and its hash), and its defaults are the same values.
    if let Some(rollout) = &mut spec.rollout {
        rollout
            .max_surge
            .get_or_insert_with(|| rollout_default(DEFAULT_MAX_SURGE));
        rollout
            .max_unavailable
            .get_or_insert_with(|| rollout_default(DEFAULT_MAX_UNAVAILABLE));
    }
    if let Some(canary) = &mut spec.canary {
        canary.replicas.get_or_insert(DEFAULT_CANARY_REPLICAS);
    }
    if let Some(autoscaling) = &mut spec.autoscaling {
        autoscaling.min_replicas.get_or_insert(DEFAULT_MIN_REPLICAS);
        autoscaling
            .target_cpu_utilization_percentage
            .get_or_insert(DEFAULT_TARGET_CPU_UTILIZATION);
    }
}

fn rollout_default(value: &str) -> IntOrString {
    IntOrString::String(value.to_owned())
}

/// Defaults an AppService: its spec, plus the recommended `app.kubernetes.io/name` label
/// when the object has a name and the user did not set that label. User labels are
/// never changed.
pub fn default_object(app: &mut AppService) {
    default_spec(&mut app.spec);
    default_name_label(&mut app.metadata);
}

/// Fills every omitted field of a `v1alpha1` spec: one replica, port 8080.
pub fn default_v1alpha1_spec(spec: &mut v1alpha1::AppServiceSpec) {
    spec.replicas.get_or_insert(DEFAULT_REPLICAS);
    spec.port.get_or_insert(DEFAULT_PORT);
}

/// [`default_object`] for a `v1alpha1` AppService.
pub fn default_v1alpha1_object(app: &mut v1alpha1::AppService) {
    default_v1alpha1_spec(&mut app.spec);
    default_name_label(&mut app.metadata);
}

fn default_name_label(metadata: &mut ObjectMeta) {
    if let Some(name) = metadata.name.clone().filter(|n| !n.is_empty()) {
        metadata
            .labels
            .get_or_insert_with(Default::default)
            .entry(LABEL_NAME.to_owned())
            .or_insert(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{AppPort, DatabaseSpec, Protocol, SecurityProfile};
    use std::collections::BTreeMap;

    #[test]
    fn fills_replicas_and_port() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            ..Default::default()
        };
        default_spec(&mut spec);
        assert_eq!(spec.replicas, Some(DEFAULT_REPLICAS));
        assert_eq!(spec.ports, vec![AppPort::http(DEFAULT_PORT)]);
        let mut old = v1alpha1::AppServiceSpec::default();
        default_v1alpha1_spec(&mut old);
        assert_eq!((old.replicas, old.port), (Some(1), Some(DEFAULT_PORT)));
    }

    #[test]
    fn fills_the_profile_of_a_given_pod_security_only() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            ..Default::default()
        };
        default_spec(&mut spec);
        assert_eq!(spec.pod_security, None);
        assert_eq!(
            spec.pod_security().profile,
            Some(SecurityProfile::Restricted)
        );

        spec.pod_security = Some(crate::types::PodSecurity {
            run_as_user: Some(10001),
            ..Default::default()
        });
        default_spec(&mut spec);
        let security = spec.pod_security.clone().unwrap_or_default();
        assert_eq!(security.profile, Some(SecurityProfile::Restricted));
        assert_eq!(security.run_as_user, Some(10001));

        spec.pod_security = Some(crate::types::PodSecurity {
            profile: Some(SecurityProfile::Baseline),
            ..Default::default()
        });
        let before = spec.clone();
        default_spec(&mut spec);
        assert_eq!(spec, before);
    }

    #[test]
    fn fills_the_settings_of_a_given_rollout_only() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            ..Default::default()
        };
        default_spec(&mut spec);
        assert_eq!(spec.rollout, None);

        spec.rollout = Some(crate::types::RolloutSpec {
            max_surge: Some(IntOrString::Int(0)),
            max_unavailable: None,
        });
        default_spec(&mut spec);
        let rollout = spec.rollout.clone().unwrap_or_default();
        assert_eq!(rollout.max_surge, Some(IntOrString::Int(0)));
        assert_eq!(
            rollout.max_unavailable,
            Some(IntOrString::String("25%".into()))
        );
        // Idempotent.
        let before = spec.clone();
        default_spec(&mut spec);
        assert_eq!(spec, before);
        // The accessors apply the same defaults to an empty rollout.
        let empty = crate::types::RolloutSpec::default();
        assert_eq!(empty.max_surge(), IntOrString::String("25%".into()));
        assert_eq!(empty.max_unavailable(), IntOrString::String("25%".into()));
    }

    #[test]
    fn a_canary_runs_one_replica_by_default() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            replicas: Some(4),
            canary: Some(crate::types::CanarySpec {
                image: "nginx:1.28".into(),
                replicas: None,
            }),
            ..Default::default()
        };
        assert_eq!(spec.stable_replicas(), 3);
        default_spec(&mut spec);
        assert_eq!(spec.canary.as_ref().and_then(|c| c.replicas), Some(1));
        spec.canary = None;
        default_spec(&mut spec);
        assert_eq!(spec.canary, None);
        assert_eq!(spec.stable_replicas(), 4);
    }

    #[test]
    fn keeps_explicit_values_including_zero_replicas() {
        let mut spec = AppServiceSpec {
            image: "nginx:1.27".into(),
            replicas: Some(0),
            ports: vec![AppPort {
                name: "metrics".into(),
                port: 9090,
                protocol: Some(Protocol::Udp),
            }],
            database: Some(DatabaseSpec {
                class: "small".into(),
            }),
            ..Default::default()
        };
        let before = spec.clone();
        default_spec(&mut spec);
        assert_eq!(spec, before);
    }

    #[test]
    fn adds_name_label_without_touching_user_labels() {
        let mut app = AppService::new("checkout", AppServiceSpec::default());
        app.metadata.labels = Some(BTreeMap::from([("team".into(), "payments".into())]));
        default_object(&mut app);
        let labels = app.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["team"], "payments");
        assert_eq!(labels[LABEL_NAME], "checkout");

        let mut custom = AppService::new("checkout", AppServiceSpec::default());
        custom.metadata.labels = Some(BTreeMap::from([(LABEL_NAME.into(), "shop".into())]));
        default_object(&mut custom);
        assert_eq!(
            custom.metadata.labels.unwrap_or_default()[LABEL_NAME],
            "shop"
        );
    }

    #[test]
    fn no_label_without_a_name() {
        // generateName: the name is not known yet when the mutating webhook runs.
        let mut app = AppService::new("", AppServiceSpec::default());
        app.metadata.name = None;
        default_object(&mut app);
        assert_eq!(app.metadata.labels, None);
    }
}
