//! The AdmissionReview, decoded once into the shapes the webhook needs.
//!
//! The body is parsed a single time into [`Request`], which borrows `object` and
//! `oldObject` as raw JSON slices of the body: nothing of the object is copied until it
//! is known to be worth it. An object is then checked for size ([`shape`]: list
//! lengths and string lengths, counted without allocating) before it is decoded into
//! the typed [`AppService`] the rules need. Metadata is read only for what the rules
//! use (name, generateName, namespace, and whether the name label is set); managed
//! fields, annotations and status are skipped. So the memory one review costs stays a
//! small multiple of its body whatever its shape, and a hostile object (30,000 env
//! entries, a 3 MiB string, deep nesting) is refused before it is materialised.

use std::fmt;

use common::conversion::Version;
use common::names::{CONVERSION_ANNOTATIONS, LABEL_NAME};
use common::validation::FieldErrors;
use common::{AppService, v1alpha1};
use kube::core::admission::Operation;
use kube::core::{GroupVersionKind, GroupVersionResource, ObjectMeta};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

pub mod hub;
mod shape;

/// The most entries of `spec.resources.limits` or `.requests`: `common`'s bound, which
/// `validate` enforces too; the webhook checks it before decoding.
pub use common::types::MAX_RESOURCE_ENTRIES;
/// The most JSON values (scalars, lists and maps, counted recursively) of an object that
/// CEL policies see. An AppService with 128 env entries and its managed fields has a
/// few thousand; the bound keeps the generic JSON copy the policies need small.
pub const MAX_POLICY_VALUES: usize = 20_000;

/// The request of an AdmissionReview, borrowing the objects from the body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default, borrow)]
    pub object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub old_object: Option<&'a RawValue>,
    #[serde(default)]
    pub dry_run: bool,
}

/// The requesting user, as CEL's `request.userInfo` exposes it.
#[derive(Debug, Default, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub groups: Option<Vec<String>>,
}

/// Which review a body must be: its `kind`, and the only `apiVersion` the API server
/// sends for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReviewKind {
    pub kind: &'static str,
    pub api_version: &'static str,
}

/// A request body that is not a usable review of its kind (AdmissionReview,
/// ConversionReview): answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("request body is not a valid {}: {error}", expected.kind)]
    Decode {
        expected: ReviewKind,
        error: JsonError,
    },
    #[error(
        "unsupported {} {api_version:?} kind {kind:?}: expected {} {}",
        expected.kind, expected.api_version, expected.kind
    )]
    Version {
        expected: ReviewKind,
        api_version: String,
        kind: String,
    },
    #[error("{} has no request", expected.kind)]
    MissingRequest { expected: ReviewKind },
}

/// The envelope of a review: `apiVersion`, `kind` and the request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<R> {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<R>,
}

/// The request of a review body, decoded once (a type error names its JSON path) and
/// known to be of the `expected` kind and version. The request may borrow from `body`.
pub fn decode_review<'de, R: Deserialize<'de>>(
    body: &'de [u8],
    expected: ReviewKind,
) -> Result<R, ReviewError> {
    // serde's derived structs also accept a JSON array; a review is an object.
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(ReviewError::Decode {
            expected,
            error: JsonError(format!("expected a JSON object ({})", expected.kind)),
        });
    }
    let review: Envelope<R> =
        decode_tracked(body).map_err(|error| ReviewError::Decode { expected, error })?;
    if review.api_version != expected.api_version || review.kind != expected.kind {
        return Err(ReviewError::Version {
            expected,
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    review
        .request
        .ok_or(ReviewError::MissingRequest { expected })
}

impl Request<'_> {
    /// The view of this request CEL's `request` variable gets.
    pub fn to_cel_request(&self) -> kube::core::cel::AdmissionRequest {
        use kube::core::cel;
        cel::AdmissionRequest {
            operation: operation_str(&self.operation).to_owned(),
            username: self.user_info.username.clone().unwrap_or_default(),
            uid: self.user_info.uid.clone().unwrap_or_default(),
            groups: self.user_info.groups.clone().unwrap_or_default(),
            name: self.name.clone(),
            namespace: self.namespace.clone().unwrap_or_default(),
            dry_run: self.dry_run,
            kind: cel::GroupVersionKind {
                group: self.kind.group.clone(),
                version: self.kind.version.clone(),
                kind: self.kind.kind.clone(),
            },
            resource: cel::GroupVersionResource {
                group: self.resource.group.clone(),
                version: self.resource.version.clone(),
                resource: self.resource.resource.clone(),
            },
        }
    }
}

/// The wire name of an operation.
pub fn operation_str(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// Whether `metadata.labels` is there and holds the name label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Labels {
    /// No `labels` map (absent or null).
    #[default]
    Absent,
    /// A map; `name_label` is the value of `app.kubernetes.io/name` when set.
    Present { name_label: Option<String> },
}

/// An AppService from a review, decoded for the rules: metadata holds only name,
/// generateName, namespace, (when set) the name label and the conversion annotations
/// (they carry what `v1alpha1` cannot express, which the rules check too).
#[derive(Debug)]
pub struct Object {
    pub app: App,
    pub labels: Labels,
}

/// An AppService in the version the client wrote.
#[derive(Debug, Clone, PartialEq)]
pub enum App {
    V1alpha1(v1alpha1::AppService),
    V1beta1(AppService),
}

impl App {
    /// The object's name, if it has one yet.
    pub fn name(&self) -> Option<&str> {
        match self {
            App::V1alpha1(app) => app.metadata.name.as_deref(),
            App::V1beta1(app) => app.metadata.name.as_deref(),
        }
    }
}

/// Why an object was not decoded.
#[derive(Debug)]
pub enum ObjectError {
    /// A list or string over its bound; every such field, in Kubernetes' format.
    TooLarge(FieldErrors),
    /// Not an AppService: a type error, with its JSON path.
    Invalid(String),
}

impl ObjectError {
    fn invalid(error: JsonError) -> Self {
        ObjectError::Invalid(error.0)
    }
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectError::TooLarge(errors) => errors.fmt(f),
            ObjectError::Invalid(reason) => f.write_str(reason),
        }
    }
}

/// Decodes an AppService of `version` from its raw JSON, checking the bounds first.
pub fn decode_object(raw: &RawValue, version: Version) -> Result<Object, ObjectError> {
    let shell: Shell<'_> = decode_at(raw.get().as_bytes(), "").map_err(ObjectError::invalid)?;
    decode_shell(shell, version)
}

/// Decodes only the spec of an AppService (the stored object of an UPDATE: the update
/// rules compare specs), checking the bounds first; metadata is skipped unread.
pub fn decode_spec_only(raw: &RawValue, version: Version) -> Result<Object, ObjectError> {
    #[derive(Deserialize)]
    struct SpecShell<'a> {
        #[serde(default, borrow)]
        spec: Option<&'a RawValue>,
        // What v1alpha1 cannot express is part of the spec the update rules compare.
        #[serde(default)]
        metadata: AnnotationsOnly,
    }
    #[derive(Default, Deserialize)]
    struct AnnotationsOnly {
        #[serde(default)]
        annotations: ConversionAnnotations,
    }
    let shell: SpecShell<'_> = decode_at(raw.get().as_bytes(), "").map_err(ObjectError::invalid)?;
    decode_shell(
        Shell {
            metadata: Meta {
                annotations: shell.metadata.annotations,
                ..Meta::default()
            },
            spec: shell.spec,
        },
        version,
    )
}

fn decode_shell(shell: Shell<'_>, version: Version) -> Result<Object, ObjectError> {
    let Some(spec) = shell.spec else {
        return Err(ObjectError::Invalid("missing field `spec`".to_owned()));
    };
    if let Some(errors) = shape::oversized(spec) {
        return Err(ObjectError::TooLarge(errors));
    }
    let meta = shell.metadata;
    let mut labels_map = None;
    if let Labels::Present { name_label } = &meta.labels.0 {
        let mut map = std::collections::BTreeMap::new();
        if let Some(value) = name_label {
            map.insert(LABEL_NAME.to_owned(), value.clone());
        }
        labels_map = Some(map);
    }
    let metadata = ObjectMeta {
        name: meta.name,
        generate_name: meta.generate_name,
        namespace: meta.namespace,
        labels: labels_map,
        annotations: (!meta.annotations.0.is_empty()).then_some(meta.annotations.0),
        ..ObjectMeta::default()
    };
    let app = match version {
        Version::V1alpha1 => App::V1alpha1(v1alpha1::AppService {
            metadata,
            spec: typed_spec(spec)?,
            status: None,
        }),
        Version::V1beta1 => App::V1beta1(AppService {
            metadata,
            spec: typed_spec(spec)?,
            status: None,
        }),
    };
    Ok(Object {
        app,
        labels: meta.labels.0,
    })
}

fn typed_spec<S: DeserializeOwned>(spec: &RawValue) -> Result<S, ObjectError> {
    decode_at(spec.get().as_bytes(), "spec").map_err(ObjectError::invalid)
}

/// A JSON document that is not the shape it should be: the error, after its JSON path
/// (`spec.replicas: invalid type: ...`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

/// Decodes `json`, a whole document (a review); an error names its JSON path.
fn decode_tracked<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, JsonError> {
    decode_at(json, "")
}

/// Decodes `json`, found at `prefix` in its document. Path tracking costs on every
/// decode, so only a failed one is run again with it; the tracked pass does not check
/// for trailing characters, so the plain error is kept for that case.
fn decode_at<'de, T: Deserialize<'de>>(json: &'de [u8], prefix: &str) -> Result<T, JsonError> {
    serde_json::from_slice(json)
        .map_err(|plain| JsonError(tracked::<T>(json, prefix).unwrap_or_else(|| plain.to_string())))
}

/// Re-runs a failed decode with path tracking: `path: error`.
fn tracked<'de, T: Deserialize<'de>>(json: &'de [u8], prefix: &str) -> Option<String> {
    let de = &mut serde_json::Deserializer::from_slice(json);
    let err = serde_path_to_error::deserialize::<_, T>(de).err()?;
    let path = err.path().to_string();
    let path = match (prefix.is_empty(), path == ".") {
        (true, true) => String::new(),
        (true, false) => path,
        (false, true) => prefix.to_owned(),
        (false, false) => format!("{prefix}.{path}"),
    };
    Some(if path.is_empty() {
        err.inner().to_string()
    } else {
        format!("{path}: {}", err.inner())
    })
}

/// The object's top level: metadata for the rules, spec kept raw for the checks.
#[derive(Deserialize)]
struct Shell<'a> {
    #[serde(default)]
    metadata: Meta,
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
}

/// The metadata the rules read; everything else is skipped without being stored.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: LabelsField,
    #[serde(default)]
    annotations: ConversionAnnotations,
}

/// The conversion annotations of `metadata.annotations`; every other one is skipped.
#[derive(Default)]
struct ConversionAnnotations(std::collections::BTreeMap<String, String>);

impl<'de> Deserialize<'de> for ConversionAnnotations {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ConversionAnnotations;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_unit<E: de::Error>(self) -> Result<ConversionAnnotations, E> {
                Ok(ConversionAnnotations::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<ConversionAnnotations, E> {
                Ok(ConversionAnnotations::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ConversionAnnotations, A::Error> {
                let mut kept = std::collections::BTreeMap::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if CONVERSION_ANNOTATIONS.contains(&key.as_ref()) {
                        kept.insert(key.into_owned(), map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(ConversionAnnotations(kept))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[derive(Default)]
struct LabelsField(Labels);

impl<'de> Deserialize<'de> for LabelsField {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LabelsField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_unit<E: de::Error>(self) -> Result<LabelsField, E> {
                Ok(LabelsField(Labels::Absent))
            }
            fn visit_none<E: de::Error>(self) -> Result<LabelsField, E> {
                Ok(LabelsField(Labels::Absent))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LabelsField, A::Error> {
                let mut name_label = None;
                while let Some(is_name) = map.next_key_seed(IsKey(LABEL_NAME))? {
                    if is_name {
                        name_label = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(LabelsField(Labels::Present { name_label }))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// A map key compared with a constant, without allocating it.
struct IsKey(&'static str);

impl<'de> DeserializeSeed<'de> for IsKey {
    type Value = bool;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for IsKey {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::types::MAX_ENV_VALUE_LEN;

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap()
    }

    #[test]
    fn decodes_what_the_rules_need_and_skips_the_rest() {
        let object = raw(
            r#"{"apiVersion":"platform.example.com/v1alpha1","kind":"AppService",
            "metadata":{"name":"a","namespace":"n","labels":{"team":"x","app.kubernetes.io/name":"a"},
              "annotations":{"k":"v"},"managedFields":[{"manager":"m","fieldsV1":{"f:spec":{}}}]},
            "spec":{"image":"nginx:1","env":[{"name":"A","value":"1"}],"future":[1,2]},
            "status":{"anything":true}}"#,
        );
        let object = decode_object(&object, Version::V1alpha1).unwrap();
        let App::V1alpha1(app) = &object.app else {
            panic!("not v1alpha1")
        };
        assert_eq!(app.metadata.name.as_deref(), Some("a"));
        assert_eq!(app.metadata.namespace.as_deref(), Some("n"));
        assert_eq!(
            object.labels,
            Labels::Present {
                name_label: Some("a".into())
            }
        );
        assert_eq!(app.metadata.annotations, None);
        assert_eq!(app.spec.env.len(), 1);
        let object = decode_object(
            &raw(r#"{"metadata":{"labels":null},"spec":{"image":"x"}}"#),
            Version::V1beta1,
        )
        .unwrap();
        assert_eq!(object.labels, Labels::Absent);
    }

    #[test]
    fn oversized_lists_and_strings_are_refused_naming_the_limit() {
        let env: Vec<String> = (0..30_000)
            .map(|i| format!(r#"{{"name":"V{i}"}}"#))
            .collect();
        let json = format!(
            r#"{{"metadata":{{"name":"a"}},"spec":{{"image":"x","env":[{}]}}}}"#,
            env.join(",")
        );
        let Err(ObjectError::TooLarge(errors)) = decode_object(&raw(&json), Version::V1beta1)
        else {
            panic!("not refused");
        };
        assert_eq!(
            errors.to_string(),
            "spec.env: Too many: 30000: must have at most 128 items"
        );
        let long = "a".repeat(MAX_ENV_VALUE_LEN + 1);
        let json = format!(
            r#"{{"metadata":{{"name":"a"}},"spec":{{"image":"{}","env":[{{"name":"A","value":"{long}"}}]}}}}"#,
            "b".repeat(600)
        );
        let Err(ObjectError::TooLarge(errors)) = decode_object(&raw(&json), Version::V1beta1)
        else {
            panic!("not refused");
        };
        let text = errors.to_string();
        assert!(text.contains("spec.image: Too long"), "{text}");
        assert!(text.contains("spec.env[0].value: Too long"), "{text}");
        // The canary's image is sized like spec.image.
        let json = format!(
            r#"{{"metadata":{{"name":"a"}},"spec":{{"image":"x","env":[{{"name":"A","value":"{long}"}}],"canary":{{"image":"{}"}}}}}}"#,
            "c".repeat(600)
        );
        let Err(ObjectError::TooLarge(errors)) = decode_object(&raw(&json), Version::V1beta1)
        else {
            panic!("not refused");
        };
        let text = errors.to_string();
        assert!(text.contains("spec.canary.image: Too long"), "{text}");
        assert!(!text.contains("spec.image:"), "{text}");
    }

    #[test]
    fn malformed_reviews_are_refused_for_what_they_are() {
        #[derive(Debug, Deserialize)]
        struct Uid {
            uid: String,
        }
        let kind = ReviewKind {
            kind: "SomeReview",
            api_version: "example.com/v1",
        };
        let decode = |body: &str| decode_review::<Uid>(body.as_bytes(), kind);
        for body in ["{", "[]", " [{}]"] {
            assert!(
                matches!(decode(body), Err(ReviewError::Decode { .. })),
                "{body}"
            );
        }
        let err = decode(r#"{"apiVersion":"example.com/v1","kind":"SomeReview"} x"#).unwrap_err();
        assert!(err.to_string().contains("trailing characters"), "{err}");
        let err =
            decode(r#"{"apiVersion":"example.com/v1","kind":"SomeReview","request":{"uid":1}}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "request body is not a valid SomeReview: request.uid: invalid type: integer `1`, expected a string at line 1 column 69"
        );
        let err = decode(r#"{"apiVersion":"example.com/v2","kind":"SomeReview"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"unsupported SomeReview "example.com/v2" kind "SomeReview": expected example.com/v1 SomeReview"#
        );
        let err = decode(r#"{"apiVersion":"example.com/v1","kind":"SomeReview"}"#).unwrap_err();
        assert_eq!(err.to_string(), "SomeReview has no request");
        assert_eq!(
            decode(r#"{"apiVersion":"example.com/v1","kind":"SomeReview","request":{"uid":"u"}}"#)
                .unwrap()
                .uid,
            "u"
        );
    }

    #[test]
    fn type_errors_carry_their_path() {
        let err = decode_object(
            &raw(r#"{"spec":{"image":"x","replicas":"three"}}"#),
            Version::V1alpha1,
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("spec.replicas: invalid type"),
            "{err}"
        );
        let err =
            decode_object(&raw(r#"{"metadata":{"name":"a"}}"#), Version::V1alpha1).unwrap_err();
        assert_eq!(err.to_string(), "missing field `spec`");
        let err = decode_object(
            &raw(r#"{"metadata":{"name":5},"spec":{}}"#),
            Version::V1alpha1,
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("metadata.name: invalid type"),
            "{err}"
        );
    }
}
