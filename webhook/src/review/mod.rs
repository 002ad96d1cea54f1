//! The AdmissionReview, decoded once into the shapes the webhook needs. This module is
//! the only reader of a review's JSON; what leaves it is decoded.
//!
//! The body is parsed a single time ([`decode_request`]) into [`Request`], the request's
//! fields, and [`Objects`]: `object` and `oldObject` each as a [`Json`], its slice of the
//! body, neither copied nor read yet. A [`Json`] cannot be read outside this module: the
//! admission handlers have each object decoded, once, into what they need of it:
//!
//! * [`Json::written`], [`Json::updated`] and [`Json::stored`] ([`shell`]): one pass over
//!   the object, reading the metadata the rules (and, for an UPDATE, the ratchet) use and
//!   keeping the spec as a slice; managed fields, status and the rest are skipped unread.
//!   The spec is then checked for size ([`shape`]: list lengths and string lengths,
//!   counted without allocating) before it is decoded into the typed [`AppService`] the
//!   rules need ([`shell::Written::decode`]).
//! * [`policy::objects`], only when policies are active: the object converted into the
//!   CEL value the policies read, only their fields, in the hub version ([`hub`], put in
//!   as the JSON is converted).
//! * [`Json::scale`] ([`scale`]): the Scale of a write of the scale subresource.
//!
//! Nothing is written out to be parsed again. So the memory one review costs stays a
//! small multiple of its body whatever its shape, and a hostile object (30,000 env
//! entries, a 3 MiB string, deep nesting) is refused before it is materialised.

use std::fmt;

use bytes::Bytes;
use common::validation::FieldErrors;
use common::{AppService, v1alpha1};
use kube::core::admission::Operation;
use kube::core::{GroupVersionKind, GroupVersionResource};
use serde::Deserialize;
use serde_json::value::RawValue;

pub mod hub;
pub mod policy;
pub mod scale;
mod shape;
pub mod shell;

/// The most entries of `spec.resources.limits` or `.requests`: `common`'s bound, which
/// `validate` enforces too; the webhook checks it before decoding.
pub use common::types::MAX_RESOURCE_ENTRIES;
/// The most JSON values (scalars, lists and maps, counted recursively) of an object that
/// CEL policies see. An AppService with 128 env entries and its managed fields has a
/// few thousand; the bound keeps the CEL copy the policies read small.
pub const MAX_POLICY_VALUES: usize = 20_000;

/// The request of an AdmissionReview: every field but the objects ([`Objects`]).
#[derive(Debug)]
pub struct Request {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    pub sub_resource: Option<String>,
    pub name: String,
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
    pub dry_run: bool,
}

/// The objects of an AdmissionReview request, not yet read.
#[derive(Debug, Default)]
pub struct Objects {
    pub object: Option<Json>,
    pub old_object: Option<Json>,
}

/// One object of a review as its slice of the body (or an object the webhook keeps as
/// JSON: a cached AppService). Only the decoders of this module read it: whatever judges
/// an object gets it decoded, and cannot parse it again.
///
/// ```
/// # use webhook::review::{Json, ObjectError};
/// fn decoded(json: &Json) -> Result<(), ObjectError> {
///     json.written().map(|_| ())
/// }
/// ```
///
/// ```compile_fail
/// # use webhook::review::Json;
/// fn reparse(json: &Json) -> serde_json::Value {
///     serde_json::from_slice(json.bytes()).unwrap()
/// }
/// ```
///
/// ```compile_fail
/// # use webhook::review::Json;
/// fn reparse(json: &Json) -> serde_json::Value {
///     serde_json::from_slice(&json.0).unwrap()
/// }
/// ```
pub struct Json(Bytes);

impl Json {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<Box<RawValue>> for Json {
    fn from(raw: Box<RawValue>) -> Self {
        Json(Bytes::from(String::from(Box::<str>::from(raw))))
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json({} bytes)", self.0.len())
    }
}

/// The request as it is on the wire, borrowing the objects from the body.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest<'a> {
    uid: String,
    kind: GroupVersionKind,
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    operation: Operation,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    old_object: Option<&'a RawValue>,
    #[serde(default)]
    dry_run: bool,
}

/// Parses an AdmissionReview body (of the `expected` kind and version) once: the
/// request's fields, and its objects as slices of `body`, shared, not copied.
pub fn decode_request(
    body: &Bytes,
    expected: ReviewKind,
) -> Result<(Request, Objects), ReviewError> {
    let wire: WireRequest<'_> = decode_review(body, expected)?;
    // The slices were borrowed from `body` by the parse itself.
    let json = |raw: Option<&RawValue>| raw.map(|raw| Json(body.slice_ref(raw.get().as_bytes())));
    let objects = Objects {
        object: json(wire.object),
        old_object: json(wire.old_object),
    };
    let request = Request {
        uid: wire.uid,
        kind: wire.kind,
        resource: wire.resource,
        sub_resource: wire.sub_resource,
        name: wire.name,
        namespace: wire.namespace,
        operation: wire.operation,
        user_info: wire.user_info,
        dry_run: wire.dry_run,
    };
    Ok((request, objects))
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

impl Request {
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

/// An AppService in the version the client wrote. One exists per review and is moved,
/// not copied about, so the versions' difference in size (the hub has more fields) costs
/// nothing worth a box.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "one or two per review, never in a collection: boxing would only add an allocation per review"
)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use common::conversion::Version;
    use common::types::MAX_ENV_VALUE_LEN;

    fn raw(json: &str) -> Json {
        Json::from(RawValue::from_string(json.to_owned()).unwrap())
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
        let object = object.object(Version::V1alpha1).unwrap();
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
        let object = raw(r#"{"metadata":{"labels":null},"spec":{"image":"x"}}"#)
            .object(Version::V1beta1)
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
        let Err(ObjectError::TooLarge(errors)) = raw(&json).object(Version::V1beta1) else {
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
        let Err(ObjectError::TooLarge(errors)) = raw(&json).object(Version::V1beta1) else {
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
        let Err(ObjectError::TooLarge(errors)) = raw(&json).object(Version::V1beta1) else {
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
        let err = raw(r#"{"spec":{"image":"x","replicas":"three"}}"#)
            .object(Version::V1alpha1)
            .unwrap_err();
        assert!(
            err.to_string().starts_with("spec.replicas: invalid type"),
            "{err}"
        );
        let err = raw(r#"{"metadata":{"name":"a"}}"#)
            .object(Version::V1alpha1)
            .unwrap_err();
        assert_eq!(err.to_string(), "missing field `spec`");
        let err = raw(r#"{"metadata":{"name":5},"spec":{}}"#)
            .object(Version::V1alpha1)
            .unwrap_err();
        assert!(
            err.to_string().starts_with("metadata.name: invalid type"),
            "{err}"
        );
    }
}
