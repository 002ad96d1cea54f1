//! `/mutate`: `common`'s defaults as a JSON patch of add operations.

use common::{AppService, defaults, v1alpha1};
use json_patch::{Patch, PatchOperation};
use kube::core::admission::AdmissionResponse;

use super::{Review, Subject, allow, bad_request, internal_error, object_error, present};
use crate::review::App;

/// Why no defaults patch could be made: a fault of the webhook, never of the object.
#[derive(Debug, thiserror::Error)]
pub enum DefaultsError {
    #[error("{0}")]
    Serialize(serde_json::Error),
    #[error("defaulting produced a non-add operation: {0}")]
    NotAdd(PatchOperation),
}

/// `/mutate`: the JSON patch that applies `common`'s defaults, or no patch at all when the
/// object is already defaulted.
pub fn mutate(review: &Review) -> AdmissionResponse {
    let req = &review.request;
    let (version, objects) = match &review.subject {
        Subject::Write { version, objects } => (*version, objects),
        Subject::Refused(message) => return *bad_request(req, message.clone()),
        // Nothing to default on a Scale: its replicas are always set.
        Subject::Scale(_) | Subject::PassThrough => return allow(req),
    };
    let object = match present(req, objects.object.as_ref(), "object").and_then(|json| {
        json.object(version)
            .map_err(|e| object_error(req, "object", version, e))
    }) {
        Ok(object) => object,
        Err(response) => return *response,
    };
    let patch = match &object.app {
        App::V1alpha1(app) => defaults_patch_v1alpha1(app),
        App::V1beta1(app) => defaults_patch(app),
    };
    let patch = match patch {
        Ok(patch) => patch,
        Err(error) => {
            tracing::error!(%error, "defaults patch does not apply to the incoming object");
            return internal_error(req, &error.to_string());
        }
    };
    let response = allow(req);
    if patch.0.is_empty() {
        return response;
    }
    match response.with_patch(patch) {
        Ok(response) => response,
        Err(error) => internal_error(req, &error.to_string()),
    }
}

/// The patch from `app` (as [`crate::review`] decodes it) to its defaulted form.
///
/// The diff is taken between the typed object and the typed, defaulted object, so both
/// sides went through the same serialization: a field the user wrote in an equivalent
/// form appears identically on both sides and yields no operation, and fields the types
/// do not hold are never touched. The decoded metadata keeps whether `labels` exists, so
/// a label lands in the existing map or brings a new one. Defaulting only fills absent
/// fields, so only `add` operations are allowed; anything else is an internal error.
pub fn defaults_patch(app: &AppService) -> Result<Patch, DefaultsError> {
    let mut defaulted = app.clone();
    defaults::default_object(&mut defaulted);
    add_only_patch(app, &defaulted)
}

/// [`defaults_patch`] for a `v1alpha1` object: that version's defaults, in its shape.
pub fn defaults_patch_v1alpha1(app: &v1alpha1::AppService) -> Result<Patch, DefaultsError> {
    let mut defaulted = app.clone();
    defaults::default_v1alpha1_object(&mut defaulted);
    add_only_patch(app, &defaulted)
}

fn add_only_patch<T: serde::Serialize + PartialEq>(
    app: &T,
    defaulted: &T,
) -> Result<Patch, DefaultsError> {
    if defaulted == app {
        return Ok(Patch(Vec::new()));
    }
    let before = serde_json::to_value(app).map_err(DefaultsError::Serialize)?;
    let after = serde_json::to_value(defaulted).map_err(DefaultsError::Serialize)?;
    let patch = json_patch::diff(&before, &after);
    if let Some(op) = patch
        .0
        .iter()
        .find(|op| !matches!(op, PatchOperation::Add(_)))
    {
        return Err(DefaultsError::NotAdd(op.clone()));
    }
    Ok(patch)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{app, decoded, review};
    use super::*;
    use serde_json::{Value, json};

    fn patch_of(response: &AdmissionResponse) -> Value {
        serde_json::from_slice(response.patch.as_deref().unwrap_or(b"[]")).unwrap()
    }

    #[test]
    fn defaults_are_added_and_nothing_else() {
        let object = json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "AppService",
            "metadata": {"name": "checkout", "namespace": "shop", "labels": {"team": "payments"},
                         "creationTimestamp": null, "futureMetadataField": {"x": 1}},
            "spec": {"image": "nginx:1.27", "futureField": [1, 2], "resources": {"limits": {"cpu": "1000m"}},
                     "env": [], "database": {"class": "x"}},
            "status": {"unknownStatus": true}
        });
        let req = decoded(review("CREATE", object.clone(), None));
        let response = mutate(&req);
        assert!(response.allowed);
        let mut ops: Vec<Value> = serde_json::from_value(patch_of(&response)).unwrap();
        ops.sort_by_key(|op| op["path"].as_str().unwrap_or_default().to_owned());
        assert_eq!(
            ops,
            vec![
                json!({"op": "add", "path": "/metadata/labels/app.kubernetes.io~1name", "value": "checkout"}),
                json!({"op": "add", "path": "/spec/port", "value": 8080}),
                json!({"op": "add", "path": "/spec/replicas", "value": 1}),
            ]
        );
        // Applying it keeps every unknown and equivalently-written field.
        let mut patched = object.clone();
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<Patch>(patch_of(&response)).unwrap(),
        )
        .unwrap();
        assert_eq!(patched["spec"]["futureField"], json!([1, 2]));
        assert_eq!(patched["spec"]["resources"]["limits"]["cpu"], "1000m");
        assert_eq!(patched["spec"]["env"], json!([]));
        assert_eq!(patched["spec"]["database"], json!({"class": "x"}));
        assert_eq!(patched["metadata"]["futureMetadataField"], json!({"x": 1}));
        assert_eq!(patched["metadata"]["labels"]["team"], "payments");
    }

    #[test]
    fn defaulted_object_gets_no_patch() {
        let object = app(json!({"image": "nginx:1.27"}));
        let req = decoded(review("CREATE", object.clone(), None));
        let first = mutate(&req);
        let mut patched = object;
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<Patch>(patch_of(&first)).unwrap(),
        )
        .unwrap();
        let again = mutate(&decoded(review("CREATE", patched, None)));
        assert!(again.allowed);
        assert_eq!(again.patch, None, "second pass must not patch");
    }

    #[test]
    fn labels_absent_or_null_get_a_whole_map() {
        for labels in [None, Some(Value::Null)] {
            let mut object = app(json!({"image": "nginx:1.27", "replicas": 2, "port": 80}));
            if let Some(labels) = labels {
                object["metadata"]["labels"] = labels;
            }
            let response = mutate(&decoded(review("UPDATE", object.clone(), Some(object))));
            assert_eq!(
                patch_of(&response),
                json!([{"op": "add", "path": "/metadata/labels", "value": {"app.kubernetes.io/name": "checkout"}}])
            );
        }
    }

    #[test]
    fn user_name_label_and_generate_name_are_respected() {
        let mut object = app(json!({"image": "nginx:1.27", "replicas": 0, "port": 80}));
        object["metadata"]["labels"] = json!({"app.kubernetes.io/name": "shop"});
        assert_eq!(mutate(&decoded(review("CREATE", object, None))).patch, None);

        let generated = json!({"apiVersion": "platform.example.com/v1alpha1", "kind": "AppService",
            "metadata": {"generateName": "checkout-"}, "spec": {"image": "nginx:1.27"}});
        let response = mutate(&decoded(review("CREATE", generated, None)));
        let paths: Vec<String> = patch_of(&response)
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["path"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(paths.len(), 2);
        assert!(paths.iter().all(|p| p.starts_with("/spec/")), "{paths:?}");
    }
}
