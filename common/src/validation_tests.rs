//! Every validation rule, accepted and rejected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, EnvVarSource, ResourceClaim, ResourceRequirements, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use pretty_assertions::assert_eq;

use super::*;
// These tests write v1alpha1 objects, the shape most rules were first written for: they
// pin down that a v1alpha1 object is judged exactly as before the hub moved to v1beta1.
// The v1beta1-only rules (ports) are tested at the end on the hub itself.
use super::{validate_v1alpha1 as validate, validate_v1alpha1_report as validate_report};
use crate::types::EnvVar;
use crate::v1alpha1::{AppService, AppServiceSpec, DatabaseSpec};

fn app(spec: AppServiceSpec) -> AppService {
    AppService::new("checkout", spec)
}

fn spec(image: &str) -> AppServiceSpec {
    AppServiceSpec {
        image: image.into(),
        ..Default::default()
    }
}

fn errors_of(app: &AppService) -> Vec<String> {
    match validate(app, None) {
        Ok(_) => vec![],
        Err(errs) => errs.iter().map(ToString::to_string).collect(),
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn quantities(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
            .collect(),
    )
}

#[test]
fn valid_full_spec_passes_without_warnings() {
    let obj = app(AppServiceSpec {
        image: "registry.example.com/checkout:v3.4.0".into(),
        replicas: Some(4),
        port: Some(8080),
        env: vec![env("LOG_LEVEL", "info"), env("_PRIVATE2", "x")],
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "100m"), ("memory", "128Mi")]),
            limits: quantities(&[("cpu", "1"), ("memory", "128Mi")]),
            ..Default::default()
        }),
        database: Some(DatabaseSpec {
            enabled: true,
            class: Some("production-postgresql".into()),
        }),
    });
    assert_eq!(validate(&obj, None), Ok(vec![]));
}

#[test]
fn minimal_spec_passes() {
    assert_eq!(validate(&app(spec("nginx:1.27")), None), Ok(vec![]));
}

#[test]
fn port_out_of_range_has_kubernetes_message() {
    let obj = app(AppServiceSpec {
        port: Some(70000),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec!["spec.port: Invalid value: 70000: must be between 1 and 65535"]
    );
    let zero = app(AppServiceSpec {
        port: Some(0),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&zero),
        vec!["spec.port: Invalid value: 0: must be between 1 and 65535"]
    );
    for ok in [1, 80, 65535] {
        assert_eq!(
            errors_of(&app(AppServiceSpec {
                port: Some(ok),
                ..spec("nginx:1.27")
            })),
            Vec::<String>::new()
        );
    }
}

#[test]
fn replicas_bounds() {
    for bad in [-1, 1001, i32::MIN, i32::MAX] {
        let obj = app(AppServiceSpec {
            replicas: Some(bad),
            ..spec("nginx:1.27")
        });
        assert_eq!(
            errors_of(&obj),
            vec![format!(
                "spec.replicas: Invalid value: {bad}: must be between 0 and 1000"
            )]
        );
    }
    for ok in [0, 1, 1000] {
        let obj = app(AppServiceSpec {
            replicas: Some(ok),
            ..spec("nginx:1.27")
        });
        assert!(validate(&obj, None).is_ok(), "{ok} replicas must be valid");
    }
}

#[test]
fn image_required() {
    assert_eq!(
        errors_of(&app(spec(""))),
        vec![
            "spec.image: Required value: an OCI image reference such as registry.example.com/app:v1.2.3"
        ]
    );
}

#[test]
fn image_must_parse() {
    for bad in [
        "Nginx:1.0",
        "nginx:",
        "nginx@sha256:abc",
        "registry.example.com/app:bad tag",
        "::",
        " nginx:1.0",
    ] {
        let errs = errors_of(&app(spec(bad)));
        assert_eq!(errs.len(), 1, "{bad:?} must be rejected once: {errs:?}");
        assert!(
            errs[0].starts_with(&format!("spec.image: Invalid value: {bad:?}")),
            "{errs:?}"
        );
    }
}

#[test]
fn image_too_long() {
    let long = format!("registry.example.com/{}:v1", "a".repeat(600));
    assert_eq!(
        errors_of(&app(spec(&long))),
        vec!["spec.image: Too long: may not be more than 512 bytes"]
    );
}

#[test]
fn image_forms_accepted() {
    let digest = format!("registry.example.com/app@sha256:{}", "a".repeat(64));
    for ok in [
        "nginx:1.27",
        "library/nginx:1.27",
        "registry.example.com:5000/team/app:v1.2.3",
        "localhost/app:dev",
        digest.as_str(),
    ] {
        assert_eq!(validate(&app(spec(ok)), None), Ok(vec![]), "{ok}");
    }
}

#[test]
fn an_upper_case_digest_is_refused_as_the_runtime_refuses_it() {
    let upper = format!("registry.example.com/app@sha256:{}", "AB".repeat(32));
    assert_eq!(
        errors_of(&app(spec(&upper))),
        vec![format!(
            "spec.image: Invalid value: {upper:?}: not a valid image reference: invalid checksum digest format"
        )]
    );
}

#[test]
fn warns_on_a_tag_beside_a_digest() {
    let sha = "b".repeat(64);
    let image = format!("registry.example.com/app:v1@sha256:{sha}");
    assert_eq!(
        validate(&app(spec(&image)), None),
        Ok(vec![format!(
            "spec.image names both tag \"v1\" and digest sha256:{sha}: the digest runs and the tag is ignored; write one of them"
        )])
    );
}

#[test]
fn warns_on_missing_or_latest_tag() {
    let none = validate(&app(spec("registry.example.com/checkout")), None).unwrap_or_default();
    assert_eq!(none.len(), 1);
    assert!(none[0].contains("has no tag"), "{none:?}");

    // A registry port is not a tag.
    let port_only =
        validate(&app(spec("registry.example.com:5000/checkout")), None).unwrap_or_default();
    assert_eq!(port_only.len(), 1);
    assert!(port_only[0].contains("has no tag"), "{port_only:?}");

    let latest = validate(&app(spec("nginx:latest")), None).unwrap_or_default();
    assert_eq!(latest.len(), 1);
    assert!(latest[0].contains(":latest"), "{latest:?}");

    // A digest pins what runs, `latest` or not; the tag beside it is what is warned of.
    let pinned_latest = format!("nginx:latest@sha256:{}", "c".repeat(64));
    let pinned = validate(&app(spec(&pinned_latest)), None).unwrap_or_default();
    assert_eq!(pinned.len(), 1);
    assert!(pinned[0].contains("names both tag"), "{pinned:?}");
}

#[test]
fn warnings_survive_alongside_errors() {
    let obj = app(AppServiceSpec {
        port: Some(0),
        ..spec("nginx")
    });
    let report = validate_report(&obj, None);
    assert_eq!(report.errors.len(), 1);
    assert_eq!(report.warnings.len(), 1);
}

#[test]
fn env_names_must_be_c_identifiers() {
    for bad in ["1ABC", "A-B", "A.B", "Ä", "A B"] {
        let obj = app(AppServiceSpec {
            env: vec![env(bad, "x")],
            ..spec("nginx:1.27")
        });
        let errs = errors_of(&obj);
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert!(
            errs[0].starts_with(&format!(
                "spec.env[0].name: Invalid value: {bad:?}: a valid environment variable name"
            )),
            "{errs:?}"
        );
    }
    let ok = app(AppServiceSpec {
        env: vec![env("A", ""), env("_b9", "x"), env("LOG_LEVEL", "info")],
        ..spec("nginx:1.27")
    });
    assert_eq!(errors_of(&ok), Vec::<String>::new());
}

#[test]
fn env_name_required_and_bounded() {
    let obj = app(AppServiceSpec {
        env: vec![env("", "x"), env(&"A".repeat(257), "x")],
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![
            "spec.env[0].name: Required value".to_owned(),
            "spec.env[1].name: Too long: may not be more than 256 bytes".to_owned(),
        ]
    );
}

#[test]
fn env_names_unique() {
    let obj = app(AppServiceSpec {
        env: vec![env("A", "1"), env("B", "2"), env("A", "3")],
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![r#"spec.env[2].name: Duplicate value: "A""#]
    );
}

#[test]
fn env_count_and_value_length_bounded() {
    let many: Vec<EnvVar> = (0..129).map(|i| env(&format!("V{i}"), "x")).collect();
    let obj = app(AppServiceSpec {
        env: many,
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec!["spec.env: Too many: 129: must have at most 128 items"]
    );

    let big = app(AppServiceSpec {
        env: vec![env("BIG", &"x".repeat(32 * 1024 + 1))],
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&big),
        vec!["spec.env[0].value: Too long: may not be more than 32768 bytes"]
    );
    let edge = app(AppServiceSpec {
        env: vec![env("BIG", &"x".repeat(32 * 1024))],
        ..spec("nginx:1.27")
    });
    assert_eq!(errors_of(&edge), Vec::<String>::new());
}

#[test]
fn env_value_from_rules() {
    let secret = EnvVarSource {
        secret_key_ref: Some(SecretKeySelector {
            name: "s".into(),
            key: "k".into(),
            optional: None,
        }),
        ..Default::default()
    };
    let both = EnvVar {
        name: "A".into(),
        value: Some("v".into()),
        value_from: Some(secret.clone()),
    };
    let none = EnvVar {
        name: "B".into(),
        value: None,
        value_from: Some(EnvVarSource::default()),
    };
    let two = EnvVar {
        name: "C".into(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: "c".into(),
                key: "k".into(),
                optional: None,
            }),
            ..secret.clone()
        }),
    };
    let ok = EnvVar {
        name: "D".into(),
        value: None,
        value_from: Some(secret),
    };
    let obj = app(AppServiceSpec {
        env: vec![both, none, two, ok],
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![
            r#"spec.env[0].valueFrom: Invalid value: "": may not be specified when `value` is not empty"#.to_owned(),
            r#"spec.env[1].valueFrom: Invalid value: "": must specify one of: `configMapKeyRef`, `fieldRef`, `fileKeyRef`, `resourceFieldRef` or `secretKeyRef`"#.to_owned(),
            r#"spec.env[2].valueFrom: Invalid value: "": may not have more than one field specified at a time"#.to_owned(),
        ]
    );
}

#[test]
fn database_url_reserved_only_when_database_enabled() {
    let with_db = |enabled| {
        app(AppServiceSpec {
            env: vec![env("DATABASE_URL", "postgres://elsewhere")],
            database: Some(DatabaseSpec {
                enabled,
                class: Some("pg".into()),
            }),
            ..spec("nginx:1.27")
        })
    };
    assert_eq!(
        errors_of(&with_db(true)),
        vec![
            "spec.env[0].name: Forbidden: DATABASE_URL is set by the operator when a database is requested"
        ]
    );
    assert_eq!(errors_of(&with_db(false)), Vec::<String>::new());
}

#[test]
fn resources_quantities_must_parse_and_requests_fit_limits() {
    let obj = app(AppServiceSpec {
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "2"), ("memory", "lots")]),
            limits: quantities(&[("cpu", "1"), ("memory", "-1Gi")]),
            ..Default::default()
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![
            r#"spec.resources.requests[memory]: Invalid value: "lots": must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"#.to_owned(),
            r#"spec.resources.limits[memory]: Invalid value: "-1Gi": must be greater than or equal to 0"#.to_owned(),
            r#"spec.resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1"#.to_owned(),
        ]
    );
    // Equal, and in different units, is fine.
    let ok = app(AppServiceSpec {
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "500m"), ("memory", "1Gi")]),
            limits: quantities(&[("cpu", "0.5"), ("memory", "1024Mi")]),
            ..Default::default()
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(errors_of(&ok), Vec::<String>::new());
}

/// A request far beyond Kubernetes' cap, compared with a limit in a small unit, made the
/// comparison overflow and panic (found by `validation_never_panics`); it is refused.
#[test]
fn quantities_beyond_the_kubernetes_cap_are_refused() {
    let obj = app(AppServiceSpec {
        resources: Some(ResourceRequirements {
            requests: quantities(&[("cpu", "99999999999999999999999999k")]),
            limits: quantities(&[("cpu", "1m")]),
            ..Default::default()
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![
            r#"spec.resources.requests[cpu]: Invalid value: "99999999999999999999999999k": must be at most 2^63-1 (9223372036854775807) in magnitude"#.to_owned(),
        ]
    );
}

#[test]
fn resource_claims_forbidden() {
    let obj = app(AppServiceSpec {
        resources: Some(ResourceRequirements {
            claims: Some(vec![ResourceClaim {
                name: "gpu".into(),
                request: None,
            }]),
            ..Default::default()
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec!["spec.resources.claims: Forbidden: resource claims are not supported by AppService"]
    );
}

#[test]
fn database_class_required_when_enabled() {
    for class in [None, Some(String::new())] {
        let obj = app(AppServiceSpec {
            database: Some(DatabaseSpec {
                enabled: true,
                class,
            }),
            ..spec("nginx:1.27")
        });
        assert_eq!(
            errors_of(&obj),
            vec!["spec.database.class: Required value: required when a database is requested"]
        );
    }
    let disabled = app(AppServiceSpec {
        database: Some(DatabaseSpec {
            enabled: false,
            class: None,
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(errors_of(&disabled), Vec::<String>::new());
}

#[test]
fn database_class_must_be_a_dns_subdomain() {
    let obj = app(AppServiceSpec {
        database: Some(DatabaseSpec {
            enabled: true,
            class: Some("Prod_PG".into()),
        }),
        ..spec("nginx:1.27")
    });
    assert_eq!(
        errors_of(&obj),
        vec![
            r#"spec.database.class: Invalid value: "Prod_PG": must be a lowercase RFC 1123 subdomain (e.g. 'production-postgresql')"#
        ]
    );
}

#[test]
fn name_must_be_a_dns1035_label() {
    for bad in ["My-App", "1app", "app.v2", "app-", &"a".repeat(64)] {
        let mut obj = app(spec("nginx:1.27"));
        obj.metadata.name = Some(bad.to_owned());
        let errs = errors_of(&obj);
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert!(
            errs[0].starts_with(&format!("metadata.name: Invalid value: {bad:?}")),
            "{errs:?}"
        );
    }
    for ok in ["a", "checkout", "checkout-v2", &"a".repeat(63)] {
        let mut obj = app(spec("nginx:1.27"));
        obj.metadata.name = Some(ok.to_owned());
        assert!(validate(&obj, None).is_ok(), "{ok}");
    }
}

#[test]
fn generate_name_without_name_is_accepted() {
    let mut obj = app(spec("nginx:1.27"));
    obj.metadata.name = None;
    obj.metadata.generate_name = Some("checkout-".into());
    assert!(validate(&obj, None).is_ok());
    obj.metadata.generate_name = None;
    assert_eq!(
        errors_of(&obj),
        vec!["metadata.name: Required value: name or generateName is required"]
    );
}

#[test]
fn all_errors_reported_at_once() {
    let obj = app(AppServiceSpec {
        image: String::new(),
        replicas: Some(-1),
        port: Some(70000),
        env: vec![env("1X", "a")],
        resources: None,
        database: Some(DatabaseSpec {
            enabled: true,
            class: None,
        }),
    });
    let errs = validate(&obj, None).err().unwrap_or_default();
    let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        vec![
            "spec.image",
            "spec.replicas",
            "spec.port",
            "spec.env[0].name",
            "spec.database.class"
        ]
    );
    let text = errs.to_string();
    assert!(text.starts_with("[spec.image: Required value"), "{text}");
    assert!(
        text.contains(", spec.port: Invalid value: 70000: must be between 1 and 65535,"),
        "{text}"
    );
}

#[test]
fn body_is_the_message_without_the_field() {
    let obj = app(AppServiceSpec {
        port: Some(70000),
        env: vec![env("", "x")],
        ..spec("nginx:1.27")
    });
    let errs = validate(&obj, None).err().unwrap_or_default();
    let bodies: Vec<String> = errs.iter().map(FieldError::body).collect();
    assert_eq!(
        bodies,
        vec![
            "Invalid value: 70000: must be between 1 and 65535",
            "Required value"
        ]
    );
}

#[test]
fn reasons_match_kubernetes_status_causes() {
    assert_eq!(ErrorType::Required.reason(), "FieldValueRequired");
    assert_eq!(ErrorType::Invalid.reason(), "FieldValueInvalid");
    assert_eq!(ErrorType::Duplicate.reason(), "FieldValueDuplicate");
    assert_eq!(ErrorType::Forbidden.reason(), "FieldValueForbidden");
    assert_eq!(ErrorType::TooLong.reason(), "FieldValueTooLong");
    assert_eq!(ErrorType::TooMany.reason(), "FieldValueTooMany");
}

fn with_db(class: Option<&str>, enabled: bool) -> AppService {
    app(AppServiceSpec {
        database: Some(DatabaseSpec {
            enabled,
            class: class.map(str::to_owned),
        }),
        ..spec("nginx:1.27")
    })
}

#[test]
fn database_class_immutable_while_enabled() {
    let old = with_db(Some("pg-a"), true);
    let changed = with_db(Some("pg-b"), true);
    assert_eq!(
        validate(&changed, Some(&old)).err().map(|e| e.to_string()),
        Some(r#"spec.database.class: Invalid value: "pg-b": field is immutable while the database is enabled"#.to_owned())
    );
    assert!(
        validate(&with_db(Some("pg-a"), true), Some(&old)).is_ok(),
        "unchanged class"
    );
}

#[test]
fn database_class_may_change_when_not_enabled_before_or_after() {
    // Enabling for the first time, or disabling, is not a change of an enabled class.
    assert!(
        validate(
            &with_db(Some("pg-b"), true),
            Some(&with_db(Some("pg-a"), false))
        )
        .is_ok()
    );
    assert!(
        validate(
            &with_db(Some("pg-b"), false),
            Some(&with_db(Some("pg-a"), true))
        )
        .is_ok()
    );
    assert!(validate(&with_db(Some("pg-b"), true), Some(&app(spec("nginx:1.27")))).is_ok());
}

#[test]
fn update_rules_ignore_other_changes() {
    let old = app(AppServiceSpec {
        replicas: Some(1),
        ..spec("nginx:1.26")
    });
    let new = app(AppServiceSpec {
        replicas: Some(5),
        port: Some(9090),
        ..spec("nginx:1.27")
    });
    assert!(validate(&new, Some(&old)).is_ok());
}

#[test]
fn long_values_are_truncated_in_messages() {
    let name = format!("{}!", "A".repeat(200));
    let obj = app(AppServiceSpec {
        env: vec![env(&name, "x")],
        ..spec("nginx:1.27")
    });
    let errs = errors_of(&obj);
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("...(truncated, 201 bytes)"), "{errs:?}");
    assert!(errs[0].len() < 500, "{}", errs[0].len());
}

#[test]
fn identifier_helpers() {
    assert!(is_c_identifier("_"));
    assert!(!is_c_identifier(""));
    assert!(is_dns1123_subdomain("a.b-c.d"));
    assert!(!is_dns1123_subdomain("a..b"));
    assert!(!is_dns1123_subdomain(""));
    assert!(!is_dns1035_label(""));
}

mod v1beta1_ports {
    use super::super::{validate, validate_report as validate_hub_report};
    use crate::types::{AppPort, AppService, AppServiceSpec, Protocol};

    fn port(name: &str, port: i32, protocol: Option<Protocol>) -> AppPort {
        AppPort {
            name: name.into(),
            port,
            protocol,
        }
    }

    fn errors(ports: Vec<AppPort>) -> Vec<String> {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "nginx:1.27".into(),
                ports,
                ..Default::default()
            },
        );
        validate_hub_report(&app, None)
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn several_ports_names_and_protocols() {
        assert_eq!(
            errors(vec![
                port("http", 8080, None),
                port("metrics", 9090, Some(Protocol::Tcp)),
                port("dns", 8080, Some(Protocol::Udp)),
            ]),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(vec![]),
            Vec::<String>::new(),
            "empty means the default"
        );
        assert_eq!(
            errors(vec![
                port("http", 0, None),
                port("http", 80, None),
                port("-bad", 80, Some(Protocol::Tcp)),
                port("12345", 81, None),
                port("a-very-long-port-name", 82, None),
                port("", 83, None),
            ]),
            vec![
                "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535",
                "spec.ports[1].name: Duplicate value: \"http\"",
                "spec.ports[2].name: Invalid value: \"-bad\": must be an IANA service name: lowercase letters, digits and '-', at least one letter, no '--', not starting or ending with '-'",
                "spec.ports[2].port: Duplicate value: 80: port 80 is already used with protocol TCP",
                "spec.ports[3].name: Invalid value: \"12345\": must be an IANA service name: lowercase letters, digits and '-', at least one letter, no '--', not starting or ending with '-'",
                "spec.ports[4].name: Too long: may not be more than 15 bytes",
                "spec.ports[5].name: Required value",
            ]
        );
        let many: Vec<AppPort> = (0..17)
            .map(|i| port(&format!("p{i}"), 1000 + i, None))
            .collect();
        assert_eq!(
            errors(many),
            vec!["spec.ports: Too many: 17: must have at most 16 items"]
        );
    }

    #[test]
    fn v1alpha1_port_errors_name_spec_port() {
        let app = crate::v1alpha1::AppService::new(
            "checkout",
            crate::v1alpha1::AppServiceSpec {
                image: "nginx:1.27".into(),
                port: Some(70000),
                ..Default::default()
            },
        );
        let errors = super::validate_report(&app, None).errors.to_string();
        assert_eq!(
            errors,
            "spec.port: Invalid value: 70000: must be between 1 and 65535"
        );
        // The same object in v1beta1 names the list entry.
        let hub = crate::conversion::to_v1beta1(&app);
        assert_eq!(
            validate(&hub, None)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
            "spec.ports[0].port: Invalid value: 70000: must be between 1 and 65535"
        );
    }
}

/// `podSecurity` exists only in v1beta1: tested on the hub.
mod v1beta1_pod_security {
    use crate::types::{AppService, AppServiceSpec, MAX_ID, PodSecurity, SecurityProfile};
    use crate::validation::validate;
    use pretty_assertions::assert_eq;

    fn errors(security: PodSecurity) -> Vec<String> {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "nginx:1.27".into(),
                pod_security: Some(security),
                ..Default::default()
            },
        );
        match validate(&app, None) {
            Ok(_) => vec![],
            Err(errs) => errs.iter().map(ToString::to_string).collect(),
        }
    }

    fn ids(profile: Option<SecurityProfile>, uid: i64, gid: i64, fs: i64) -> PodSecurity {
        PodSecurity {
            profile,
            run_as_user: Some(uid),
            run_as_group: Some(gid),
            fs_group: Some(fs),
            read_only_root_filesystem: Some(true),
        }
    }

    #[test]
    fn ids_at_their_bounds_pass() {
        assert_eq!(errors(PodSecurity::default()), Vec::<String>::new());
        assert_eq!(errors(ids(None, 1, 0, 0)), Vec::<String>::new());
        assert_eq!(
            errors(ids(
                Some(SecurityProfile::Restricted),
                MAX_ID,
                MAX_ID,
                MAX_ID
            )),
            Vec::<String>::new()
        );
        assert_eq!(
            errors(ids(Some(SecurityProfile::Baseline), 0, 0, 0)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn ids_out_of_range_and_root_under_restricted_are_refused() {
        assert_eq!(
            errors(ids(Some(SecurityProfile::Baseline), -1, MAX_ID + 1, -5)),
            vec![
                "spec.podSecurity.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
                "spec.podSecurity.runAsGroup: Invalid value: 2147483648: must be between 0 and 2147483647, inclusive",
                "spec.podSecurity.fsGroup: Invalid value: -5: must be between 0 and 2147483647, inclusive",
            ]
        );
        // Root needs the Baseline profile, whether Restricted is written or defaulted.
        for profile in [None, Some(SecurityProfile::Restricted)] {
            assert_eq!(
                errors(ids(profile, 0, 1000, 1000)),
                vec![
                    "spec.podSecurity.runAsUser: Invalid value: 0: runAsUser 0 is root, which the Restricted profile forbids; use profile Baseline for an image that must run as root"
                ]
            );
        }
    }
}

#[test]
fn resource_lists_are_bounded_by_validate_not_only_by_the_webhook() {
    let mut spec = crate::AppServiceSpec {
        image: "registry.example.com/web:v1".into(),
        ..Default::default()
    };
    let many: std::collections::BTreeMap<
        String,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    > = (0..=crate::types::MAX_RESOURCE_ENTRIES)
        .map(|i| {
            (
                format!("example.com/r{i}"),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
            )
        })
        .collect();
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        limits: Some(many.clone()),
        ..Default::default()
    });
    let app = crate::AppService::new("web", spec.clone());
    let errors = crate::validation::validate(&app, None)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("spec.resources.limits"), "{errors}");
    assert!(errors.contains("32"), "{errors}");
    // At the bound: accepted.
    let at: std::collections::BTreeMap<_, _> = many
        .into_iter()
        .take(crate::types::MAX_RESOURCE_ENTRIES)
        .collect();
    spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(at),
        ..Default::default()
    });
    let app = crate::AppService::new("web", spec);
    assert!(crate::validation::validate(&app, None).is_ok());
}

/// `rollout` exists only in v1beta1: tested on the hub.
mod v1beta1_rollout {
    use crate::types::{AppService, AppServiceSpec, RolloutSpec};
    use crate::validation::validate;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use pretty_assertions::assert_eq;

    fn int(n: i32) -> Option<IntOrString> {
        Some(IntOrString::Int(n))
    }

    fn pct(s: &str) -> Option<IntOrString> {
        Some(IntOrString::String(s.into()))
    }

    fn errors(max_surge: Option<IntOrString>, max_unavailable: Option<IntOrString>) -> Vec<String> {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "nginx:1.27".into(),
                rollout: Some(RolloutSpec {
                    max_surge,
                    max_unavailable,
                }),
                ..Default::default()
            },
        );
        match validate(&app, None) {
            Ok(_) => vec![],
            Err(errs) => errs.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn numbers_and_percentages_at_their_bounds_pass() {
        let none = Vec::<String>::new();
        assert_eq!(errors(None, None), none);
        assert_eq!(errors(int(0), int(1)), none);
        assert_eq!(errors(int(1), int(0)), none);
        assert_eq!(errors(pct("100%"), pct("0%")), none);
        assert_eq!(errors(pct("0%"), pct("100%")), none);
        assert_eq!(errors(int(i32::MAX), pct("007%")), none);
        // One zero alone is fine: the other is defaulted to 25%.
        assert_eq!(errors(int(0), None), none);
        assert_eq!(errors(None, pct("0%")), none);
    }

    #[test]
    fn negative_past_100_percent_malformed_and_both_zero_are_refused() {
        assert_eq!(
            errors(int(-1), pct("101%")),
            vec![
                "spec.rollout.maxSurge: Invalid value: -1: must be greater than or equal to 0",
                "spec.rollout.maxUnavailable: Invalid value: \"101%\": must not be greater than 100%",
            ]
        );
        assert_eq!(
            errors(pct("5"), pct("x%")),
            vec![
                "spec.rollout.maxSurge: Invalid value: \"5\": a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                "spec.rollout.maxUnavailable: Invalid value: \"x%\": a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
            ]
        );
        assert_eq!(
            errors(pct("99999999999%"), None),
            vec![
                "spec.rollout.maxSurge: Invalid value: \"99999999999%\": must not be greater than 100%"
            ]
        );
        for (surge, unavailable) in [(int(0), int(0)), (pct("0%"), int(0)), (int(0), pct("00%"))] {
            let value = match &unavailable {
                Some(IntOrString::String(s)) => format!("{s:?}"),
                _ => "0".to_owned(),
            };
            assert_eq!(
                errors(surge, unavailable),
                vec![format!(
                    "spec.rollout.maxUnavailable: Invalid value: {value}: may not be 0 when `maxSurge` is 0"
                )]
            );
        }
    }
}

/// `canary` exists only in v1beta1: tested on the hub.
mod v1beta1_canary {
    use crate::types::{AppService, AppServiceSpec, CanarySpec};
    use crate::validation::validate_report;
    use pretty_assertions::assert_eq;

    fn report(
        replicas: Option<i32>,
        image: &str,
        canary: Option<i32>,
    ) -> (Vec<String>, Vec<String>) {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "registry.example.com/checkout:v1".into(),
                replicas,
                canary: Some(CanarySpec {
                    image: image.into(),
                    replicas: canary,
                }),
                ..Default::default()
            },
        );
        let report = validate_report(&app, None);
        (
            report.errors.iter().map(ToString::to_string).collect(),
            report.warnings.iter().map(ToString::to_string).collect(),
        )
    }

    #[test]
    fn canary_replicas_from_one_to_replicas() {
        let none = (Vec::<String>::new(), Vec::<String>::new());
        let image = "registry.example.com/checkout:v2";
        assert_eq!(report(Some(4), image, Some(1)), none);
        assert_eq!(report(Some(4), image, Some(4)), none);
        // Both defaulted: one of one.
        assert_eq!(report(None, image, None), none);
        assert_eq!(
            report(Some(4), image, Some(0)).0,
            [
                "spec.canary.replicas: Invalid value: 0: must be at least 1: remove spec.canary to run no canary"
            ]
        );
        assert_eq!(
            report(Some(4), image, Some(5)).0,
            [
                "spec.canary.replicas: Invalid value: 5: must not be greater than spec.replicas (4): the canary's Pods are some of the AppService's"
            ]
        );
        // Scaling below the canary (kubectl scale, an HPA) is refused the same way.
        assert_eq!(
            report(Some(0), image, None).0,
            [
                "spec.canary.replicas: Invalid value: 1: must not be greater than spec.replicas (0): the canary's Pods are some of the AppService's"
            ]
        );
    }

    #[test]
    fn the_canary_image_has_the_rules_of_spec_image() {
        assert_eq!(
            report(Some(2), "", None).0,
            [
                "spec.canary.image: Required value: an OCI image reference such as registry.example.com/app:v1.2.3"
            ]
        );
        let (errors, _) = report(Some(2), "Nginx:1.0", None);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with(
                "spec.canary.image: Invalid value: \"Nginx:1.0\": not a valid image reference"
            ),
            "{errors:?}"
        );
        assert_eq!(
            report(Some(2), &"a".repeat(513), None).0,
            ["spec.canary.image: Too long: may not be more than 512 bytes"]
        );
        assert_eq!(
            report(Some(2), " nginx:1.27", None).0,
            [
                "spec.canary.image: Invalid value: \" nginx:1.27\": must not contain leading or trailing whitespace"
            ]
        );
        assert_eq!(
            report(Some(2), "nginx:latest", None),
            (
                vec![],
                vec!["spec.canary.image: \"nginx:latest\" uses the mutable :latest tag; pin a version tag or a digest so rollouts are reproducible".to_owned()]
            )
        );
        assert_eq!(
            report(Some(2), "nginx", None).1,
            [
                "spec.canary.image: \"nginx\" has no tag and resolves to :latest; pin a version tag or a digest so rollouts are reproducible"
            ]
        );
        let sha = "c".repeat(64);
        assert_eq!(
            report(Some(2), &format!("nginx:1.27@sha256:{sha}"), None),
            (
                vec![],
                vec![format!(
                    "spec.canary.image names both tag \"1.27\" and digest sha256:{sha}: the digest runs and the tag is ignored; write one of them"
                )]
            )
        );
        let (errors, _) = report(Some(2), &format!("nginx@sha256:{}", "C".repeat(64)), None);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].ends_with("not a valid image reference: invalid checksum digest format"),
            "{errors:?}"
        );
    }
}

/// `config` exists only in v1beta1: tested on the hub.
mod v1beta1_config {
    use crate::types::{AppService, AppServiceSpec, ConfigSource};
    use crate::validation::validate_report;
    use pretty_assertions::assert_eq;

    fn errors(config: Vec<ConfigSource>) -> Vec<String> {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "registry.example.com/checkout:v1".into(),
                config,
                ..Default::default()
            },
        );
        validate_report(&app, None)
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn map(name: &str, path: Option<&str>) -> ConfigSource {
        ConfigSource {
            config_map: Some(name.into()),
            mount_path: path.map(Into::into),
            ..Default::default()
        }
    }

    fn secret(name: &str, path: Option<&str>) -> ConfigSource {
        ConfigSource {
            secret: Some(name.into()),
            mount_path: path.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn sources_as_variables_and_files_are_accepted() {
        assert!(
            errors(vec![
                map("settings", None),
                secret("keys", None),
                map("settings", Some("/etc/app")),
                secret("keys", Some("/var/run/keys/")),
            ])
            .is_empty()
        );
    }

    #[test]
    fn exactly_one_object_named_as_kubernetes_names_them() {
        let both = ConfigSource {
            config_map: Some("a".into()),
            secret: Some("b".into()),
            mount_path: None,
        };
        assert_eq!(
            errors(vec![both, ConfigSource::default()]),
            [
                "spec.config[0]: Required value: exactly one of configMap and secret must be set",
                "spec.config[1]: Required value: exactly one of configMap and secret must be set",
            ]
        );
        assert_eq!(
            errors(vec![map("Settings", None), secret(&"a".repeat(254), None)]),
            [
                "spec.config[0].configMap: Invalid value: \"Settings\": must be a lowercase RFC 1123 subdomain (the name of an object in the AppService's namespace)",
                "spec.config[1].secret: Too long: may not be more than 253 bytes",
            ]
        );
    }

    #[test]
    fn mount_paths_are_absolute_plain_unique_and_clear_of_the_database_ca() {
        let bad = [
            ("etc/app", "must be an absolute path"),
            ("/", "must not be the root directory"),
            ("/etc/../root", "must not contain '.' or '..' segments"),
            (
                "/etc//app",
                "must not contain '//', ':' or control characters",
            ),
            (
                "/var/run/secrets/platform.example.com/database/x",
                "must not be or contain the database CA's directory (/var/run/secrets/platform.example.com/database)",
            ),
            (
                "/var/run/secrets",
                "must not be or contain the database CA's directory (/var/run/secrets/platform.example.com/database)",
            ),
        ];
        for (path, why) in bad {
            assert_eq!(
                errors(vec![map("settings", Some(path))]),
                [format!(
                    "spec.config[0].mountPath: Invalid value: \"{path}\": {why}"
                )],
                "{path}"
            );
        }
        // A directory beside the CA's with a common prefix is fine.
        assert!(
            errors(vec![map(
                "s",
                Some("/var/run/secrets/platform.example.com/databases")
            )])
            .is_empty()
        );
        assert_eq!(
            errors(vec![
                map("a", Some("/etc/app")),
                secret("b", Some("/etc/app"))
            ]),
            ["spec.config[1].mountPath: Duplicate value: \"/etc/app\""]
        );
        assert_eq!(
            errors(vec![map("a", None), map("a", None)]),
            ["spec.config[1].configMap: Duplicate value: \"a\""]
        );
    }

    #[test]
    fn at_most_sixteen_sources() {
        let many: Vec<ConfigSource> = (0..17).map(|i| map(&format!("m{i}"), None)).collect();
        assert_eq!(
            errors(many),
            ["spec.config: Too many: 17: must have at most 16 items"]
        );
    }
}

/// `autoscaling` exists only in v1beta1: tested on the hub.
mod v1beta1_autoscaling {
    use std::collections::BTreeMap;

    use crate::types::{AppService, AppServiceSpec, AutoscalingSpec, CanarySpec};
    use crate::validation::validate_report;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use pretty_assertions::assert_eq;

    fn errors(autoscaling: AutoscalingSpec, cpu: bool, canary: Option<i32>) -> Vec<String> {
        let app = AppService::new(
            "checkout",
            AppServiceSpec {
                image: "registry.example.com/checkout:v1".into(),
                replicas: Some(4),
                autoscaling: Some(autoscaling),
                resources: cpu.then(|| ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".into(), Quantity("100m".into()))])),
                    ..Default::default()
                }),
                canary: canary.map(|replicas| CanarySpec {
                    image: "registry.example.com/checkout:v2".into(),
                    replicas: Some(replicas),
                }),
                ..Default::default()
            },
        );
        validate_report(&app, None)
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn scaling(min: Option<i32>, max: i32, target: Option<i32>) -> AutoscalingSpec {
        AutoscalingSpec {
            min_replicas: min,
            max_replicas: max,
            target_cpu_utilization_percentage: target,
        }
    }

    #[test]
    fn bounds_within_the_replicas_range_and_a_target_percentage() {
        assert!(errors(scaling(Some(2), 10, Some(50)), true, None).is_empty());
        assert!(errors(scaling(None, 1, None), true, None).is_empty());
        assert_eq!(
            errors(scaling(Some(0), 1001, Some(0)), true, None),
            [
                "spec.autoscaling.minReplicas: Invalid value: 0: must be between 1 and 1000",
                "spec.autoscaling.maxReplicas: Invalid value: 1001: must be between 1 and 1000",
                "spec.autoscaling.targetCPUUtilizationPercentage: Invalid value: 0: must be between 1 and 1000",
            ]
        );
        assert_eq!(
            errors(scaling(Some(5), 3, None), true, None),
            [
                "spec.autoscaling.minReplicas: Invalid value: 5: must not be greater than maxReplicas (3)"
            ]
        );
    }

    #[test]
    fn a_cpu_request_is_required_and_a_canary_fits_the_least() {
        assert_eq!(
            errors(scaling(Some(2), 10, None), false, None),
            [
                "spec.resources.requests.cpu: Required value: required with spec.autoscaling: the autoscaler measures CPU use against it"
            ]
        );
        assert!(errors(scaling(Some(2), 10, None), true, Some(2)).is_empty());
        assert_eq!(
            errors(scaling(Some(2), 10, None), true, Some(3)),
            [
                "spec.canary.replicas: Invalid value: 3: must not be greater than spec.autoscaling.minReplicas (2): the autoscaler may scale down to it"
            ]
        );
    }
}

/// `expose` exists only in v1beta1: tested on the hub.
mod v1beta1_expose {
    use crate::types::{
        AppPort, AppService, AppServiceSpec, ExposeSpec, ExposeTls, IssuerRef, Protocol,
    };
    use crate::validation::validate_report;
    use pretty_assertions::assert_eq;

    fn errors(expose: ExposeSpec, ports: Vec<AppPort>) -> Vec<String> {
        let app = AppService::new(
            "shop",
            AppServiceSpec {
                image: "registry.example.com/shop:v1".into(),
                ports,
                expose: Some(expose),
                ..Default::default()
            },
        );
        validate_report(&app, None)
            .errors
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn hosts(hostnames: &[&str], paths: &[&str]) -> ExposeSpec {
        ExposeSpec {
            hostnames: hostnames.iter().map(|h| (*h).to_owned()).collect(),
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            ..ExposeSpec::default()
        }
    }

    #[test]
    fn host_names_are_unique_lowercase_dns_names_without_wildcards() {
        assert!(errors(hosts(&["shop.apps.example.com", "shop"], &[]), vec![]).is_empty());
        assert_eq!(
            errors(
                hosts(
                    &[
                        "Shop.example.com",
                        "*.example.com",
                        "10.0.0.1",
                        "a.example.com",
                        "a.example.com",
                        ""
                    ],
                    &[]
                ),
                vec![]
            ),
            [
                "spec.expose.hostnames[0]: Invalid value: \"Shop.example.com\": must be a lowercase DNS name (RFC 1123): letters, digits, '-' and '.'",
                "spec.expose.hostnames[1]: Invalid value: \"*.example.com\": must not be a wildcard: a host name belongs to one AppService, and a wildcard would take others'",
                "spec.expose.hostnames[2]: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address",
                "spec.expose.hostnames[4]: Duplicate value: \"a.example.com\"",
                "spec.expose.hostnames[5]: Invalid value: \"\": must be a lowercase DNS name (RFC 1123): letters, digits, '-' and '.'",
            ]
        );
        assert_eq!(
            errors(hosts(&[], &[]), vec![]),
            ["spec.expose.hostnames: Required value: at least one host name is required"]
        );
        let many: Vec<String> = (0..17).map(|i| format!("h{i}.example.com")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            errors(hosts(&many, &[]), vec![]),
            ["spec.expose.hostnames: Too many: 17: must have at most 16 items"]
        );
        let long = format!("{}.example.com", vec!["a".repeat(63); 4].join("."));
        assert_eq!(
            errors(hosts(&[&long], &[]), vec![]),
            ["spec.expose.hostnames[0]: Too long: may not be more than 253 bytes"]
        );
    }

    #[test]
    fn paths_are_prefixes_the_gateway_api_accepts() {
        assert!(
            errors(
                hosts(
                    &["shop.example.com"],
                    &["/", "/api/v1", "/a%20b", "/~user/x-y_z"]
                ),
                vec![]
            )
            .is_empty()
        );
        assert_eq!(
            errors(
                hosts(
                    &["shop.example.com"],
                    &[
                        "api", "/a//b", "/a/../b", "/a%2Fb", "/a%zz", "/a b", "/a#frag", "/api/v1",
                        "/api/v1"
                    ]
                ),
                vec![]
            ),
            [
                "spec.expose.paths[0]: Invalid value: \"api\": must start with '/'",
                "spec.expose.paths[1]: Invalid value: \"/a//b\": must not contain '//'",
                "spec.expose.paths[2]: Invalid value: \"/a/../b\": must not contain '.' or '..' segments",
                "spec.expose.paths[3]: Invalid value: \"/a%2Fb\": must not contain an escaped '/' (%2F)",
                "spec.expose.paths[4]: Invalid value: \"/a%zz\": '%' must start an escape of two hexadecimal digits",
                "spec.expose.paths[5]: Invalid value: \"/a b\": must contain only letters, digits, '-._~!$&'()*+,;=:@/' and percent escapes",
                "spec.expose.paths[6]: Invalid value: \"/a#frag\": must contain only letters, digits, '-._~!$&'()*+,;=:@/' and percent escapes",
                "spec.expose.paths[8]: Duplicate value: \"/api/v1\"",
            ]
        );
    }

    #[test]
    fn the_port_is_a_tcp_port_of_the_spec_and_the_secret_a_name() {
        let udp_first = vec![
            AppPort {
                name: "dns".into(),
                port: 53,
                protocol: Some(Protocol::Udp),
            },
            AppPort::http(8080),
        ];
        assert_eq!(
            errors(hosts(&["a.example.com"], &[]), udp_first.clone()),
            [
                "spec.expose.port: Required value: the first port is not TCP: name the TCP port that receives HTTP requests"
            ]
        );
        let mut named = hosts(&["a.example.com"], &[]);
        named.port = Some("http".into());
        assert!(errors(named.clone(), udp_first.clone()).is_empty());
        named.port = Some("dns".into());
        assert_eq!(
            errors(named.clone(), udp_first.clone()),
            [
                "spec.expose.port: Invalid value: \"dns\": must be a TCP port: HTTP requests are sent to it"
            ]
        );
        named.port = Some("metrics".into());
        assert_eq!(
            errors(named, udp_first),
            ["spec.expose.port: Invalid value: \"metrics\": must name a port of spec.ports"]
        );
        let mut tls = hosts(&["a.example.com"], &[]);
        tls.tls = Some(ExposeTls {
            secret_name: Some("Shop_TLS".into()),
            issuer_ref: None,
        });
        assert_eq!(
            errors(tls.clone(), vec![]),
            [
                "spec.expose.tls.secretName: Invalid value: \"Shop_TLS\": must be a lowercase RFC 1123 subdomain (the name of a Secret in the AppService's namespace)"
            ]
        );
        tls.tls = Some(ExposeTls::default());
        assert_eq!(
            errors(tls.clone(), vec![]),
            ["spec.expose.tls: Required value: secretName or issuerRef is required"]
        );
        let issuer = |name: &str, kind: Option<&str>, group: Option<&str>| ExposeTls {
            secret_name: None,
            issuer_ref: Some(IssuerRef {
                name: name.into(),
                kind: kind.map(Into::into),
                group: group.map(Into::into),
            }),
        };
        tls.tls = Some(issuer("letsencrypt", Some("ClusterIssuer"), None));
        assert!(errors(tls.clone(), vec![]).is_empty());
        tls.tls = Some(issuer(
            "vault",
            Some("VaultIssuer"),
            Some("vault.example.com"),
        ));
        assert!(errors(tls.clone(), vec![]).is_empty());
        tls.tls = Some(issuer("Lets_Encrypt", Some("Issuers"), None));
        assert_eq!(
            errors(tls, vec![]),
            [
                "spec.expose.tls.issuerRef.name: Invalid value: \"Lets_Encrypt\": must be a lowercase RFC 1123 subdomain (the name of an issuer)",
                "spec.expose.tls.issuerRef.kind: Invalid value: \"Issuers\": must be Issuer or ClusterIssuer (or name the group of an external issuer)",
            ]
        );
    }
}
