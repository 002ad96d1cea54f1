//! Would a server-side apply change anything? Decided before sending it.
//!
//! An apply is a no-op exactly when (1) every value we would apply is already the live
//! value and (2) the set of fields our field manager owns equals the set of fields we
//! would apply (otherwise the apply would drop fields we no longer want, or take back
//! fields another manager took). Both are checked against the live object, so a
//! steady-state reconcile sends no request at all.
//!
//! Field sets are compared in the API server's `FieldsV1` shape (`f:<field>`,
//! `k:{<list keys>}`). The builders in [`crate::desired`] use only lists whose merge keys
//! are listed in [`list_keys`]; an unknown list is treated as atomic, which is safe: at
//! worst it makes us apply when nothing changed, never the reverse.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube_quantity::ParsedQuantity;
use serde_json::Value;

/// One path of owned leaf fields, segments in `FieldsV1` notation.
type FieldPath = Vec<String>;

/// Whether applying `desired` (a serialized apply configuration) with `manager` would
/// leave `live` (the live object, serialized) unchanged.
pub fn apply_is_noop(
    desired: &Value,
    live: &Value,
    managed: &[ManagedFieldsEntry],
    manager: &str,
) -> bool {
    let Some(owned) = owned_fields(managed, manager) else {
        return false;
    };
    let mut wanted = BTreeSet::new();
    let Some(body) = desired.as_object() else {
        return false;
    };
    for (k, v) in body {
        // Identity and type fields are not tracked as owned fields.
        if matches!(k.as_str(), "apiVersion" | "kind") {
            continue;
        }
        if k == "metadata" {
            if let Some(meta) = v.as_object() {
                for (mk, mv) in meta {
                    if matches!(mk.as_str(), "name" | "namespace") {
                        continue;
                    }
                    collect(
                        mv,
                        mk,
                        &mut vec![seg_field("metadata"), seg_field(mk)],
                        &mut wanted,
                    );
                }
            }
            continue;
        }
        collect(v, k, &mut vec![seg_field(k)], &mut wanted);
    }
    owned == wanted && values_match(desired, live, false)
}

/// The leaf paths `manager` owns through Apply on the main resource, `None` without an
/// entry.
fn owned_fields(managed: &[ManagedFieldsEntry], manager: &str) -> Option<BTreeSet<FieldPath>> {
    let entry = managed.iter().find(|e| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some("Apply")
            && e.subresource.as_deref().is_none_or(str::is_empty)
    })?;
    let fields = entry.fields_v1.as_ref()?;
    let mut out = BTreeSet::new();
    flatten_fields(&fields.0, &mut Vec::new(), &mut out);
    Some(out)
}

/// Leaf paths of a `FieldsV1` tree; `.` (the node itself) is dropped and `k:` keys are
/// canonicalized.
fn flatten_fields(node: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    let children: Vec<(&String, &Value)> = node
        .as_object()
        .map(|m| m.iter().filter(|(k, _)| k.as_str() != ".").collect())
        .unwrap_or_default();
    if children.is_empty() {
        if !path.is_empty() {
            out.insert(path.clone());
        }
        return;
    }
    for (k, v) in children {
        let seg = match k.strip_prefix("k:") {
            Some(json) => match serde_json::from_str::<Value>(json) {
                Ok(key) => format!("k:{}", canonical(&key)),
                Err(_) => k.clone(),
            },
            None => k.clone(),
        };
        path.push(seg);
        flatten_fields(v, path, out);
        path.pop();
    }
}

fn seg_field(name: &str) -> String {
    format!("f:{name}")
}

/// Leaf paths the apply configuration `v` (the value of field `field`) would own.
fn collect(v: &Value, field: &str, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match v {
        Value::Object(map) if !map.is_empty() && !is_atomic(field) => {
            for (k, child) in map {
                path.push(seg_field(k));
                collect(child, k, path, out);
                path.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let keys: Option<Vec<Value>> = items.iter().map(|i| list_key(field, i)).collect();
            match keys {
                Some(keys) => {
                    for (item, key) in items.iter().zip(keys) {
                        path.push(format!("k:{}", canonical(&key)));
                        if atomic_items(field) {
                            out.insert(path.clone());
                        } else {
                            collect_item(item, path, out);
                        }
                        path.pop();
                    }
                }
                // Atomic list: owned as a whole.
                None => {
                    out.insert(path.clone());
                }
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// A keyed list item: the item itself plus each of its fields.
fn collect_item(item: &Value, path: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
    match item.as_object() {
        Some(map) if !map.is_empty() => {
            for (k, child) in map {
                path.push(seg_field(k));
                collect(child, k, path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Structs and maps the API schema marks atomic (`+structType=atomic`,
/// `+mapType=atomic`): owned as a whole, so they are one leaf.
fn is_atomic(field: &str) -> bool {
    matches!(
        field,
        // Deployment's LabelSelector and Service's selector map.
        "selector" | "secretKeyRef" | "configMapKeyRef" | "fieldRef" | "resourceFieldRef"
    )
}

/// Keyed lists whose items are atomic structs: each item is one leaf.
fn atomic_items(field: &str) -> bool {
    field == "ownerReferences"
}

/// Merge keys of the associative lists the builders use, by field name; `None` when the
/// list is atomic (or unknown).
fn list_keys(field: &str, item: &Value) -> Option<&'static [&'static str]> {
    let has = |k: &str| item.get(k).is_some();
    match field {
        "ownerReferences" => Some(&["uid"]),
        "containers" | "initContainers" | "env" | "volumes" => Some(&["name"]),
        "volumeMounts" => Some(&["mountPath"]),
        "ports" if has("containerPort") => Some(&["containerPort", "protocol"]),
        "ports" if has("port") => Some(&["port", "protocol"]),
        _ => None,
    }
}

/// The key object of a list item, `None` for atomic lists.
fn list_key(field: &str, item: &Value) -> Option<Value> {
    let keys = list_keys(field, item)?;
    let mut key = serde_json::Map::new();
    for k in keys {
        key.insert((*k).to_owned(), item.get(*k)?.clone());
    }
    Some(Value::Object(key))
}

/// JSON with object keys sorted, so keys compare independently of serialization order.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(&String, &Value)> = m.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            let inner: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), canonical(v)))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        other => other.to_string(),
    }
}

/// Whether every value in `desired` is present and equal in `live`. Keyed lists are
/// matched by key, atomic lists must be equal, quantities compare by value (the API
/// server normalizes `0.1` to `100m`).
fn values_match(desired: &Value, live: &Value, quantities: bool) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| {
            l.get(k).is_some_and(|lv| {
                // `requests` and `limits` only occur in resource requirements.
                let q = quantities || matches!(k.as_str(), "requests" | "limits");
                match (dv, lv) {
                    (Value::Array(di), Value::Array(li)) => lists_match(k, di, li, q),
                    _ => values_match(dv, lv, q),
                }
            })
        }),
        (Value::String(d), Value::String(l)) if quantities && d != l => {
            match (
                ParsedQuantity::try_from(d.as_str()),
                ParsedQuantity::try_from(l.as_str()),
            ) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
        }
        (Value::Array(d), Value::Array(l)) => lists_match("", d, l, quantities),
        (d, l) => d == l,
    }
}

fn lists_match(field: &str, desired: &[Value], live: &[Value], quantities: bool) -> bool {
    let keyed: Option<Vec<Value>> = desired.iter().map(|i| list_key(field, i)).collect();
    match keyed {
        Some(keys) if !desired.is_empty() => desired.iter().zip(keys).all(|(item, key)| {
            live.iter()
                .find(|l| list_key(field, l).is_some_and(|lk| canonical(&lk) == canonical(&key)))
                .is_some_and(|l| values_match(item, l, quantities))
        }),
        _ => {
            desired.len() == live.len()
                && desired
                    .iter()
                    .zip(live)
                    .all(|(d, l)| values_match(d, l, quantities))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    const MANAGER: &str = "appservice-controller";

    fn entry(manager: &str, op: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            api_version: Some("apps/v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    fn desired() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web", "namespace": "ns",
                "labels": {"app": "web"},
                "ownerReferences": [{"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                    "name": "web", "uid": "u1", "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"spec": {"containers": [{
                    "name": "app", "image": "nginx:1.27",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "0.1"}}
                }]}}
            }
        })
    }

    /// What the API server records for `desired()`, in its own key order and with `.`.
    fn fields() -> Value {
        json!({
            "f:metadata": {
                "f:labels": {".": {}, "f:app": {}},
                "f:ownerReferences": {".": {}, "k:{\"uid\":\"u1\"}": {}}
            },
            "f:spec": {
                "f:replicas": {},
                "f:selector": {},
                "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                    ".": {}, "f:image": {}, "f:name": {},
                    "f:ports": {"k:{\"protocol\":\"TCP\",\"containerPort\":8080}": {
                        ".": {}, "f:containerPort": {}, "f:name": {}, "f:protocol": {}
                    }},
                    "f:resources": {"f:requests": {"f:cpu": {}}}
                }}}}
            }
        })
    }

    /// The live object: our values, normalized by the API server, plus defaults.
    fn live() -> Value {
        let mut live = desired();
        live["metadata"]["resourceVersion"] = json!("42");
        live["metadata"]["ownerReferences"][0]["extra"] = json!(null);
        live["spec"]["strategy"] = json!({"type": "RollingUpdate"});
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
            json!("100m");
        live["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] =
            json!("IfNotPresent");
        live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(null);
        live
    }

    #[test]
    fn unchanged_object_needs_no_apply() {
        let managed = vec![
            entry(
                "kube-controller-manager",
                "Update",
                json!({"f:status": {"f:replicas": {}}}),
            ),
            entry(MANAGER, "Apply", fields()),
        ];
        assert!(apply_is_noop(&desired(), &live(), &managed, MANAGER));
    }

    #[test]
    fn changed_value_needs_apply() {
        let managed = vec![entry(MANAGER, "Apply", fields())];
        let mut live = live();
        live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:1.26");
        assert!(!apply_is_noop(&desired(), &live, &managed, MANAGER));
        let mut live = self::live();
        live["spec"]["replicas"] = json!(3);
        assert!(!apply_is_noop(&desired(), &live, &managed, MANAGER));
        let mut live = self::live();
        live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] =
            json!("200m");
        assert!(!apply_is_noop(&desired(), &live, &managed, MANAGER));
    }

    #[test]
    fn field_we_no_longer_want_needs_apply() {
        // We owned an env var that the new desired state drops: the apply removes it.
        let mut fields = fields();
        fields["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]["f:env"] =
            json!({"k:{\"name\":\"OLD\"}": {".": {}, "f:name": {}, "f:value": {}}});
        let mut live = live();
        live["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "OLD", "value": "1"}]);
        let managed = vec![entry(MANAGER, "Apply", fields)];
        assert!(!apply_is_noop(&desired(), &live, &managed, MANAGER));
    }

    #[test]
    fn field_taken_by_another_manager_needs_apply() {
        // `kubectl scale deployment` moved spec.replicas to another manager.
        let mut fields = fields();
        if let Some(spec) = fields["f:spec"].as_object_mut() {
            spec.remove("f:replicas");
        }
        let managed = vec![
            entry("kubectl", "Update", json!({"f:spec": {"f:replicas": {}}})),
            entry(MANAGER, "Apply", fields),
        ];
        assert!(!apply_is_noop(&desired(), &live(), &managed, MANAGER));
    }

    #[test]
    fn no_entry_or_update_entry_needs_apply() {
        assert!(!apply_is_noop(&desired(), &live(), &[], MANAGER));
        let managed = vec![entry(MANAGER, "Update", fields())];
        assert!(!apply_is_noop(&desired(), &live(), &managed, MANAGER));
    }

    #[test]
    fn keyed_lists_match_by_key_not_position() {
        let d = json!({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]});
        let l = json!({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}]});
        assert!(values_match(&d, &l, false));
        let l2 = json!({"env": [{"name": "B", "value": "2"}]});
        assert!(!values_match(&d, &l2, false));
    }

    #[test]
    fn atomic_lists_must_be_equal() {
        let d = json!({"command": ["a", "b"]});
        assert!(values_match(&d, &json!({"command": ["a", "b"]}), false));
        assert!(!values_match(
            &d,
            &json!({"command": ["a", "b", "c"]}),
            false
        ));
    }

    #[test]
    fn quantities_compare_by_value_only_under_resources() {
        let d = json!({"resources": {"limits": {"memory": "1Gi", "cpu": "1"}}});
        let l = json!({"resources": {"limits": {"memory": "1024Mi", "cpu": "1000m"}}});
        assert!(values_match(&d, &l, false));
        assert!(!values_match(
            &json!({"image": "1"}),
            &json!({"image": "1.0"}),
            false
        ));
    }

    #[test]
    fn canonical_keys_ignore_order() {
        assert_eq!(
            canonical(&json!({"protocol": "TCP", "containerPort": 8080})),
            canonical(&json!({"containerPort": 8080, "protocol": "TCP"}))
        );
    }
}
