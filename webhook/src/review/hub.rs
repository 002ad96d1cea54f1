//! The hub form (`v1beta1`) of a reviewed object, as raw JSON, for the policies.
//!
//! Policies are written against one shape, the hub's: `object.spec.ports`, never
//! `object.spec.port`. The API server sends a review in the version the client wrote,
//! so a `v1alpha1` object is rewritten here, the way `/convert` would store it: only
//! `apiVersion`, `spec` and the conversion annotations differ between the versions,
//! so those are replaced (from the typed conversion of `common::conversion`) and every
//! other member of the object and of its metadata is carried over as raw JSON, unparsed.
//! The cost is one copy of the object, never a generic JSON tree of it; the annotations
//! are parsed only when a conversion annotation is involved (the API server bounds them
//! at 256 KiB before validating admission).

use std::collections::BTreeMap;

use common::conversion::{self, Version};
use common::names::CONVERSION_ANNOTATIONS;
use common::v1alpha1;
use serde_json::value::RawValue;

/// Why an object could not be rewritten (a fault of the object's JSON, which the typed
/// decode already accepted, so in practice a member of an unexpected type).
#[derive(Debug, thiserror::Error)]
#[error("the object cannot be read as the hub version: {0}")]
pub struct HubError(String);

impl HubError {
    fn of(error: serde_json::Error) -> Self {
        HubError(error.to_string())
    }
}

/// `raw`, a `v1alpha1` AppService, as its `v1beta1` form. `typed` is the same object as
/// [`super::decode_object`] or [`super::decode_spec_only`] decoded it (its spec and its
/// conversion annotations are what the conversion reads).
pub fn v1alpha1_to_hub(
    raw: &RawValue,
    typed: &v1alpha1::AppService,
) -> Result<Box<RawValue>, HubError> {
    let hub = conversion::to_v1beta1(typed);
    let top: BTreeMap<String, &RawValue> = serde_json::from_str(raw.get()).map_err(HubError::of)?;
    let api_version =
        serde_json::value::to_raw_value(Version::V1beta1.api_version()).map_err(HubError::of)?;
    let spec = serde_json::value::to_raw_value(&hub.spec).map_err(HubError::of)?;
    // Every other annotation as it came; the conversion decides the ones it owns. The
    // typed decode kept only those: when none is there before or after, the
    // metadata is carried over untouched (and its annotations never parsed, however
    // many there are).
    let carried = hub.metadata.annotations.unwrap_or_default();
    let had = typed
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| !a.is_empty());
    let metadata = match top.get("metadata") {
        Some(metadata) if had || !carried.is_empty() => Some(hub_metadata(metadata, &carried)?),
        _ => None,
    };
    let mut out: BTreeMap<&str, &RawValue> = top.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    out.insert("apiVersion", &api_version);
    out.insert("spec", &spec);
    if let Some(metadata) = &metadata {
        out.insert("metadata", metadata);
    }
    serde_json::value::to_raw_value(&out).map_err(HubError::of)
}

/// The metadata with the conversion annotations replaced by `carried`.
fn hub_metadata(
    metadata: &RawValue,
    carried: &BTreeMap<String, String>,
) -> Result<Box<RawValue>, HubError> {
    let mut fields: BTreeMap<String, &RawValue> =
        serde_json::from_str(metadata.get()).map_err(HubError::of)?;
    let mut annotations: BTreeMap<String, String> = match fields.get("annotations") {
        Some(raw) => serde_json::from_str::<Option<BTreeMap<String, String>>>(raw.get())
            .map_err(HubError::of)?
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
    for key in CONVERSION_ANNOTATIONS {
        annotations.remove(key);
    }
    for key in CONVERSION_ANNOTATIONS {
        if let Some(value) = carried.get(key) {
            annotations.insert(key.to_owned(), value.clone());
        }
    }
    let annotations_raw = serde_json::value::to_raw_value(&annotations).map_err(HubError::of)?;
    if annotations.is_empty() {
        fields.remove("annotations");
    } else {
        fields.insert("annotations".to_owned(), &annotations_raw);
    }
    serde_json::value::to_raw_value(&fields).map_err(HubError::of)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::{App, decode_object, decode_spec_only};
    use serde_json::{Value, json};

    /// The rewrite gives what `/convert` gives for the whole object.
    fn assert_same_as_convert(object: Value) {
        let raw = RawValue::from_string(object.to_string()).unwrap();
        let expected = conversion::convert_object(&object, Version::V1beta1).unwrap();
        for decoded in [
            decode_object(&raw, Version::V1alpha1).unwrap(),
            decode_spec_only(&raw, Version::V1alpha1).unwrap(),
        ] {
            let App::V1alpha1(typed) = &decoded.app else {
                panic!("not v1alpha1");
            };
            let hub = v1alpha1_to_hub(&raw, typed).unwrap();
            let hub: Value = serde_json::from_str(hub.get()).unwrap();
            assert_eq!(hub, expected, "{object}");
        }
    }

    #[test]
    fn the_hub_form_is_what_conversion_stores() {
        let ports = json!([{"name": "web", "port": 8080, "protocol": "TCP"},
                           {"name": "metrics", "port": 9090, "protocol": "TCP"}])
        .to_string();
        for object in [
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a", "namespace": "n"},
                   "spec": {"image": "nginx:1", "port": 9999}}),
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a", "namespace": "n", "labels": {"x": "y"},
                                "annotations": {"team": "shop", common::names::ANNOTATION_V1BETA1_PORTS: ports},
                                "finalizers": ["platform.example.com/cleanup"],
                                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
                   "spec": {"image": "nginx:1", "port": 8081, "replicas": 3,
                            "env": [{"name": "A", "value": "1"}]},
                   "status": {"observedGeneration": 2}}),
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a", "annotations": {"team": "shop"}},
                   "spec": {"image": "nginx:1", "database": {"enabled": false, "class": "big"}}}),
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a"},
                   "spec": {"image": "nginx:1", "database": {"enabled": true, "class": "big"}}}),
            // Every v1beta1 field v1alpha1 keeps in an annotation reaches the hub form:
            // a policy on the canary's image, or validation of the ids, sees them.
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a", "annotations": {
                       "team": "shop",
                       common::names::ANNOTATION_V1BETA1_POD_SECURITY: r#"{"runAsUser":0}"#,
                       common::names::ANNOTATION_V1BETA1_ROLLOUT: r#"{"maxSurge":0}"#,
                       common::names::ANNOTATION_V1BETA1_CANARY: r#"{"image":"docker.io/evil:v1","replicas":1}"#,
                   }},
                   "spec": {"image": "nginx:1", "replicas": 2}}),
        ] {
            assert_same_as_convert(object);
        }
    }

    #[test]
    fn the_port_of_v1alpha1_is_the_first_hub_port() {
        let object = json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                            "metadata": {"name": "a"}, "spec": {"image": "nginx:1", "port": 9999}});
        let raw = RawValue::from_string(object.to_string()).unwrap();
        let decoded = decode_object(&raw, Version::V1alpha1).unwrap();
        let App::V1alpha1(typed) = &decoded.app else {
            panic!("not v1alpha1");
        };
        let hub: Value = serde_json::from_str(v1alpha1_to_hub(&raw, typed).unwrap().get()).unwrap();
        assert_eq!(hub["apiVersion"], "platform.example.com/v1beta1");
        assert_eq!(hub["spec"]["ports"][0]["port"], 9999);
        assert!(hub["spec"].get("port").is_none());
    }

    #[test]
    fn the_canary_of_a_v1alpha1_annotation_is_in_the_hub_spec() {
        let object = json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                            "metadata": {"name": "a", "annotations": {
                                common::names::ANNOTATION_V1BETA1_CANARY: r#"{"image":"docker.io/evil:v1"}"#}},
                            "spec": {"image": "nginx:1", "replicas": 2}});
        let raw = RawValue::from_string(object.to_string()).unwrap();
        let decoded = decode_object(&raw, Version::V1alpha1).unwrap();
        let App::V1alpha1(typed) = &decoded.app else {
            panic!("not v1alpha1");
        };
        let hub: Value = serde_json::from_str(v1alpha1_to_hub(&raw, typed).unwrap().get()).unwrap();
        assert_eq!(hub["spec"]["canary"]["image"], "docker.io/evil:v1");
        assert!(hub["metadata"].get("annotations").is_none(), "{hub}");
    }
}
