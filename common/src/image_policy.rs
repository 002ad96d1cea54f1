//! The `ImagePolicy` API (`platform.example.com/v1alpha1`, cluster-scoped): which images
//! must be signed, by which keys, in which namespaces.
//!
//! A policy names images by glob patterns on their repository ([`Pattern`]), optionally
//! only in namespaces whose labels match `namespaceSelector`, and lists cosign ECDSA P-256
//! public keys, inline or from a Secret in the operator's namespace. An image is governed
//! by every policy that matches it; it passes when, for each `Enforce` policy among them,
//! one of that policy's keys verifies a signature of its digest (keys are alternatives
//! within a policy, policies add up). `Audit` policies are verified and reported the
//! same way and never hold a rollout back.
//!
//! The verification itself (registry, signatures, keys) is the controller's; this module
//! holds the API, its bounds and the pure matching rules, so the webhook can answer from
//! the same rules without calling out.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::{Expression, Selector, SelectorExt};
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::image;

/// Bounds of a policy: image patterns, keys, a pattern's length, a PEM key's length (a
/// P-256 public key is 178 bytes of PEM; 4 KiB leaves room for comments and CRLFs).
pub const MAX_IMAGE_PATTERNS: usize = 64;
pub const MAX_KEYS: usize = 16;
pub const MAX_PATTERN_LEN: usize = 512;
pub const MAX_PUBLIC_KEY_LEN: usize = 4096;
/// Bounds of `namespaceSelector`: expressions, `matchLabels` entries, values of one
/// expression, a label key (a DNS prefix of 253 characters, '/', a name of 63) and a
/// label value. Kubernetes' own selectors are bounded by the request size only; the
/// schema needs bounds so the API server's estimate of its CEL rules' cost stays within
/// budget, and every list here has one.
pub const MAX_SELECTOR_EXPRESSIONS: usize = 16;
pub const MAX_SELECTOR_LABELS: usize = 16;
pub const MAX_SELECTOR_VALUES: usize = 64;
pub const MAX_LABEL_KEY_LEN: usize = 317;
pub const MAX_LABEL_VALUE_LEN: usize = 63;
/// The operators of a label selector's expressions.
pub const SELECTOR_OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];
/// Key of the public key in a Secret unless the policy says otherwise (cosign's file name).
pub const DEFAULT_PUBLIC_KEY_KEY: &str = "cosign.pub";
/// Condition type on a policy: every key parsed and every Secret it names was read.
pub const READY: &str = "Ready";

/// Images that must be signed, and the keys that may sign them.
// Several printer columns share a type; clippy reads them as one repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "platform.example.com",
    version = "v1alpha1",
    kind = "ImagePolicy",
    plural = "imagepolicies",
    shortname = "imgpol",
    category = "platform",
    status = "ImagePolicyStatus",
    derive = "PartialEq",
    doc = "Images that AppServices may run only when signed by one of the listed cosign keys (cluster-scoped, configured by cluster admins).",
    printcolumn(
        name = "Mode",
        type_ = "string",
        description = "Enforce holds unsigned images back; Audit only reports them",
        json_path = ".spec.mode"
    ),
    printcolumn(
        name = "Images",
        type_ = "string",
        description = "The first image pattern",
        json_path = ".spec.images[0].glob"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Status of the Ready condition (keys parsed)",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ImagePolicySpec {
    /// The images the policy governs: glob patterns on the repository, registry host
    /// included (`registry.example.com/team-*/**`, `docker.io/library/nginx`). `*`
    /// matches within one path component, `**` across components; tags and digests are
    /// not part of a pattern.
    #[schemars(length(min = 1, max = MAX_IMAGE_PATTERNS))]
    pub images: Vec<ImagePattern>,

    /// Only AppServices in namespaces whose labels match are governed. Absent: every
    /// namespace. At most 16 `matchExpressions` and 16 `matchLabels`; `In` and `NotIn`
    /// need values (at most 64), `Exists` and `DoesNotExist` take none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "namespace_selector_schema")]
    pub namespace_selector: Option<LabelSelector>,

    /// `Enforce` (the default): an image without a valid signature does not run, and the
    /// last verified digest keeps running. `Audit`: it runs, and status and metrics say it
    /// failed verification.
    #[serde(default)]
    pub mode: PolicyMode,

    /// What happens to a workload whose running digest fails this `Enforce` policy (its
    /// signature deleted at the registry, or the policy created over an image that runs
    /// unsigned). `KeepRunning` (the default): it keeps running, pinned, and nothing new
    /// rolls it out. `ScaleToZero`: its Deployments are scaled to zero until it verifies.
    #[serde(default)]
    pub on_running_failure: RunningFailure,

    /// The keys whose signature is accepted (any one of them suffices).
    #[schemars(length(min = 1, max = MAX_KEYS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub keys: Vec<PolicyKey>,
}

/// One image pattern.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("!self.glob.contains('***')").message("'***' is not a glob: use '*' within a path component or '**' across them"))]
#[x_kube(validation = Rule::new("self.glob.split('/')[0].contains('.') || self.glob.split('/')[0].contains(':') || self.glob.split('/')[0].contains('*') || self.glob.split('/')[0] == 'localhost'").message("the first component is not a registry host: write the registry, as in docker.io/library/nginx"))]
pub struct ImagePattern {
    /// Glob on the repository, registry host first (a port only after the host; no tag,
    /// no digest).
    #[schemars(length(min = 1, max = MAX_PATTERN_LEN), regex(pattern = r"^[a-z0-9._*-]+(:[0-9*]+)?(/[a-z0-9._*-]+)*$"))]
    pub glob: String,
}

/// What a failed verification does.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PolicyMode {
    #[default]
    Enforce,
    Audit,
}

/// What an `Enforce` policy does to a workload whose running digest fails it.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RunningFailure {
    #[default]
    KeepRunning,
    ScaleToZero,
}

/// A cosign public key: exactly one of `publicKey` and `secretRef`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(validation = Rule::new("has(self.publicKey) != has(self.secretRef)").message("set exactly one of publicKey and secretRef"))]
#[serde(rename_all = "camelCase")]
pub struct PolicyKey {
    /// Name of the key, as status reports which key verified an image.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The PEM public key (`-----BEGIN PUBLIC KEY-----`, ECDSA P-256, as `cosign
    /// generate-key-pair` writes `cosign.pub`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_PUBLIC_KEY_LEN))]
    pub public_key: Option<String>,
    /// The key from a Secret in the operator's namespace (for keys rotated by another
    /// system).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<PublicKeySecretRef>,
}

/// A key of a Secret in the operator's namespace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublicKeySecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = crate::types::MAX_SUBDOMAIN_LEN))]
    pub name: String,
    /// Key holding the PEM public key. Defaults to `cosign.pub`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl PublicKeySecretRef {
    pub fn key(&self) -> &str {
        self.key.as_deref().unwrap_or(DEFAULT_PUBLIC_KEY_KEY)
    }
}

/// What the controller last observed of the policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImagePolicyStatus {
    /// The `metadata.generation` the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: whether every key parsed (and every Secret named was read), and if not,
    /// which key and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Why a pattern is not usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("the pattern is empty")]
    Empty,
    #[error("the pattern is longer than {MAX_PATTERN_LEN} characters")]
    TooLong,
    #[error(
        "{0:?} may not appear in a pattern (a repository glob: [a-z0-9._-], '/', '*', and a port after the host)"
    )]
    Character(char),
    #[error("'***' is not a glob: use '*' within a path component or '**' across them")]
    TripleStar,
    #[error("an empty path component")]
    EmptyComponent,
    #[error("{0:?}: a port after the host is digits")]
    Port(String),
    #[error(
        "the first component {0:?} is not a registry host: write the registry, as in docker.io/library/nginx"
    )]
    NoRegistry(String),
}

/// A parsed repository glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern(String);

impl Pattern {
    /// Parses a pattern of `spec.images[].glob`.
    pub fn parse(glob: &str) -> Result<Self, PatternError> {
        if glob.is_empty() {
            return Err(PatternError::Empty);
        }
        if glob.len() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong);
        }
        if let Some(c) = glob.chars().find(|c| {
            !(c.is_ascii_lowercase()
                || c.is_ascii_digit()
                || matches!(c, '.' | '_' | '-' | '/' | '*' | ':'))
        }) {
            return Err(PatternError::Character(c));
        }
        if glob.contains("***") {
            return Err(PatternError::TripleStar);
        }
        let mut components = glob.split('/');
        let host = components.next().unwrap_or_default();
        if components.clone().any(|c| c.is_empty()) || host.is_empty() {
            return Err(PatternError::EmptyComponent);
        }
        if let Some(c) = components.clone().flat_map(str::chars).find(|c| *c == ':') {
            return Err(PatternError::Character(c));
        }
        // A port is digits (or a glob) after the host's one ':', as the schema's pattern says.
        if let Some((_, port)) = host.split_once(':')
            && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit() || b == b'*'))
        {
            return Err(PatternError::Port(host.to_owned()));
        }
        if !(image::is_registry_host(host) || host.contains('*')) {
            return Err(PatternError::NoRegistry(host.to_owned()));
        }
        // The host spelled as `image::repository` spells it, so that `127.0.0.1:5000/*`
        // governs `localhost:5000/app` and `[::1]:5000/app` (one registry, one policy). A
        // host with a `*` is a glob over hosts already spelled that way.
        if host.contains('*') {
            return Ok(Pattern(glob.to_owned()));
        }
        let path = &glob[host.len()..];
        Ok(Pattern(format!("{}{path}", image::normalize_host(host))))
    }

    /// Whether the normalized repository `repo` (as [`image::repository`] gives it)
    /// matches: `*` is any run of characters but `/`, `**` any run at all.
    pub fn matches(&self, repo: &str) -> bool {
        glob_match(self.0.as_bytes(), repo.as_bytes())
    }

    /// The pattern, its host normalized ([`image::normalize_host`]).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Glob matching by dynamic programming over (pattern, text) positions: linear space,
/// `O(pattern × text)` time, both bounded (512 × 255), and no backtracking blow-up.
fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    // Tokens: a literal byte, `*` (no '/'), `**` (anything).
    #[derive(Clone, Copy)]
    enum Token {
        Byte(u8),
        Star,
        DoubleStar,
    }
    let mut tokens = Vec::with_capacity(pattern.len());
    let mut i = 0;
    while i < pattern.len() {
        if pattern[i] == b'*' {
            if pattern.get(i + 1) == Some(&b'*') {
                tokens.push(Token::DoubleStar);
                i += 2;
            } else {
                tokens.push(Token::Star);
                i += 1;
            }
        } else {
            tokens.push(Token::Byte(pattern[i]));
            i += 1;
        }
    }
    // reach[j]: the tokens so far can consume exactly text[..j].
    let mut reach = vec![false; text.len() + 1];
    reach[0] = true;
    for token in tokens {
        let mut next = vec![false; text.len() + 1];
        match token {
            Token::Byte(b) => {
                for j in 0..text.len() {
                    next[j + 1] = reach[j] && text[j] == b;
                }
            }
            Token::Star | Token::DoubleStar => {
                let crosses = matches!(token, Token::DoubleStar);
                for j in 0..=text.len() {
                    next[j] =
                        reach[j] || (j > 0 && next[j - 1] && (crosses || text[j - 1] != b'/'));
                }
            }
        }
        reach = next;
    }
    reach[text.len()]
}

/// Why a `namespaceSelector` cannot be evaluated: Kubernetes' rules for a label
/// selector, and this API's bounds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("matchExpressions: must have at most {MAX_SELECTOR_EXPRESSIONS} items")]
    TooManyExpressions,
    #[error("matchLabels: must have at most {MAX_SELECTOR_LABELS} entries")]
    TooManyLabels,
    #[error("matchLabels: a key may not be more than {MAX_LABEL_KEY_LEN} characters")]
    LabelKeyTooLong,
    #[error("matchLabels[{0}]: a value may not be more than {MAX_LABEL_VALUE_LEN} characters")]
    LabelValueTooLong(String),
    #[error("matchExpressions[{0}].key: may not be more than {MAX_LABEL_KEY_LEN} characters")]
    KeyTooLong(usize),
    #[error(
        "matchExpressions[{0}].operator: {1:?} is not a valid selector operator (In, NotIn, Exists, DoesNotExist)"
    )]
    Operator(usize, String),
    #[error("matchExpressions[{0}].values: {VALUES_REQUIRED}")]
    ValuesRequired(usize),
    #[error("matchExpressions[{0}].values: {VALUES_FORBIDDEN}")]
    ValuesForbidden(usize),
    #[error("matchExpressions[{0}].values: must have at most {MAX_SELECTOR_VALUES} items")]
    TooManyValues(usize),
    #[error(
        "matchExpressions[{0}].values[{1}]: may not be more than {MAX_LABEL_VALUE_LEN} characters"
    )]
    ValueTooLong(usize, usize),
}

/// The messages of the rules the schema states in CEL.
const VALUES_REQUIRED: &str = "must be non-empty when operator is In or NotIn";
const VALUES_FORBIDDEN: &str = "must be empty when operator is Exists or DoesNotExist";

/// `namespaceSelector` as [`refusal`] and [`ImagePolicy::governs`] read it and the CRD's
/// schema states it: Kubernetes' rules for a label selector (an operator among
/// [`SELECTOR_OPERATORS`]; values for `In` and `NotIn`, none for `Exists` and
/// `DoesNotExist`) and the bounds of this API. kube's `Selector::try_from` is laxer (`In`
/// with `[]` selects nothing, values of `Exists` are ignored), so a policy it accepts
/// could select other namespaces than its author meant. Label keys and values are not
/// checked for their syntax: a key no namespace can carry selects as any other absent
/// key does. Lengths are counted in characters, as the API server counts them.
pub fn parse_selector(selector: &LabelSelector) -> Result<Selector, SelectorError> {
    let labels = selector.match_labels.as_ref();
    let requirements = selector.match_expressions.as_deref().unwrap_or_default();
    if requirements.len() > MAX_SELECTOR_EXPRESSIONS {
        return Err(SelectorError::TooManyExpressions);
    }
    if labels.is_some_and(|l| l.len() > MAX_SELECTOR_LABELS) {
        return Err(SelectorError::TooManyLabels);
    }
    let mut expressions = Vec::new();
    for (key, value) in labels.into_iter().flatten() {
        if key.chars().count() > MAX_LABEL_KEY_LEN {
            return Err(SelectorError::LabelKeyTooLong);
        }
        if value.chars().count() > MAX_LABEL_VALUE_LEN {
            return Err(SelectorError::LabelValueTooLong(key.clone()));
        }
        expressions.push(Expression::Equal(key.clone(), value.clone()));
    }
    for (i, r) in requirements.iter().enumerate() {
        if r.key.chars().count() > MAX_LABEL_KEY_LEN {
            return Err(SelectorError::KeyTooLong(i));
        }
        let values = r.values.as_deref().unwrap_or_default();
        if values.len() > MAX_SELECTOR_VALUES {
            return Err(SelectorError::TooManyValues(i));
        }
        if let Some(j) = values
            .iter()
            .position(|v| v.chars().count() > MAX_LABEL_VALUE_LEN)
        {
            return Err(SelectorError::ValueTooLong(i, j));
        }
        let key = r.key.clone();
        let set = || values.iter().cloned().collect();
        expressions.push(match r.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => return Err(SelectorError::ValuesRequired(i)),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError::ValuesForbidden(i));
            }
            "In" => Expression::In(key, set()),
            "NotIn" => Expression::NotIn(key, set()),
            "Exists" => Expression::Exists(key),
            "DoesNotExist" => Expression::DoesNotExist(key),
            other => return Err(SelectorError::Operator(i, other.to_owned())),
        });
    }
    Ok(expressions.into_iter().collect())
}

/// The schema of `namespaceSelector`: a `LabelSelector` whose rules and bounds are
/// [`parse_selector`]'s, so the API server refuses at write time what it refuses.
fn namespace_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "nullable": true,
        "properties": {
            "matchExpressions": {
                "description": "Requirements on the namespace's labels, ANDed.",
                "type": "array",
                "maxItems": MAX_SELECTOR_EXPRESSIONS,
                "items": {
                    "description": "A label key, an operator and values.",
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "description": "The label key the requirement applies to.",
                            "type": "string",
                            "maxLength": MAX_LABEL_KEY_LEN,
                        },
                        "operator": {
                            "description": "The key's relationship to the values: In, NotIn, Exists or DoesNotExist.",
                            "type": "string",
                            "enum": SELECTOR_OPERATORS,
                        },
                        "values": {
                            "description": "Non-empty for In and NotIn, empty for Exists and DoesNotExist.",
                            "type": "array",
                            "maxItems": MAX_SELECTOR_VALUES,
                            "items": {"type": "string", "maxLength": MAX_LABEL_VALUE_LEN},
                        },
                    },
                    "x-kubernetes-validations": [
                        {
                            "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                            "message": format!("values {VALUES_REQUIRED}"),
                            "fieldPath": ".values",
                        },
                        {
                            "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
                            "message": format!("values {VALUES_FORBIDDEN}"),
                            "fieldPath": ".values",
                        },
                    ],
                },
            },
            "matchLabels": {
                "description": "Labels the namespace must have, with these values.",
                "type": "object",
                "maxProperties": MAX_SELECTOR_LABELS,
                "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE_LEN},
                "x-kubernetes-validations": [{
                    "rule": format!("self.all(k, size(k) <= {MAX_LABEL_KEY_LEN})"),
                    "message": format!("a key may not be more than {MAX_LABEL_KEY_LEN} characters"),
                }],
            },
        },
    })
}

/// Why a policy may not be used at all, or `None`. The API server holds the bounds and
/// the key's one-of for new writes (the CRD's schema and CEL rules); the controller
/// applies this to every policy it reads, including ones stored before a rule existed.
/// Keys are parsed by the controller (it is the one that verifies).
pub fn refusal(spec: &ImagePolicySpec) -> Option<String> {
    for (i, p) in spec.images.iter().enumerate() {
        if let Err(e) = Pattern::parse(&p.glob) {
            return Some(format!("images[{i}].glob {:?}: {e}", p.glob));
        }
    }
    if let Some(selector) = &spec.namespace_selector
        && let Err(e) = parse_selector(selector)
    {
        return Some(format!("namespaceSelector.{e}"));
    }
    for (i, k) in spec.keys.iter().enumerate() {
        if k.public_key.is_some() == k.secret_ref.is_some() {
            return Some(format!(
                "keys[{i}] ({}): set exactly one of publicKey and secretRef",
                k.name
            ));
        }
    }
    None
}

impl ImagePolicy {
    /// Whether the policy's `namespaceSelector` selects a namespace with `labels` (no
    /// selector, or one [`parse_selector`] refuses, selects every namespace, as in
    /// [`ImagePolicy::governs`]).
    pub fn selects_namespace(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.spec.namespace_selector {
            Some(selector) => parse_selector(selector).map_or(true, |s| s.matches(labels)),
            None => true,
        }
    }

    /// Whether the policy governs `image` (any reference form) run in a namespace with
    /// `labels`. A policy that cannot be evaluated governs every image it could govern:
    /// a `namespaceSelector` that [`parse_selector`] refuses selects every namespace, a
    /// glob that [`Pattern::parse`] refuses matches every repository. The controller then
    /// finds [`refusal`] non-empty and, under `Enforce`, holds those images back
    /// (`ImagePolicyNotUsable`): a policy broken by a typo fails closed instead of
    /// letting every image through.
    pub fn governs(&self, image: &str, labels: &BTreeMap<String, String>) -> bool {
        let Ok(repo) = image::repository(image) else {
            return false;
        };
        if let Some(selector) = &self.spec.namespace_selector
            && let Ok(selector) = parse_selector(selector)
            && !selector.matches(labels)
        {
            return false;
        }
        self.spec
            .images
            .iter()
            .any(|p| Pattern::parse(&p.glob).map_or(true, |p| p.matches(&repo)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn policy(spec: serde_json::Value) -> ImagePolicy {
        ImagePolicy::new("p", serde_json::from_value(spec).unwrap())
    }

    const KEY: &str = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";

    #[test]
    fn a_policy_selects_the_namespaces_its_selector_matches_and_every_one_without() {
        let labels = |name: &str| {
            BTreeMap::from([("kubernetes.io/metadata.name".to_owned(), name.to_owned())])
        };
        let scoped = policy(json!({
            "images": [{"glob": "registry.example.com/**"}],
            "keys": [{"name": "release", "secretRef": {"name": "signing"}}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}
        }));
        assert!(scoped.selects_namespace(&labels("shop")));
        assert!(!scoped.selects_namespace(&labels("other")));
        let everywhere = policy(json!({
            "images": [{"glob": "registry.example.com/**"}],
            "keys": [{"name": "release", "secretRef": {"name": "signing"}}]
        }));
        assert!(everywhere.selects_namespace(&labels("other")));
    }

    #[test]
    fn defaults_of_a_minimal_spec() {
        let p = policy(json!({
            "images": [{"glob": "registry.example.com/**"}],
            "keys": [{"name": "release", "secretRef": {"name": "signing"}}]
        }));
        assert_eq!(p.spec.mode, PolicyMode::Enforce);
        assert_eq!(
            p.spec.keys[0].secret_ref.as_ref().unwrap().key(),
            DEFAULT_PUBLIC_KEY_KEY
        );
        assert!(p.spec.namespace_selector.is_none());
        assert_eq!(refusal(&p.spec), None);
    }

    #[test]
    fn patterns_match_components_and_across() {
        for (glob, repo, want) in [
            (
                "registry.example.com/team/app",
                "registry.example.com/team/app",
                true,
            ),
            (
                "registry.example.com/team/app",
                "registry.example.com/team/app2",
                false,
            ),
            (
                "registry.example.com/team/*",
                "registry.example.com/team/app",
                true,
            ),
            (
                "registry.example.com/team/*",
                "registry.example.com/team/a/b",
                false,
            ),
            (
                "registry.example.com/team/**",
                "registry.example.com/team/a/b",
                true,
            ),
            (
                "registry.example.com/team-*/*",
                "registry.example.com/team-x/app",
                true,
            ),
            (
                "registry.example.com/team-*/*",
                "registry.example.com/teamx/app",
                false,
            ),
            (
                "registry.example.com/**",
                "registry.example.com.evil.io/app",
                false,
            ),
            ("*.example.com/**", "registry.example.com/app", true),
            ("*.example.com/**", "a.b.example.com/app", true),
            ("**", "docker.io/library/nginx", true),
            ("localhost:5000/*", "localhost:5000/app", true),
            ("localhost:5000/*", "localhost:5001/app", false),
            ("docker.io/library/nginx", "docker.io/library/nginx", true),
        ] {
            let p = Pattern::parse(glob).unwrap_or_else(|e| panic!("{glob}: {e}"));
            assert_eq!(p.matches(repo), want, "{glob} ~ {repo}");
        }
    }

    #[test]
    fn refused_patterns() {
        let long = format!("registry.example.com/{}", "a".repeat(MAX_PATTERN_LEN));
        for (glob, err) in [
            ("", PatternError::Empty),
            (long.as_str(), PatternError::TooLong),
            ("Registry.example.com/app", PatternError::Character('R')),
            ("registry.example.com/app:v1", PatternError::Character(':')),
            (
                "registry.example.com/app@sha256",
                PatternError::Character('@'),
            ),
            ("registry.example.com/a?", PatternError::Character('?')),
            ("registry.example.com/***", PatternError::TripleStar),
            ("registry.example.com//app", PatternError::EmptyComponent),
            ("registry.example.com/", PatternError::EmptyComponent),
            ("localhost:/app", PatternError::Port("localhost:".into())),
            (
                "registry.example.com:abc/app",
                PatternError::Port("registry.example.com:abc".into()),
            ),
            ("a:1:2/app", PatternError::Port("a:1:2".into())),
            ("nginx", PatternError::NoRegistry("nginx".into())),
            ("library/nginx", PatternError::NoRegistry("library".into())),
        ] {
            assert_eq!(Pattern::parse(glob), Err(err), "{glob:?}");
        }
    }

    #[test]
    fn a_long_hostile_pattern_stays_linear() {
        // 256 stars against a 255-byte name that almost matches: a backtracking matcher
        // would explore an exponential number of splits.
        let glob = format!("registry.example.com/{}b", "*a".repeat(200));
        let p = Pattern::parse(&glob).unwrap();
        let repo = format!("registry.example.com/{}", "a".repeat(230));
        assert!(!p.matches(&repo));
    }

    #[test]
    fn governs_by_repository_and_namespace() {
        let p = policy(json!({
            "images": [{"glob": "docker.io/library/*"}, {"glob": "registry.example.com/shop/**"}],
            "namespaceSelector": {"matchLabels": {"tier": "prod"}},
            "keys": [{"name": "k", "publicKey": KEY}]
        }));
        let prod = BTreeMap::from([("tier".to_owned(), "prod".to_owned())]);
        let dev = BTreeMap::from([("tier".to_owned(), "dev".to_owned())]);
        let sha = "a".repeat(64);
        assert!(
            p.governs("nginx", &prod),
            "short names are Docker Hub's library"
        );
        assert!(p.governs("nginx:1.27", &prod));
        assert!(p.governs("docker.io/library/nginx", &prod));
        assert!(
            p.governs(&format!("nginx@sha256:{sha}"), &prod),
            "a digest does not bypass"
        );
        assert!(p.governs("registry.example.com/shop/a/b:v1", &prod));
        assert!(!p.governs("nginx", &dev), "another namespace");
        assert!(
            !p.governs("bitnami/nginx", &prod),
            "docker.io/bitnami/nginx"
        );
        assert!(!p.governs("registry.example.com/other:v1", &prod));
        assert!(!p.governs("not a reference", &prod));

        let everywhere = policy(json!({
            "images": [{"glob": "**"}], "keys": [{"name": "k", "publicKey": KEY}]
        }));
        assert!(everywhere.governs("anything.io/x", &BTreeMap::new()));
    }

    #[test]
    fn refusals_name_the_field() {
        let bad_glob = policy(json!({
            "images": [{"glob": "registry.example.com/ok"}, {"glob": "nginx"}],
            "keys": [{"name": "k", "publicKey": KEY}]
        }));
        assert!(
            refusal(&bad_glob.spec)
                .unwrap()
                .starts_with("images[1].glob")
        );
        // Fails closed: the glob that does not parse matches every repository.
        assert!(bad_glob.governs("registry.example.com/nginx", &BTreeMap::new()));
        assert!(bad_glob.governs("nginx", &BTreeMap::new()));

        let both = policy(json!({
            "images": [{"glob": "**"}],
            "keys": [{"name": "k", "publicKey": KEY, "secretRef": {"name": "s"}}]
        }));
        assert!(refusal(&both.spec).unwrap().contains("exactly one"));
        let neither = policy(json!({"images": [{"glob": "**"}], "keys": [{"name": "k"}]}));
        assert!(refusal(&neither.spec).unwrap().contains("keys[0] (k)"));

        let bad_selector = policy(json!({
            "images": [{"glob": "**"}],
            "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Sometimes"}]},
            "keys": [{"name": "k", "publicKey": KEY}]
        }));
        assert_eq!(
            refusal(&bad_selector.spec).unwrap(),
            "namespaceSelector.matchExpressions[0].operator: \"Sometimes\" is not a valid selector operator (In, NotIn, Exists, DoesNotExist)"
        );
        // Fails closed: the selector that cannot be evaluated selects every namespace,
        // and the patterns still decide which images.
        assert!(bad_selector.governs("x.io/a", &BTreeMap::new()));
        let narrow = policy(json!({
            "images": [{"glob": "registry.example.com/**"}],
            "namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": []}]},
            "keys": [{"name": "k", "publicKey": KEY}]
        }));
        assert!(refusal(&narrow.spec).unwrap().contains("must be non-empty"));
        let labels = BTreeMap::from([("a".to_owned(), "b".to_owned())]);
        assert!(narrow.governs("registry.example.com/app", &labels));
        assert!(narrow.governs("registry.example.com/app", &BTreeMap::new()));
        assert!(!narrow.governs("other.example.com/app", &labels));
    }

    fn selector(value: serde_json::Value) -> LabelSelector {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn selectors_follow_kubernetes_rules_and_the_bounds() {
        let many = |n: usize| {
            (0..n)
                .map(|i| json!({"key": format!("k{i}"), "operator": "Exists"}))
                .collect::<Vec<_>>()
        };
        let labels = |n: usize| {
            (0..n)
                .map(|i| (format!("k{i}"), json!("v")))
                .collect::<serde_json::Map<_, _>>()
        };
        let values = |n: usize| (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>();
        let key = "k".repeat(MAX_LABEL_KEY_LEN);
        let value = "é".repeat(MAX_LABEL_VALUE_LEN);
        let long_key = "k".repeat(MAX_LABEL_KEY_LEN + 1);
        let long_value = "v".repeat(MAX_LABEL_VALUE_LEN + 1);
        let expression = |op: &str, values: Option<Vec<String>>| {
            let mut e = json!({"key": "tier", "operator": op});
            if let Some(v) = values {
                e["values"] = json!(v);
            }
            selector(json!({"matchExpressions": [e]}))
        };
        for (what, s, want) in [
            ("empty", selector(json!({})), Ok(())),
            ("In", expression("In", Some(values(1))), Ok(())),
            ("NotIn", expression("NotIn", Some(values(2))), Ok(())),
            ("Exists", expression("Exists", None), Ok(())),
            ("Exists, []", expression("Exists", Some(vec![])), Ok(())),
            ("DoesNotExist", expression("DoesNotExist", None), Ok(())),
            (
                "unknown operator",
                expression("Sometimes", Some(values(1))),
                Err(SelectorError::Operator(0, "Sometimes".into())),
            ),
            (
                "lower case",
                expression("in", Some(values(1))),
                Err(SelectorError::Operator(0, "in".into())),
            ),
            (
                "In without values",
                expression("In", None),
                Err(SelectorError::ValuesRequired(0)),
            ),
            (
                "In, []",
                expression("In", Some(vec![])),
                Err(SelectorError::ValuesRequired(0)),
            ),
            (
                "NotIn, []",
                expression("NotIn", Some(vec![])),
                Err(SelectorError::ValuesRequired(0)),
            ),
            (
                "Exists with values",
                expression("Exists", Some(values(1))),
                Err(SelectorError::ValuesForbidden(0)),
            ),
            (
                "DoesNotExist with values",
                expression("DoesNotExist", Some(values(1))),
                Err(SelectorError::ValuesForbidden(0)),
            ),
            (
                "as many expressions as allowed",
                selector(json!({"matchExpressions": many(MAX_SELECTOR_EXPRESSIONS)})),
                Ok(()),
            ),
            (
                "too many expressions",
                selector(json!({"matchExpressions": many(MAX_SELECTOR_EXPRESSIONS + 1)})),
                Err(SelectorError::TooManyExpressions),
            ),
            (
                "as many values as allowed",
                expression("In", Some(values(MAX_SELECTOR_VALUES))),
                Ok(()),
            ),
            (
                "too many values",
                expression("In", Some(values(MAX_SELECTOR_VALUES + 1))),
                Err(SelectorError::TooManyValues(0)),
            ),
            (
                "the longest key and value",
                selector(
                    json!({"matchExpressions": [{"key": key, "operator": "In", "values": [value]}],
                                "matchLabels": {key.clone(): value.clone()}}),
                ),
                Ok(()),
            ),
            (
                "a key too long",
                selector(json!({"matchExpressions": [{"key": long_key, "operator": "Exists"}]})),
                Err(SelectorError::KeyTooLong(0)),
            ),
            (
                "a value too long",
                expression("In", Some(vec!["a".into(), long_value.clone()])),
                Err(SelectorError::ValueTooLong(0, 1)),
            ),
            (
                "as many labels as allowed",
                selector(json!({"matchLabels": labels(MAX_SELECTOR_LABELS)})),
                Ok(()),
            ),
            (
                "too many labels",
                selector(json!({"matchLabels": labels(MAX_SELECTOR_LABELS + 1)})),
                Err(SelectorError::TooManyLabels),
            ),
            (
                "a label key too long",
                selector(json!({"matchLabels": {long_key.clone(): "v"}})),
                Err(SelectorError::LabelKeyTooLong),
            ),
            (
                "a label value too long",
                selector(json!({"matchLabels": {"tier": long_value}})),
                Err(SelectorError::LabelValueTooLong("tier".into())),
            ),
        ] {
            assert_eq!(parse_selector(&s).map(|_| ()), want, "{what}");
        }
    }

    #[test]
    fn parsed_selectors_select_as_kubernetes_does() {
        let s = parse_selector(&selector(json!({
            "matchLabels": {"team": "shop"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["prod", "staging"]},
                {"key": "legacy", "operator": "DoesNotExist"},
                {"key": "region", "operator": "NotIn", "values": ["cn"]},
                {"key": "owner", "operator": "Exists"}
            ]
        })))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let base = [("team", "shop"), ("tier", "prod"), ("owner", "x")];
        assert!(s.matches(&labels(&base)));
        assert!(s.matches(&labels(&[("region", "eu"), base[0], base[1], base[2]])));
        assert!(!s.matches(&labels(&[("region", "cn"), base[0], base[1], base[2]])));
        assert!(!s.matches(&labels(&[("legacy", ""), base[0], base[1], base[2]])));
        assert!(!s.matches(&labels(&[("team", "web"), base[1], base[2]])));
        assert!(!s.matches(&labels(&[base[0], ("tier", "dev"), base[2]])));
        assert!(!s.matches(&labels(&[base[0], base[1]])));
    }

    /// The schema states the rules and bounds of `parse_selector` (the API server's
    /// agreement with it is `e2e/tests/image_policy.rs`).
    #[test]
    fn the_selector_schema_states_the_bounds() {
        let crd = serde_json::to_value(crate::crd::image_policy_crd()).unwrap();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let selector = &spec["properties"]["namespaceSelector"];
        let expressions = &selector["properties"]["matchExpressions"];
        assert_eq!(expressions["maxItems"], MAX_SELECTOR_EXPRESSIONS);
        let item = &expressions["items"]["properties"];
        assert_eq!(item["operator"]["enum"], json!(SELECTOR_OPERATORS));
        assert_eq!(item["key"]["maxLength"], MAX_LABEL_KEY_LEN);
        assert_eq!(item["values"]["maxItems"], MAX_SELECTOR_VALUES);
        assert_eq!(item["values"]["items"]["maxLength"], MAX_LABEL_VALUE_LEN);
        let rules = expressions["items"]["x-kubernetes-validations"].to_string();
        assert!(
            rules.contains(VALUES_REQUIRED) && rules.contains(VALUES_FORBIDDEN),
            "{rules}"
        );
        let labels = &selector["properties"]["matchLabels"];
        assert_eq!(labels["maxProperties"], MAX_SELECTOR_LABELS);
        assert_eq!(
            labels["additionalProperties"]["maxLength"],
            MAX_LABEL_VALUE_LEN
        );
        assert!(
            selector["description"]
                .as_str()
                .unwrap()
                .starts_with("Only AppServices")
        );
        // Every operator the schema allows is one the function reads.
        for op in SELECTOR_OPERATORS {
            let values = (op == "In" || op == "NotIn").then(|| vec!["v".to_owned()]);
            let s = LabelSelector {
                match_expressions: Some(vec![
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                        key: "k".into(),
                        operator: op.into(),
                        values,
                    },
                ]),
                match_labels: None,
            };
            assert!(parse_selector(&s).is_ok(), "{op}");
        }
    }

    #[test]
    fn pattern_hosts_are_spelled_as_repositories_are() {
        for (glob, normalized) in [
            ("127.0.0.1:5000/*", "localhost:5000/*"),
            ("0177.0.0.1:5000/**", "localhost:5000/**"),
            ("2130706433:5000/*", "localhost:5000/*"),
            ("localhost:05000/**", "localhost:5000/**"),
            ("10.1:5000/*", "10.0.0.1:5000/*"),
            ("registry.example.com:443/**", "registry.example.com/**"),
            ("registry.example.com:0443/**", "registry.example.com/**"),
            ("index.docker.io/library/*", "docker.io/library/*"),
            ("registry-1.docker.io/bitnami/*", "docker.io/bitnami/*"),
            // A host with a `*` is a glob over normalized hosts, kept as written.
            ("*.example.com:443/**", "*.example.com:443/**"),
            ("localhost:*/**", "localhost:*/**"),
        ] {
            let p = Pattern::parse(glob).unwrap_or_else(|e| panic!("{glob}: {e}"));
            assert_eq!(p.as_str(), normalized, "{glob}");
        }
        let matches = |glob: &str, image: &str| {
            Pattern::parse(glob)
                .unwrap()
                .matches(&image::repository(image).unwrap())
        };
        for image in [
            "localhost:5000/app",
            "LocalHost:5000/app",
            "[::1]:5000/app",
            "[0:0:0:0:0:0:0:1]:5000/app",
            "[::ffff:7f00:1]:5000/app",
            "127.0.0.1:5000/app",
            "127.1:5000/app",
            "2130706433:5000/app",
            "0x7f.0.0.1:5000/app",
            "0177.0.0.1:5000/app",
            "localhost:05000/app",
        ] {
            assert!(matches("localhost:5000/*", image), "{image}");
            assert!(matches("127.0.0.1:5000/*", image), "{image}");
        }
        assert!(!matches("localhost:5000/*", "localhost:5001/app"));
        assert!(matches(
            "registry.example.com/**",
            "registry.example.com:443/app"
        ));
        assert!(matches(
            "registry.example.com:443/**",
            "Registry.Example.com/app"
        ));
        assert!(matches("index.docker.io/library/*", "nginx"));
        assert!(matches("docker.io/library/*", "index.docker.io/nginx"));
        assert!(matches(
            "docker.io/library/*",
            "registry-1.docker.io/library/nginx"
        ));
        assert!(matches("*.example.com/**", "registry.example.com:443/app"));
        assert!(!matches("*.example.com:443/**", "registry.example.com/app"));
        assert!(matches("localhost:*/**", "127.0.0.1:5000/app"));
    }
}
