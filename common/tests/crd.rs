//! The committed CRD matches the code, and carries what the API contract promises.

#![allow(clippy::expect_used, clippy::unwrap_used)] // test code: a failed expectation is the test failing

use std::path::Path;

use common::crd::{CRD_PATH, crd, crd_yaml};
use serde_json::{Value, json};

fn committed() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(CRD_PATH);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn committed_crd_matches_generated() {
    let generated = crd_yaml().expect("CRD generates");
    assert!(
        committed() == generated,
        "{CRD_PATH} differs from what common/src/v1alpha1.rs and v1beta1.rs generate; run `cargo xtask crd` and commit the result"
    );
}

#[test]
fn committed_crd_parses_back_to_the_same_object() {
    let parsed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_saphyr::from_str(&committed()).expect("committed CRD is valid YAML");
    assert_eq!(parsed, crd().expect("CRD generates"));
}

fn crd_json() -> Value {
    serde_json::to_value(crd().expect("CRD generates")).expect("CRD to JSON")
}

/// The schema of `version`.
fn schema_of(version: &str) -> Value {
    let crd = crd_json();
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    versions
        .iter()
        .find(|v| v["name"] == version)
        .unwrap_or_else(|| panic!("no version {version}"))["schema"]["openAPIV3Schema"]
        .clone()
}

fn schema() -> Value {
    schema_of("v1alpha1")
}

/// The names of a CRD version's printer columns, in order.
fn printer_columns(version: &Value) -> Vec<&str> {
    version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

#[test]
fn names_scope_and_subresources() {
    let crd = crd_json();
    assert_eq!(crd["metadata"]["name"], "appservices.platform.example.com");
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["appsrv"]));
    let versions: Vec<(&str, bool, bool)> = crd["spec"]["versions"]
        .as_array()
        .expect("versions")
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default(),
                v["served"] == true,
                v["storage"] == true,
            )
        })
        .collect();
    assert_eq!(
        versions,
        vec![("v1beta1", true, true), ("v1alpha1", true, false)]
    );
    // The conversion webhook is the installation's (the chart adds it).
    assert!(crd["spec"].get("conversion").is_none());
    for version in crd["spec"]["versions"].as_array().expect("versions") {
        assert_eq!(version["subresources"]["status"], json!({}));
        assert_eq!(
            version["subresources"]["scale"],
            json!({
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.readyReplicas",
                "labelSelectorPath": ".status.selector"
            })
        );
        assert_eq!(
            printer_columns(version),
            vec!["Ready", "Replicas", "Canary", "Endpoint", "Age"]
        );
    }
}

#[test]
fn defaults_and_bounds() {
    let spec = &schema()["properties"]["spec"]["properties"];
    assert_eq!(spec["replicas"]["default"], 1);
    assert_eq!(spec["replicas"]["minimum"].as_f64(), Some(0.0));
    assert_eq!(spec["replicas"]["maximum"].as_f64(), Some(1000.0));
    assert_eq!(spec["port"]["default"], 8080);
    assert_eq!(spec["port"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(spec["port"]["maximum"].as_f64(), Some(65535.0));
    assert_eq!(spec["image"]["maxLength"], 512);
    assert_eq!(spec["env"]["maxItems"], 128);
    assert_eq!(spec["env"]["x-kubernetes-list-type"], "map");
    assert_eq!(spec["env"]["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(spec["database"]["properties"]["enabled"]["default"], false);
    let beta = &schema_of("v1beta1")["properties"]["spec"]["properties"];
    assert_eq!(beta["replicas"]["default"], 1);
    assert_eq!(
        beta["ports"]["default"],
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
    );
    assert_eq!(beta["ports"]["maxItems"], 16);
    assert_eq!(beta["ports"]["x-kubernetes-list-map-keys"], json!(["name"]));
    let port = &beta["ports"]["items"]["properties"];
    assert_eq!(port["port"]["minimum"].as_f64(), Some(1.0));
    assert_eq!(port["port"]["maximum"].as_f64(), Some(65535.0));
    assert_eq!(port["name"]["maxLength"], 15);
    assert_eq!(port["protocol"]["enum"], json!(["TCP", "UDP", "SCTP"]));
    assert_eq!(port["protocol"]["default"], "TCP");
    assert_eq!(
        beta["database"]["required"],
        json!(["class"]),
        "presence means requested: the class is required"
    );
    // Non-nullable, so a null from a client is pruned and then defaulted.
    assert!(spec["replicas"].get("nullable").is_none());
    assert!(spec["port"].get("nullable").is_none());
    let status = &schema()["properties"]["status"]["properties"];
    assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    assert_eq!(
        status["conditions"]["x-kubernetes-list-map-keys"],
        json!(["type"])
    );
}

#[test]
fn every_property_has_a_description() {
    fn walk(path: &str, schema: &Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                if p != ".metadata"
                    && p != ".apiVersion"
                    && p != ".kind"
                    && sub.get("description").is_none()
                {
                    missing.push(p.clone());
                }
                walk(&p, sub, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
    }
    let mut missing = vec![];
    for version in ["v1alpha1", "v1beta1"] {
        walk(
            version,
            &schema_of(version)["properties"]["spec"],
            &mut missing,
        );
        walk(
            version,
            &schema_of(version)["properties"]["status"],
            &mut missing,
        );
    }
    assert!(
        missing.is_empty(),
        "properties without a description: {missing:?}"
    );
}

#[test]
fn cel_rules_present() {
    let s = schema();
    let rules = |v: &Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| r["rule"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let root = rules(&s);
    assert!(
        root.iter().any(|r| r.contains("self.metadata.name")),
        "{root:?}"
    );
    let spec = rules(&s["properties"]["spec"]);
    assert!(
        spec.iter().any(|r| r.contains("oldSelf.database")),
        "{spec:?}"
    );
    let db = rules(&s["properties"]["spec"]["properties"]["database"]);
    assert_eq!(db, vec!["!self.enabled || has(self.class)".to_owned()]);

    let beta = schema_of("v1beta1");
    assert!(
        rules(&beta)
            .iter()
            .any(|r| r.contains("self.metadata.name"))
    );
    assert!(
        rules(&beta["properties"]["spec"])
            .iter()
            .any(|r| r.contains("oldSelf.database"))
    );
    let ports = &beta["properties"]["spec"]["properties"]["ports"];
    assert!(rules(ports).iter().any(|r| r.contains("q.port == p.port")));
    assert!(
        rules(&ports["items"])
            .iter()
            .any(|r| r.contains("self.name"))
    );
}

#[test]
fn structural_no_untyped_nodes() {
    // A structural schema gives every node a type, except int-or-string and
    // preserve-unknown-fields nodes.
    fn walk(path: &str, s: &Value, bad: &mut Vec<String>) {
        let Some(obj) = s.as_object() else { return };
        let typed = obj.contains_key("type")
            || obj.contains_key("x-kubernetes-int-or-string")
            || obj.contains_key("x-kubernetes-preserve-unknown-fields");
        if !typed {
            bad.push(path.to_owned());
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            assert!(
                !obj.contains_key(key) || path.is_empty(),
                "{path} uses {key}"
            );
        }
        if let Some(props) = obj.get("properties").and_then(Value::as_object) {
            for (k, v) in props {
                if !(path.is_empty() && k == "metadata") {
                    walk(&format!("{path}.{k}"), v, bad);
                }
            }
        }
        if let Some(items) = obj.get("items") {
            walk(&format!("{path}[]"), items, bad);
        }
        if let Some(ap) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            walk(&format!("{path}{{}}"), ap, bad);
        }
    }
    let mut bad = vec![];
    walk("", &schema(), &mut bad);
    walk("", &schema_of("v1beta1"), &mut bad);
    assert!(bad.is_empty(), "untyped schema nodes: {bad:?}");
}

#[test]
fn every_committed_crd_matches_generated() {
    for (rel, generated, source) in common::crd::generated().expect("CRDs serialize") {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            committed == generated,
            "{rel} differs from what {source} generates; run `cargo xtask crd` and commit the result"
        );
    }
}

#[test]
fn database_class_is_cluster_scoped_with_status_and_columns() {
    let crd = serde_json::to_value(common::crd::database_class_crd()).expect("CRD to JSON");
    assert_eq!(
        crd["metadata"]["name"],
        "databaseclasses.platform.example.com"
    );
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["dbclass"]));
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1alpha1");
    assert_eq!(version["subresources"]["status"], json!({}));
    assert_eq!(
        printer_columns(version),
        vec![
            "Host",
            "Port",
            "TLS",
            "Policy",
            "Reachable",
            "Version",
            "Age"
        ]
    );
    let schema = &version["schema"]["openAPIV3Schema"];
    let spec = &schema["properties"]["spec"];
    let mut required: Vec<&str> = spec["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    required.sort_unstable();
    assert_eq!(required, vec!["adminCredentials", "host", "tls"]);
    assert_eq!(spec["properties"]["port"]["default"], 5432);
    assert_eq!(
        spec["properties"]["deletionPolicy"]["enum"],
        json!(["Delete", "Retain"])
    );
    assert_eq!(
        spec["properties"]["tls"]["properties"]["mode"]["enum"],
        json!(["disable", "require", "verify-full"])
    );
    let rules = spec["properties"]["tls"]["x-kubernetes-validations"].to_string();
    assert!(rules.contains("verify-full"), "{rules}");
    fn undocumented(path: &str, schema: &Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                if sub.get("description").is_none() && sub.get("$ref").is_none() {
                    missing.push(p.clone());
                }
                undocumented(&p, sub, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            undocumented(&format!("{path}[]"), items, missing);
        }
    }
    let mut missing = vec![];
    undocumented("spec", spec, &mut missing);
    undocumented("status", &schema["properties"]["status"], &mut missing);
    assert!(missing.is_empty(), "undocumented: {missing:?}");
}

/// Every bounded list or map of `common::types::LIST_BOUNDS` carries its bound in the
/// schema of both versions (`maxItems` for a list, `maxProperties` for a map), so the API
/// server holds what `validate` and the webhook hold.
#[test]
fn every_list_bound_is_in_the_schema_of_both_versions() {
    for version in ["v1alpha1", "v1beta1"] {
        let root = schema_of(version);
        for &(path, max) in common::types::LIST_BOUNDS {
            let Some(field) = path.strip_prefix("spec.") else {
                panic!("{path}: LIST_BOUNDS holds spec paths");
            };
            if version == "v1alpha1"
                && matches!(
                    field,
                    "ports" | "config" | "expose.hostnames" | "expose.paths"
                )
            {
                continue; // v1alpha1 has one `port`, no list, and no `config` or `expose`
            }
            let mut node = &root["properties"]["spec"];
            for part in field.split('.') {
                node = &node["properties"][part];
            }
            let keyword = match node["type"].as_str() {
                Some("array") => "maxItems",
                Some("object") => "maxProperties",
                other => panic!("{version} {path}: a list or a map, not {other:?}"),
            };
            assert_eq!(
                node[keyword].as_u64(),
                Some(max as u64),
                "{version} {path}: {keyword}"
            );
        }
    }
}
