//! Property tests: defaulting is idempotent and validation never panics, on arbitrary specs
//! (written in `v1alpha1`, validated through conversion to the hub like the webhook does).

use common::EnvVar;
use common::defaults::{
    default_v1alpha1_object as default_object, default_v1alpha1_spec as default_spec,
};
use common::v1alpha1::{AppService, AppServiceSpec, DatabaseSpec};
use common::validation::{
    validate_v1alpha1 as validate, validate_v1alpha1_report as validate_report,
};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;

fn arb_env() -> impl Strategy<Value = EnvVar> {
    ("[A-Za-z0-9_.\\- ]{0,12}", proptest::option::of(".{0,16}")).prop_map(|(name, value)| EnvVar {
        name,
        value,
        value_from: None,
    })
}

fn arb_quantities() -> impl Strategy<Value = Option<std::collections::BTreeMap<String, Quantity>>> {
    proptest::option::of(proptest::collection::btree_map(
        prop_oneof![
            Just("cpu".to_owned()),
            Just("memory".to_owned()),
            "[a-z]{1,6}"
        ],
        prop_oneof![
            "[0-9]{1,4}(m|Mi|Gi|k|)".prop_map(Quantity),
            ".{0,12}".prop_map(Quantity),
            "-?[0-9]{1,30}(\\.[0-9]{0,30})?(e[0-9]{1,3}|E-[0-9]{1,3}|Ei|)".prop_map(Quantity),
        ],
        0..3,
    ))
}

fn arb_spec() -> impl Strategy<Value = AppServiceSpec> {
    (
        prop_oneof![
            "[a-z0-9./:@_-]{0,40}",
            ".{0,40}",
            Just("registry.example.com/app:v1".to_owned()),
        ],
        proptest::option::of(any::<i32>()),
        proptest::option::of(any::<i32>()),
        proptest::collection::vec(arb_env(), 0..6),
        (arb_quantities(), arb_quantities()),
        proptest::option::of((any::<bool>(), proptest::option::of("[a-zA-Z0-9._-]{0,20}"))),
    )
        .prop_map(
            |(image, replicas, port, env, (requests, limits), db)| AppServiceSpec {
                image,
                replicas,
                port,
                env,
                resources: Some(ResourceRequirements {
                    requests,
                    limits,
                    ..Default::default()
                }),
                database: db.map(|(enabled, class)| DatabaseSpec { enabled, class }),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn defaulting_is_idempotent(spec in arb_spec(), name in proptest::option::of("[a-z]{0,8}")) {
        let mut once = AppService::new("x", spec);
        once.metadata.name = name;
        default_object(&mut once);
        let mut twice = once.clone();
        default_object(&mut twice);
        prop_assert_eq!(&once, &twice);

        let mut spec_twice = once.spec.clone();
        default_spec(&mut spec_twice);
        prop_assert_eq!(&once.spec, &spec_twice);
        prop_assert!(once.spec.replicas.is_some() && once.spec.port.is_some());
    }

    #[test]
    fn validation_never_panics(spec in arb_spec(), old in proptest::option::of(arb_spec()), name in ".{0,70}") {
        let mut new = AppService::new("x", spec);
        new.metadata.name = Some(name);
        let old = old.map(|s| AppService::new("x", s));
        let report = validate_report(&new, old.as_ref());
        // The two entry points agree.
        prop_assert_eq!(validate(&new, old.as_ref()).is_ok(), report.errors.is_empty());
        for err in report.errors.iter() {
            prop_assert!(!err.field.is_empty());
            prop_assert!(err.to_string().starts_with(&err.field));
        }
    }

    #[test]
    fn valid_specs_stay_valid_after_defaulting(replicas in 0..=1000i32, port in 1..=65535i32) {
        let mut app = AppService::new("web", AppServiceSpec {
            image: "registry.example.com/web:v1".into(),
            replicas: Some(replicas),
            port: Some(port),
            ..Default::default()
        });
        prop_assert!(validate(&app, None).is_ok());
        default_object(&mut app);
        prop_assert!(validate(&app, None).is_ok());
    }
}
