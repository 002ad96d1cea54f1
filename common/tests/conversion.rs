//! Property tests of conversion between `v1alpha1` and `v1beta1`, on random objects:
//! round trips are the identity in both directions, a `v1alpha1` client's
//! read-edit-write of a `v1beta1` object keeps everything it did not edit, the JSON form
//! the webhook converts agrees with the typed one, and both versions accept the same
//! objects and default to the same meaning.

use std::collections::BTreeMap;

use common::conversion::{Version, convert_object, to_v1alpha1, to_v1beta1};
use common::defaults::{default_spec, default_v1alpha1_spec};
use common::names::{
    ANNOTATION_V1ALPHA1_DATABASE, ANNOTATION_V1BETA1_CANARY, ANNOTATION_V1BETA1_POD_SECURITY,
    ANNOTATION_V1BETA1_PORTS, ANNOTATION_V1BETA1_ROLLOUT,
};
use common::validation::{validate, validate_v1alpha1};
use common::{AppServiceStatus, EnvVar, v1alpha1, v1beta1};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;

fn arb_map(keys: &'static str) -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    // Never an empty map: the API server drops those, and so does conversion.
    proptest::option::of(proptest::collection::btree_map(
        keys,
        "[a-z0-9 {}\":,]{0,12}",
        1..4,
    ))
}

fn arb_meta() -> impl Strategy<Value = ObjectMeta> {
    (
        "[a-z][a-z0-9-]{0,10}[a-z0-9]",
        arb_map("[a-z]{1,6}(\\.example\\.com/[a-z]{1,6})?"),
        arb_map("[a-z]{1,6}/[a-z-]{1,12}"),
        proptest::option::of(1..100i64),
    )
        .prop_map(|(name, labels, annotations, generation)| ObjectMeta {
            name: Some(name),
            namespace: Some("shop".into()),
            uid: Some("4f6c9d2e-0000-4000-8000-000000000001".into()),
            resource_version: Some("42".into()),
            generation,
            labels,
            annotations,
            ..ObjectMeta::default()
        })
}

fn arb_env() -> impl Strategy<Value = Vec<EnvVar>> {
    proptest::collection::vec(
        ("[A-Z_][A-Z0-9_]{0,8}", proptest::option::of("[ -~]{0,12}")).prop_map(|(name, value)| {
            EnvVar {
                name,
                value,
                value_from: None,
            }
        }),
        0..4,
    )
}

fn arb_resources() -> impl Strategy<Value = Option<ResourceRequirements>> {
    proptest::option::of(
        proptest::option::of(proptest::collection::btree_map(
            prop_oneof![Just("cpu".to_owned()), Just("memory".to_owned())],
            "[1-9][0-9]{0,3}(m|Mi|Gi)?".prop_map(Quantity),
            1..3,
        ))
        .prop_map(|requests| ResourceRequirements {
            requests,
            ..ResourceRequirements::default()
        }),
    )
}

fn arb_status() -> impl Strategy<Value = Option<AppServiceStatus>> {
    proptest::option::of(
        (
            proptest::option::of(0..50i64),
            proptest::option::of(0..5i32),
        )
            .prop_map(|(observed_generation, ready_replicas)| AppServiceStatus {
                observed_generation,
                ready_replicas,
                endpoint: Some("http://a.shop.svc:8080".into()),
                ..AppServiceStatus::default()
            }),
    )
}

fn arb_protocol() -> impl Strategy<Value = Option<v1beta1::Protocol>> {
    proptest::option::of(prop_oneof![
        Just(v1beta1::Protocol::Tcp),
        Just(v1beta1::Protocol::Udp),
        Just(v1beta1::Protocol::Sctp),
    ])
}

fn arb_ports() -> impl Strategy<Value = Vec<v1beta1::AppPort>> {
    prop_oneof![
        // The shape every v1alpha1 object has.
        (1..=65535i32).prop_map(|p| vec![v1beta1::AppPort::http(p)]),
        Just(vec![]),
        proptest::collection::vec(
            (
                prop_oneof![Just("http".to_owned()), "[a-z][a-z0-9-]{0,6}[a-z]"],
                prop_oneof![1..=65535i32, any::<i32>()],
                arb_protocol(),
            )
                .prop_map(|(name, port, protocol)| v1beta1::AppPort {
                    name,
                    port,
                    protocol,
                }),
            1..5,
        ),
    ]
}

fn arb_int_or_string() -> impl Strategy<Value = IntOrString> {
    prop_oneof![
        (-2..50i32).prop_map(IntOrString::Int),
        "[0-9]{1,3}%?".prop_map(IntOrString::String),
    ]
}

fn arb_rollout() -> impl Strategy<Value = Option<v1beta1::RolloutSpec>> {
    proptest::option::of(
        (
            proptest::option::of(arb_int_or_string()),
            proptest::option::of(arb_int_or_string()),
        )
            .prop_map(|(max_surge, max_unavailable)| v1beta1::RolloutSpec {
                max_surge,
                max_unavailable,
            }),
    )
}

fn arb_canary() -> impl Strategy<Value = Option<v1beta1::CanarySpec>> {
    proptest::option::of(
        ("[a-z./:0-9-]{0,24}", proptest::option::of(-2..1002i32))
            .prop_map(|(image, replicas)| v1beta1::CanarySpec { image, replicas }),
    )
}

/// Any `autoscaling`, valid or not.
fn arb_expose() -> impl Strategy<Value = Option<v1beta1::ExposeSpec>> {
    proptest::option::of(
        (
            proptest::collection::vec("[a-z*][a-z0-9.-]{0,12}", 0..3),
            proptest::collection::vec("/?[a-z/.]{0,8}", 0..3),
            proptest::option::of("[a-z]{1,6}"),
            proptest::option::of("[a-z][a-z-]{0,8}"),
        )
            .prop_map(|(hostnames, paths, port, secret)| v1beta1::ExposeSpec {
                hostnames,
                paths,
                port,
                tls: secret.map(|secret_name| v1beta1::ExposeTls {
                    secret_name: Some(secret_name),
                    issuer_ref: None,
                }),
            }),
    )
}

fn arb_autoscaling() -> impl Strategy<Value = Option<v1beta1::AutoscalingSpec>> {
    proptest::option::of(
        (
            proptest::option::of(-2..1002i32),
            -2..1002i32,
            proptest::option::of(-2..1002i32),
        )
            .prop_map(
                |(min_replicas, max_replicas, target)| v1beta1::AutoscalingSpec {
                    min_replicas,
                    max_replicas,
                    target_cpu_utilization_percentage: target,
                },
            ),
    )
}

/// Any `config` list, valid or not (neither or both objects named, odd paths).
fn arb_config() -> impl Strategy<Value = Vec<v1beta1::ConfigSource>> {
    proptest::collection::vec(
        (
            proptest::option::of("[a-z][a-z0-9.-]{0,12}"),
            proptest::option::of("[a-z][a-z0-9.-]{0,12}"),
            proptest::option::of("[/a-z.]{0,16}"),
        )
            .prop_map(|(config_map, secret, mount_path)| v1beta1::ConfigSource {
                config_map,
                secret,
                mount_path,
            }),
        0..4,
    )
}

fn arb_pod_security() -> impl Strategy<Value = Option<v1beta1::PodSecurity>> {
    let id = || proptest::option::of(prop_oneof![0..70000i64, any::<i64>()]);
    proptest::option::of(
        (
            proptest::option::of(prop_oneof![
                Just(v1beta1::SecurityProfile::Restricted),
                Just(v1beta1::SecurityProfile::Baseline),
            ]),
            id(),
            id(),
            id(),
            proptest::option::of(any::<bool>()),
        )
            .prop_map(
                |(profile, run_as_user, run_as_group, fs_group, read_only_root_filesystem)| {
                    v1beta1::PodSecurity {
                        profile,
                        run_as_user,
                        run_as_group,
                        fs_group,
                        read_only_root_filesystem,
                    }
                },
            ),
    )
}

/// Any v1alpha1 object that carries no conversion annotation (valid or not).
fn arb_alpha_plain() -> impl Strategy<Value = v1alpha1::AppService> {
    (
        arb_meta(),
        (
            "[a-z./:0-9-]{1,24}",
            proptest::option::of(-2..1002i32),
            proptest::option::of(prop_oneof![1..=65535i32, any::<i32>()]),
            arb_env(),
            arb_resources(),
            proptest::option::of((any::<bool>(), proptest::option::of("[a-z][a-z0-9.-]{0,12}"))),
        ),
        arb_status(),
    )
        .prop_map(
            |(metadata, (image, replicas, port, env, resources, database), status)| {
                v1alpha1::AppService {
                    metadata,
                    spec: v1alpha1::AppServiceSpec {
                        image,
                        replicas,
                        port,
                        env,
                        resources,
                        database: database
                            .map(|(enabled, class)| v1alpha1::DatabaseSpec { enabled, class }),
                    },
                    status,
                }
            },
        )
}

/// Any v1beta1 object that carries no conversion annotation (valid or not).
fn arb_beta_plain() -> impl Strategy<Value = v1beta1::AppService> {
    (
        arb_meta(),
        (
            "[a-z./:0-9-]{1,24}",
            proptest::option::of(-2..1002i32),
            arb_ports(),
            (
                arb_pod_security(),
                arb_rollout(),
                arb_canary(),
                arb_config(),
                arb_autoscaling(),
                arb_expose(),
            )
                // Boxed: the strategy's value tree is otherwise large enough to overflow
                // a test thread's stack in debug builds.
                .boxed(),
            arb_env(),
            arb_resources(),
            proptest::option::of("[a-z][a-z0-9.-]{0,12}"),
        ),
        arb_status(),
    )
        .prop_map(
            |(
                metadata,
                (
                    image,
                    replicas,
                    ports,
                    (pod_security, rollout, canary, config, autoscaling, expose),
                    env,
                    resources,
                    database,
                ),
                status,
            )| {
                v1beta1::AppService {
                    metadata,
                    spec: v1beta1::AppServiceSpec {
                        image,
                        replicas,
                        ports,
                        pod_security,
                        rollout,
                        canary,
                        config,
                        autoscaling,
                        expose,
                        env,
                        resources,
                        database: database.map(|class| v1beta1::DatabaseSpec { class }),
                    },
                    status,
                }
            },
        )
}

/// v1alpha1 objects as clients have them: written in v1alpha1, or read from a v1beta1
/// object (then with the ports annotation when needed).
fn arb_alpha() -> impl Strategy<Value = v1alpha1::AppService> {
    prop_oneof![
        arb_alpha_plain(),
        arb_beta_plain().prop_map(|b| to_v1alpha1(&b)),
    ]
}

/// v1beta1 objects as they are stored: written in v1beta1, or converted from v1alpha1
/// (then with the database annotation when needed).
fn arb_beta() -> impl Strategy<Value = v1beta1::AppService> {
    prop_oneof![
        arb_beta_plain(),
        arb_alpha_plain().prop_map(|a| to_v1beta1(&a)),
    ]
}

fn annotation(meta: &ObjectMeta, key: &str) -> Option<String> {
    meta.annotations.as_ref().and_then(|a| a.get(key).cloned())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn v1alpha1_to_v1beta1_and_back_is_the_identity(alpha in arb_alpha()) {
        let beta = to_v1beta1(&alpha);
        prop_assert_eq!(annotation(&beta.metadata, ANNOTATION_V1BETA1_PORTS), None);
        prop_assert_eq!(annotation(&beta.metadata, ANNOTATION_V1BETA1_POD_SECURITY), None);
        prop_assert_eq!(annotation(&beta.metadata, ANNOTATION_V1BETA1_ROLLOUT), None);
        prop_assert_eq!(annotation(&beta.metadata, ANNOTATION_V1BETA1_CANARY), None);
        prop_assert_eq!(to_v1alpha1(&beta), alpha);
    }

    #[test]
    fn v1beta1_to_v1alpha1_and_back_is_the_identity(beta in arb_beta()) {
        let alpha = to_v1alpha1(&beta);
        prop_assert_eq!(annotation(&alpha.metadata, ANNOTATION_V1ALPHA1_DATABASE), None);
        prop_assert_eq!(alpha.spec.port, beta.spec.ports.first().map(|p| p.port));
        prop_assert_eq!(to_v1beta1(&alpha), beta);
    }

    #[test]
    fn a_v1alpha1_read_edit_write_keeps_what_it_did_not_edit(
        beta in arb_beta(),
        port in 1..=65535i32,
        image in "[a-z]{1,8}:v[0-9]",
        replicas in proptest::option::of(0..1000i32),
        env in arb_env(),
    ) {
        let mut alpha = to_v1alpha1(&beta);
        alpha.spec.port = Some(port);
        alpha.spec.image = image.clone();
        alpha.spec.replicas = replicas;
        alpha.spec.env = env.clone();
        let written = to_v1beta1(&alpha);

        let mut expected = beta.clone();
        if expected.spec.ports.is_empty() {
            expected.spec.ports = vec![v1beta1::AppPort::http(port)];
        } else {
            expected.spec.ports[0].port = port;
        }
        expected.spec.image = image;
        expected.spec.replicas = replicas;
        expected.spec.env = env;
        prop_assert_eq!(written, expected);
    }

    #[test]
    fn the_webhooks_json_conversion_agrees_with_the_typed_one(beta in arb_beta()) {
        let json = serde_json::to_value(&beta).unwrap_or_default();
        let alpha_json = convert_object(&json, Version::V1alpha1);
        prop_assert_eq!(
            alpha_json.clone().ok(),
            serde_json::to_value(to_v1alpha1(&beta)).ok()
        );
        let back = convert_object(&alpha_json.unwrap_or_default(), Version::V1beta1);
        prop_assert_eq!(back.ok(), Some(json));
    }

    #[test]
    fn both_versions_accept_the_same_objects(alpha in arb_alpha(), beta in arb_beta()) {
        let via_hub = validate(&to_v1beta1(&alpha), None);
        let direct = validate_v1alpha1(&alpha, None);
        prop_assert_eq!(via_hub.is_ok(), direct.is_ok());
        prop_assert_eq!(
            via_hub.err().map(|e| e.len()),
            direct.err().map(|e| e.len())
        );

        let hub = validate(&beta, None);
        let as_alpha = validate_v1alpha1(&to_v1alpha1(&beta), None);
        prop_assert_eq!(hub.is_ok(), as_alpha.is_ok(), "{:?} / {:?}", hub, as_alpha);
    }

    #[test]
    fn update_rules_agree_across_versions(old in arb_beta(), new in arb_beta()) {
        let hub = validate(&new, Some(&old)).is_ok();
        let alpha = validate_v1alpha1(&to_v1alpha1(&new), Some(&to_v1alpha1(&old))).is_ok();
        prop_assert_eq!(hub, alpha);
    }

    #[test]
    fn both_versions_default_to_the_same_meaning(alpha in arb_alpha()) {
        let mut defaulted = alpha.clone();
        default_v1alpha1_spec(&mut defaulted.spec);
        let mut a = to_v1beta1(&defaulted).spec;
        default_spec(&mut a);
        let mut b = to_v1beta1(&alpha).spec;
        default_spec(&mut b);
        prop_assert_eq!(a, b);
    }
}
