//! The hub form (`v1beta1`) of a reviewed object, for the policies.
//!
//! Policies are written against one shape, the hub's: `object.spec.ports`, never
//! `object.spec.port`. The API server sends a review in the version the client wrote,
//! so a `v1alpha1` object is given to the policies the way `/convert` would store it:
//! only `apiVersion`, `spec` and the conversion annotations differ between the versions,
//! so [`Hub`] holds those three, from the typed conversion of `common::conversion`, and
//! [`super::policy`] puts them in while it converts the object's JSON: every other member
//! of the object and of its annotations is read from the JSON as it is, in the same pass.
//! Nothing is parsed twice and no JSON is written to be read again.

use common::conversion::{self, Version};
use common::names::CONVERSION_ANNOTATIONS;
use serde_json::Value;

use super::App;
use crate::expression::{Replace, With};

/// Why an object could not be given in the hub form (its conversion could not be
/// written as JSON: a fault of the webhook).
#[derive(Debug, thiserror::Error)]
#[error("the object cannot be read as the hub version: {0}")]
pub struct HubError(String);

/// What the hub form of a `v1alpha1` object replaces.
#[derive(Debug)]
pub struct Hub {
    api_version: Value,
    spec: Value,
    /// The conversion annotations of the hub form, when one is involved (present before
    /// or after the conversion); otherwise the annotations stay as they are.
    annotations: Option<Value>,
}

impl Hub {
    /// The hub form of `app`, as its typed decode has it, when it needs one (a
    /// `v1alpha1` object: its spec and its conversion annotations are what the conversion
    /// reads).
    pub fn of(app: &App) -> Result<Option<Hub>, HubError> {
        let App::V1alpha1(typed) = app else {
            return Ok(None);
        };
        let hub = conversion::to_v1beta1(typed);
        let of = |error: serde_json::Error| HubError(error.to_string());
        let spec = serde_json::to_value(&hub.spec).map_err(of)?;
        let carried = hub.metadata.annotations.unwrap_or_default();
        let had = typed
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| !a.is_empty());
        let annotations = (had || !carried.is_empty())
            .then(|| serde_json::to_value(carried))
            .transpose()
            .map_err(of)?;
        Ok(Some(Hub {
            api_version: Value::from(Version::V1beta1.api_version()),
            spec,
            annotations,
        }))
    }

    /// The members the hub form changes: `apiVersion` and `spec` replaced; the
    /// conversion annotations replaced by the conversion's, every other annotation as it
    /// came, and no annotations at all when none is left.
    pub fn replacements(&self) -> Vec<Replace<'_>> {
        let mut replace = vec![
            Replace {
                path: &["apiVersion"],
                with: With::Value(&self.api_version),
            },
            Replace {
                path: &["spec"],
                with: With::Value(&self.spec),
            },
        ];
        if let Some(annotations) = &self.annotations {
            replace.push(Replace {
                path: &["metadata", "annotations"],
                with: With::Merge {
                    drop: &CONVERSION_ANNOTATIONS,
                    put: annotations,
                },
            });
        }
        replace
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::expression::{Projection, value_to_cel};
    use crate::policy::PolicySet;
    use crate::review::Json;
    use crate::review::policy::{Source, objects};
    use kube::core::cel::cel;
    use serde_json::json;
    use serde_json::value::RawValue;

    /// The CEL value the policies get of `object` (a v1alpha1 object) when they read all
    /// of it, from the written and the stored decode.
    fn hub_values(object: &Value) -> Vec<cel::Value> {
        let json = Json::from(RawValue::from_string(object.to_string()).unwrap());
        let every = PolicySet::from_yaml(
            std::path::Path::new("p.yaml"),
            "policies:\n  - {name: all, expression: 'object == object && oldObject == oldObject', message: m}\n",
        )
        .unwrap();
        let written = json.written().unwrap();
        let stored = json.stored().unwrap();
        let from_written = written.decode(Version::V1alpha1).unwrap();
        let from_stored = stored.decode(Version::V1alpha1).unwrap();
        let hubs = [
            Hub::of(&from_written.app).unwrap().unwrap(),
            Hub::of(&from_stored.app).unwrap().unwrap(),
        ];
        let replace: Vec<Vec<Replace<'_>>> = hubs.iter().map(Hub::replacements).collect();
        let converted = objects(
            &every,
            Source {
                json: &json,
                replace: &replace[0],
            },
            Some(Source {
                json: &json,
                replace: &replace[1],
            }),
        );
        vec![
            converted.object.unwrap(),
            converted.old_object.unwrap().unwrap(),
        ]
    }

    /// The hub form is what `/convert` gives for the whole object.
    fn assert_same_as_convert(object: Value) {
        let expected = conversion::convert_object(&object, Version::V1beta1).unwrap();
        let expected = value_to_cel(
            &expected,
            &Projection::whole(),
            crate::review::MAX_POLICY_VALUES,
        )
        .unwrap();
        for hub in hub_values(&object) {
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
            // Only the conversion annotations: none is left in the hub form.
            json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
                   "metadata": {"name": "a", "annotations": {
                       common::names::ANNOTATION_V1BETA1_CANARY: r#"{"image":"docker.io/evil:v1"}"#}},
                   "spec": {"image": "nginx:1", "replicas": 2}}),
        ] {
            assert_same_as_convert(object);
        }
    }
}
