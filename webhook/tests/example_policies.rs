//! The policy files in `examples/policies/` compile and decide as their comments say.
// Test helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use kube::core::cel::AdmissionRequest;
use serde_json::{Value, json};
use webhook::namespaces::namespace_object;
use webhook::policy::PolicyStore;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/policies")
        .join(name)
}

fn request(operation: &str, namespace: &str, groups: &[&str]) -> AdmissionRequest {
    AdmissionRequest {
        operation: operation.into(),
        namespace: namespace.into(),
        username: "dev".into(),
        groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        ..Default::default()
    }
}

/// An AppService as policies see it: in the hub version, whatever the client wrote.
fn object(spec: Value) -> Value {
    json!({"apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
           "metadata": {"name": "a", "namespace": "n"}, "spec": spec})
}

fn labelled(env: &str) -> Option<Value> {
    Some(namespace_object(
        "n",
        &[("environment".to_owned(), env.to_owned())].into(),
    ))
}

fn denied_by(
    store: &PolicyStore,
    new: &Value,
    old: Option<&Value>,
    request: AdmissionRequest,
    ns: Option<Value>,
) -> Vec<String> {
    store
        .current()
        .evaluate(new.clone(), old.cloned(), request, ns)
        .into_iter()
        .map(|v| v.policy)
        .collect()
}

#[test]
fn policies_yaml() {
    // It reads namespaceObject: refused without --namespace-labels.
    assert!(PolicyStore::load(example("policies.yaml"), false).is_err());
    let store = PolicyStore::load(example("policies.yaml"), true).unwrap();
    assert_eq!(store.current().len(), 4);

    let good = object(
        json!({"image": "registry.example.com/shop:v1", "replicas": 3, "ports": [{"name": "http", "port": 8080}]}),
    );
    assert!(
        denied_by(
            &store,
            &good,
            None,
            request("CREATE", "n", &[]),
            labelled("production")
        )
        .is_empty()
    );

    let single = object(
        json!({"image": "docker.io/shop:v1", "replicas": 1, "ports": [{"name": "http", "port": 8080}],
        "resources": {"limits": {"memory": "16Gi"}}, "database": {"class": "pg"}}),
    );
    assert_eq!(
        denied_by(
            &store,
            &single,
            None,
            request("CREATE", "n", &[]),
            labelled("production")
        ),
        [
            "allowed-registry",
            "production-replicas",
            "memory-limit-cap",
            "database-only-for-platform-team"
        ]
    );
    assert_eq!(
        denied_by(
            &store,
            &single,
            None,
            request("CREATE", "n", &["platform-db-users"]),
            labelled("dev")
        ),
        ["allowed-registry", "memory-limit-cap"]
    );
    // A database enabled before stays allowed on update for anyone.
    assert_eq!(
        denied_by(
            &store,
            &single,
            Some(&single),
            request("UPDATE", "n", &[]),
            labelled("dev")
        ),
        ["allowed-registry", "memory-limit-cap"]
    );
    let message = store
        .current()
        .evaluate(
            single.clone(),
            None,
            request("CREATE", "n", &[]),
            labelled("production"),
        )
        .into_iter()
        .find(|v| v.policy == "production-replicas")
        .unwrap()
        .message;
    assert!(message.contains("must be at least 2, got 1"), "{message}");
    // On CREATE `oldObject` is null: the database policy still says why, not a CEL error.
    let messages: Vec<String> = store
        .current()
        .evaluate(
            single.clone(),
            None,
            request("CREATE", "n", &[]),
            labelled("dev"),
        )
        .into_iter()
        .map(|v| v.message)
        .collect();
    assert!(
        messages.contains(
            &"enabling a database requires membership in the platform-db-users group".to_owned()
        ),
        "{messages:?}"
    );
    assert!(
        !messages.iter().any(|m| m.contains("evaluation error")),
        "{messages:?}"
    );

    // A canary cannot bring an image from elsewhere: the registry rule reads it too,
    // and says which image it refused.
    let canary = |image: &str| {
        object(
            json!({"image": "registry.example.com/shop:v1", "replicas": 3,
                      "canary": {"image": image, "replicas": 1}}),
        )
    };
    let dev = || request("CREATE", "n", &[]);
    assert!(
        denied_by(
            &store,
            &canary("ghcr.io/example/shop:v2"),
            None,
            dev(),
            labelled("dev")
        )
        .is_empty()
    );
    let foreign = canary("docker.io/evil/shop:v2");
    assert_eq!(
        denied_by(&store, &foreign, None, dev(), labelled("dev")),
        ["allowed-registry"]
    );
    let message = store
        .current()
        .evaluate(foreign, None, dev(), labelled("dev"))
        .into_iter()
        .map(|v| v.message)
        .collect::<Vec<_>>();
    assert_eq!(
        message,
        [
            "image docker.io/evil/shop:v2 is not from an allowed registry (registry.example.com/, ghcr.io/example/)"
        ]
    );
}

#[test]
fn no_latest_in_production_yaml() {
    let store = PolicyStore::load(example("no-latest-in-production.yaml"), false).unwrap();
    let pinned = object(json!({"image": "registry.example.com:5000/shop:v1.2.3", "replicas": 2}));
    let latest = object(json!({"image": "registry.example.com:5000/shop:latest", "replicas": 2}));
    let untagged = object(json!({"image": "registry.example.com:5000/shop", "replicas": 2}));
    let digest = object(json!({"image": format!("shop@sha256:{}", "a".repeat(64)), "replicas": 2}));
    let prod = || request("CREATE", "prod-eu", &[]);
    assert!(denied_by(&store, &pinned, None, prod(), None).is_empty());
    assert!(denied_by(&store, &digest, None, prod(), None).is_empty());
    assert_eq!(
        denied_by(&store, &latest, None, prod(), None),
        ["pinned-images-in-production"]
    );
    assert_eq!(
        denied_by(&store, &untagged, None, prod(), None),
        ["pinned-images-in-production"]
    );
    assert!(denied_by(&store, &latest, None, request("CREATE", "dev", &[]), None).is_empty());
    // The canary's image is pinned like spec.image, or refused.
    let canary = |image: &str| {
        object(
            json!({"image": "registry.example.com:5000/shop:v1.2.3", "replicas": 2,
                      "canary": {"image": image, "replicas": 1}}),
        )
    };
    assert!(denied_by(&store, &canary("shop:v1.3.0"), None, prod(), None).is_empty());
    for unpinned in ["shop:latest", "registry.example.com:5000/shop"] {
        assert_eq!(
            denied_by(&store, &canary(unpinned), None, prod(), None),
            ["pinned-images-in-production"],
            "{unpinned}"
        );
    }

    let zero = object(json!({"image": "shop:v1", "replicas": 0}));
    let one = object(json!({"image": "shop:v1", "replicas": 1}));
    assert_eq!(
        denied_by(
            &store,
            &zero,
            Some(&one),
            request("UPDATE", "dev", &[]),
            None
        ),
        ["no-scale-to-zero-by-others"]
    );
    assert!(
        denied_by(
            &store,
            &zero,
            Some(&one),
            request("UPDATE", "dev", &["sre"]),
            None
        )
        .is_empty()
    );
    assert!(denied_by(&store, &zero, None, request("CREATE", "dev", &[]), None).is_empty());
}
