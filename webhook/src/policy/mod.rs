//! Cluster-admin admission policies written in CEL, loaded from a YAML file.
//!
//! Each policy is a ValidatingAdmissionPolicy-style validation: an `expression` over
//! `object`, `oldObject` and `request` that must be true, a `message`, and an optional
//! `messageExpression`. Expressions are compiled once ([`crate::expression`]: checks,
//! `cel.bind`, the fields read, a cost estimate) and evaluated on the cel-rust
//! interpreter with Kubernetes' CEL libraries from kube-cel (strings, lists, sets,
//! regex, quantity, semver, ...). Per review, only the fields the policies read are
//! converted to CEL values, once, straight from the request's JSON
//! ([`crate::review::policy`]); [`PolicySet::evaluate_objects`] takes those values.
//!
//! A file is compiled completely before it replaces the active set; a file that does
//! not parse or compile is rejected with the failing policy's name and position, and
//! the previously loaded set stays active ([`store`]).

mod store;

pub use store::{PolicyStore, Reload};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::HashMap;

use kube::core::cel::AdmissionRequest as CelRequest;
use kube::core::cel::cel::Value;
use kube::core::cel::cel::objects::{Key, Map};
use serde::Deserialize;

use crate::expression::{
    self, Expression, ExpressionError, PER_EXPRESSION_COST_LIMIT, PER_REVIEW_COST_LIMIT, Projection,
};
use crate::review::MAX_POLICY_VALUES;

/// Policy sets whose estimated worst case is at most this are evaluated on the request's
/// own worker: bounded to a few tens of microseconds, they cost less than the hand-off
/// to a blocking thread (measured: a hand-off costs more than ten cheap policies).
pub const INLINE_COST_LIMIT: u64 = 10_000;

/// Variables a policy expression may reference.
pub const VARIABLES: [&str; 4] = ["object", "oldObject", "request", NAMESPACE_OBJECT];
/// The variable holding the namespace's metadata; bound only with `--namespace-labels`.
pub const NAMESPACE_OBJECT: &str = "namespaceObject";

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("reading policy file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("policy file {path}: {error}")]
    Parse {
        path: PathBuf,
        error: Box<serde_saphyr::Error>,
    },
    #[error(
        "policy file {path} is empty while policies are active; refusing it (write `policies: []` to remove every policy)"
    )]
    Empty { path: PathBuf },
    #[error("policy file {path} is not UTF-8: {error}")]
    NotUtf8 {
        path: PathBuf,
        error: std::string::FromUtf8Error,
    },
    #[error("policy file {path}: policies[{index}] ({name:?}): {reason}")]
    Invalid {
        path: PathBuf,
        index: usize,
        name: String,
        reason: InvalidPolicy,
    },
}

/// What is wrong with one policy of a file.
#[derive(Debug, thiserror::Error)]
pub enum InvalidPolicy {
    #[error("name must not be empty")]
    EmptyName,
    #[error("duplicate policy name")]
    DuplicateName,
    #[error("{field}: {error}")]
    Expression {
        field: &'static str,
        error: ExpressionError,
    },
    #[error(
        "{field}: estimated worst-case cost {cost} exceeds the limit of {PER_EXPRESSION_COST_LIMIT} (a comprehension over a list of unknown size inside another?)"
    )]
    ExpressionCost { field: &'static str, cost: u64 },
    #[error(
        "the policies up to this one have an estimated worst-case cost of {cost} per review, over the limit of {PER_REVIEW_COST_LIMIT}"
    )]
    ReviewCost { cost: u64 },
    #[error("{NAMESPACE_OBJECT} is only available with --namespace-labels")]
    NamespaceObject,
}

/// The YAML document: `policies: [...]`. The key is required: a file cut short before
/// it (a torn write) is refused, and clearing every policy is written `policies: []`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    pub policies: Vec<PolicySpec>,
}

/// One policy as written by the cluster admin.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicySpec {
    /// Unique name, quoted in denials.
    pub name: String,
    /// CEL expression that must evaluate to `true` for the request to be allowed.
    pub expression: String,
    /// Message of a denial.
    pub message: String,
    /// CEL expression producing the message of a denial; `message` is used when it fails.
    #[serde(default)]
    pub message_expression: Option<String>,
}

/// A compiled policy.
#[derive(Debug)]
pub struct Policy {
    pub name: String,
    /// Whether the policy reads `namespaceObject`.
    pub uses_namespace: bool,
    expression: Expression,
    message: String,
    message_expression: Option<Expression>,
}

/// A policy that denied a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub policy: String,
    pub message: String,
}

/// A review's `object` and `oldObject` as the policies read them: CEL values of the fields
/// the policies read, or why the object could not be converted. `old_object` is `None`
/// when there is none or no policy reads it.
#[derive(Debug)]
pub struct Objects {
    pub object: Result<Value, ExpressionError>,
    pub old_object: Option<Result<Value, ExpressionError>>,
}

/// A compiled set of policies, immutable once built.
#[derive(Debug, Default)]
pub struct PolicySet {
    policies: Vec<Policy>,
    /// What of `object` and `oldObject` any policy reads: all a review converts.
    object: Projection,
    old_object: Projection,
    /// Sum of the policies' worst-case cost estimates.
    cost: u64,
}

impl PolicySet {
    /// Parses and compiles a YAML policy document; `path` is only used in errors. An
    /// empty (or whitespace-only) document is an empty set here; [`PolicyStore`] decides
    /// whether an empty file may replace loaded policies.
    pub fn from_yaml(path: &Path, yaml: &str) -> Result<Self, PolicyError> {
        if yaml.trim().is_empty() {
            return Ok(PolicySet::default());
        }
        let file: PolicyFile =
            serde_saphyr::from_str(yaml).map_err(|error| PolicyError::Parse {
                path: path.to_owned(),
                error: Box::new(error),
            })?;
        Self::compile(path, &file.policies)
    }

    /// Compiles policies; the first one that fails is reported.
    pub fn compile(path: &Path, specs: &[PolicySpec]) -> Result<Self, PolicyError> {
        let mut set = PolicySet::default();
        for (index, spec) in specs.iter().enumerate() {
            let invalid = |reason: InvalidPolicy| PolicyError::Invalid {
                path: path.to_owned(),
                index,
                name: spec.name.clone(),
                reason,
            };
            if spec.name.trim().is_empty() {
                return Err(invalid(InvalidPolicy::EmptyName));
            }
            if specs[..index].iter().any(|other| other.name == spec.name) {
                return Err(invalid(InvalidPolicy::DuplicateName));
            }
            let expression = compile_checked("expression", &spec.expression).map_err(invalid)?;
            let message_expression = match &spec.message_expression {
                Some(source) => {
                    Some(compile_checked("messageExpression", source).map_err(invalid)?)
                }
                None => None,
            };
            let uses_namespace = expression.variables.contains(NAMESPACE_OBJECT)
                || message_expression
                    .as_ref()
                    .is_some_and(|m| m.variables.contains(NAMESPACE_OBJECT));
            for e in std::iter::once(&expression).chain(message_expression.iter()) {
                set.object.merge(&e.object);
                set.old_object.merge(&e.old_object);
                set.cost = set.cost.saturating_add(e.cost);
            }
            if set.cost > PER_REVIEW_COST_LIMIT {
                return Err(invalid(InvalidPolicy::ReviewCost { cost: set.cost }));
            }
            set.policies.push(Policy {
                name: spec.name.clone(),
                uses_namespace,
                expression,
                message: spec.message.clone(),
                message_expression,
            });
        }
        Ok(set)
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.policies.iter().map(|p| p.name.as_str())
    }

    /// The first policy that reads `namespaceObject`, with its index.
    pub fn first_using_namespace(&self) -> Option<(usize, &str)> {
        self.policies
            .iter()
            .enumerate()
            .find(|(_, p)| p.uses_namespace)
            .map(|(i, p)| (i, p.name.as_str()))
    }

    /// Sum of the policies' worst-case cost estimates.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// What of `object` the policies read.
    pub fn object_projection(&self) -> &Projection {
        &self.object
    }

    /// What of `oldObject` the policies read (nothing: it is not converted at all).
    pub fn old_object_projection(&self) -> &Projection {
        &self.old_object
    }

    /// Evaluates every policy on generic JSON (tests and tools; the webhook converts a
    /// review's objects once, from their JSON, and uses [`PolicySet::evaluate_objects`]).
    /// Returns the ones that denied.
    pub fn evaluate(
        &self,
        object: serde_json::Value,
        old_object: Option<serde_json::Value>,
        request: CelRequest,
        namespace_object: Option<serde_json::Value>,
    ) -> Vec<Violation> {
        if self.policies.is_empty() {
            return Vec::new();
        }
        let objects = Objects {
            object: expression::value_to_cel(&object, &self.object, MAX_POLICY_VALUES),
            old_object: old_object
                .filter(|_| !self.old_object.is_empty())
                .map(|old| expression::value_to_cel(&old, &self.old_object, MAX_POLICY_VALUES)),
        };
        self.evaluate_objects(objects, &request, namespace_object.as_ref())
    }

    /// Evaluates every policy on a review's `object` and `oldObject` as CEL values (only
    /// the fields the policies read, each converted once: [`crate::review::policy`]);
    /// returns the ones that denied. An object that could not be converted, or an
    /// expression that fails to evaluate (a missing field, a type error), denies:
    /// policies fail closed.
    pub fn evaluate_objects(
        &self,
        objects: Objects,
        request: &CelRequest,
        namespace_object: Option<&serde_json::Value>,
    ) -> Vec<Violation> {
        if self.policies.is_empty() {
            return Vec::new();
        }
        let object = match objects.object {
            Ok(object) => object,
            Err(e) => return self.all_denied(&format!("object cannot be read: {e}")),
        };
        let old_object = match objects.old_object {
            Some(Ok(old)) => old,
            Some(Err(e)) => return self.all_denied(&format!("oldObject cannot be read: {e}")),
            None => Value::Null,
        };
        expression::with_functions(|functions| {
            let mut context = functions.new_inner_scope();
            context.add_variable_from_value("object", object);
            context.add_variable_from_value("oldObject", old_object);
            context.add_variable_from_value("request", request_value(request));
            if let Some(namespace) = namespace_object {
                context
                    .add_variable_from_value(NAMESPACE_OBJECT, expression::json_to_cel(namespace));
            }
            self.policies
                .iter()
                .filter_map(|policy| {
                    let message = match policy.expression.evaluate(&context) {
                        Ok(Value::Bool(true)) => return None,
                        Ok(Value::Bool(false)) => policy
                            .message_expression
                            .as_ref()
                            .and_then(|m| match m.evaluate(&context) {
                                Ok(Value::String(s)) if !s.trim().is_empty() => {
                                    Some(s.as_str().to_owned())
                                }
                                _ => None,
                            })
                            .unwrap_or_else(|| policy.message.clone()),
                        Ok(other) => format!("expression returned non-boolean: {other:?}"),
                        Err(e) => format!("evaluation error: {e}"),
                    };
                    Some(Violation {
                        policy: policy.name.clone(),
                        message,
                    })
                })
                .collect()
        })
    }

    fn all_denied(&self, message: &str) -> Vec<Violation> {
        self.policies
            .iter()
            .map(|p| Violation {
                policy: p.name.clone(),
                message: message.to_owned(),
            })
            .collect()
    }
}

/// Compiles one expression of a policy and checks its estimated cost.
fn compile_checked(field: &'static str, source: &str) -> Result<Expression, InvalidPolicy> {
    let expression = Expression::compile(source, &VARIABLES)
        .map_err(|error| InvalidPolicy::Expression { field, error })?;
    if expression.cost > PER_EXPRESSION_COST_LIMIT {
        return Err(InvalidPolicy::ExpressionCost {
            field,
            cost: expression.cost,
        });
    }
    Ok(expression)
}

/// The `request` variable, shaped like ValidatingAdmissionPolicy's.
fn request_value(request: &CelRequest) -> Value {
    fn map(entries: Vec<(&str, Value)>) -> Value {
        let map: HashMap<Key, Value> = entries
            .into_iter()
            .map(|(k, v)| (Key::String(Arc::new(k.to_owned())), v))
            .collect();
        Value::Map(Map { map: Arc::new(map) })
    }
    let string = |s: &str| Value::String(Arc::new(s.to_owned()));
    map(vec![
        ("operation", string(&request.operation)),
        ("name", string(&request.name)),
        ("namespace", string(&request.namespace)),
        ("dryRun", Value::Bool(request.dry_run)),
        (
            "kind",
            map(vec![
                ("group", string(&request.kind.group)),
                ("version", string(&request.kind.version)),
                ("kind", string(&request.kind.kind)),
            ]),
        ),
        (
            "resource",
            map(vec![
                ("group", string(&request.resource.group)),
                ("version", string(&request.resource.version)),
                ("resource", string(&request.resource.resource)),
            ]),
        ),
        (
            "userInfo",
            map(vec![
                ("username", string(&request.username)),
                ("uid", string(&request.uid)),
                (
                    "groups",
                    Value::List(Arc::new(request.groups.iter().map(|g| string(g)).collect())),
                ),
            ]),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(operation: &str, namespace: &str) -> CelRequest {
        CelRequest {
            operation: operation.into(),
            namespace: namespace.into(),
            username: "alice".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        }
    }

    /// Two policies: images from one registry, two replicas in production.
    pub(super) const REGISTRY: &str = include_str!("../../tests/fixtures/registry-policies.yaml");

    #[test]
    fn allows_and_denies_with_messages() {
        let set = PolicySet::from_yaml(Path::new("p.yaml"), REGISTRY).unwrap();
        assert_eq!(set.len(), 2);
        let good = json!({"spec": {"image": "registry.example.com/a:1", "replicas": 3}});
        assert!(
            set.evaluate(good.clone(), None, request("CREATE", "production"), None)
                .is_empty()
        );

        let bad = json!({"spec": {"image": "docker.io/a:1", "replicas": 1}});
        let violations = set.evaluate(bad.clone(), None, request("CREATE", "production"), None);
        assert_eq!(
            violations,
            vec![
                Violation {
                    policy: "allowed-registry".into(),
                    message: "image docker.io/a:1 is not from registry.example.com".into()
                },
                Violation {
                    policy: "production-replicas".into(),
                    message: "AppServices in production need at least 2 replicas".into()
                },
            ]
        );
        // Outside production the replicas policy does not apply.
        let violations = set.evaluate(bad.clone(), None, request("CREATE", "dev"), None);
        assert_eq!(violations.len(), 1);
    }

    #[test]
    fn old_object_and_user_info_are_bound() {
        let yaml = r#"
policies:
  - name: no-scale-down-by-others
    expression: "request.operation != 'UPDATE' || object.spec.replicas >= oldObject.spec.replicas || 'sre' in request.userInfo.groups"
    message: "only SREs may scale down"
"#;
        let set = PolicySet::from_yaml(Path::new("p.yaml"), yaml).unwrap();
        let old = json!({"spec": {"replicas": 4}});
        let new = json!({"spec": {"replicas": 2}});
        assert_eq!(
            set.evaluate(new.clone(), Some(old.clone()), request("UPDATE", "a"), None)
                .len(),
            1
        );
        let mut sre = request("UPDATE", "a");
        sre.groups.push("sre".into());
        assert!(
            set.evaluate(new.clone(), Some(old.clone()), sre, None)
                .is_empty()
        );
        assert!(
            set.evaluate(new.clone(), None, request("CREATE", "a"), None)
                .is_empty()
        );
    }

    #[test]
    fn kubernetes_libraries_are_available() {
        let yaml = r#"
policies:
  - name: memory-cap
    expression: "!has(object.spec.resources) || !has(object.spec.resources.limits) || !('memory' in object.spec.resources.limits) || quantity(object.spec.resources.limits.memory).compareTo(quantity('4Gi')) <= 0"
    message: "memory limit above 4Gi"
  - name: semver-tag
    expression: "object.spec.image.matches(':v[0-9]+[.][0-9]+[.][0-9]+$')"
    message: "tag must be a version"
"#;
        let set = PolicySet::from_yaml(Path::new("p.yaml"), yaml).unwrap();
        let ok =
            json!({"spec": {"image": "r/a:v1.2.3", "resources": {"limits": {"memory": "512Mi"}}}});
        assert!(
            set.evaluate(ok.clone(), None, request("CREATE", "a"), None)
                .is_empty()
        );
        let big =
            json!({"spec": {"image": "r/a:latest", "resources": {"limits": {"memory": "8Gi"}}}});
        let names: Vec<String> = set
            .evaluate(big.clone(), None, request("CREATE", "a"), None)
            .into_iter()
            .map(|v| v.policy)
            .collect();
        assert_eq!(names, ["memory-cap", "semver-tag"]);
    }

    #[test]
    fn namespace_labels_are_bound_and_gated() {
        let yaml = r#"
policies:
  - name: production-replicas
    expression: "!('environment' in namespaceObject.metadata.labels) || namespaceObject.metadata.labels['environment'] != 'production' || object.spec.replicas >= 2"
    message: "production namespaces need at least 2 replicas"
"#;
        let set = PolicySet::from_yaml(Path::new("p.yaml"), yaml).unwrap();
        assert_eq!(
            set.first_using_namespace(),
            Some((0, "production-replicas"))
        );
        let one = json!({"spec": {"replicas": 1}});
        let labels = |env: &str| {
            crate::namespaces::namespace_object(
                "shop",
                &[("environment".to_owned(), env.to_owned())].into(),
            )
        };
        let prod = set.evaluate(
            one.clone(),
            None,
            request("CREATE", "shop"),
            Some(labels("production")),
        );
        assert_eq!(prod.len(), 1);
        assert!(
            set.evaluate(
                one.clone(),
                None,
                request("CREATE", "shop"),
                Some(labels("dev"))
            )
            .is_empty()
        );
        let unlabelled = crate::namespaces::namespace_object("shop", &Default::default());
        assert!(
            set.evaluate(
                one.clone(),
                None,
                request("CREATE", "shop"),
                Some(unlabelled)
            )
            .is_empty()
        );

        // Without --namespace-labels such a file is refused at load.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        std::fs::write(&path, yaml).unwrap();
        let err = PolicyStore::load(path.clone(), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--namespace-labels") && err.contains("production-replicas"),
            "{err}"
        );
        assert_eq!(PolicyStore::load(path, true).unwrap().current().len(), 1);
    }

    #[test]
    fn evaluation_errors_fail_closed() {
        let yaml =
            "policies:\n  - {name: needs-port, expression: \"object.spec.port > 0\", message: m}\n";
        let set = PolicySet::from_yaml(Path::new("p.yaml"), yaml).unwrap();
        let violations = set.evaluate(json!({"spec": {}}), None, request("CREATE", "a"), None);
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].policy, "needs-port");
    }

    #[test]
    fn compile_errors_name_the_policy_and_position() {
        let yaml = r#"
policies:
  - {name: fine, expression: "true", message: m}
  - {name: broken, expression: "object.spec.replicas >", message: m}
"#;
        let err = PolicySet::from_yaml(Path::new("p.yaml"), yaml)
            .unwrap_err()
            .to_string();
        assert!(err.contains("policies[1]"), "{err}");
        assert!(err.contains("\"broken\""), "{err}");
        assert!(err.contains("<input>:1:"), "{err}");

        let typo =
            "policies:\n  - {name: typo, expression: \"objet.spec.replicas > 1\", message: m}\n";
        let err = PolicySet::from_yaml(Path::new("p.yaml"), typo)
            .unwrap_err()
            .to_string();
        assert!(err.contains("objet"), "{err}");

        let bad_message = "policies:\n  - {name: msg, expression: \"true\", message: m, messageExpression: \"'a' +\"}\n";
        let err = PolicySet::from_yaml(Path::new("p.yaml"), bad_message)
            .unwrap_err()
            .to_string();
        assert!(err.contains("messageExpression"), "{err}");
    }

    #[test]
    fn structural_errors() {
        let err = PolicySet::from_yaml(
            Path::new("p.yaml"),
            "policies:\n  - {name: a, expresion: x, message: m}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("expresion"), "{err}");
        assert!(err.contains("line 2") || err.contains("2:"), "{err}");
        let dup = "policies:\n  - {name: a, expression: 'true', message: m}\n  - {name: a, expression: 'true', message: m}\n";
        let err = PolicySet::from_yaml(Path::new("p.yaml"), dup)
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate"), "{err}");
        assert!(
            PolicySet::from_yaml(Path::new("p.yaml"), "  \n")
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn costly_policies_are_refused_at_load() {
        let nested = "policies:\n  - {name: nested, expression: \"object.metadata.managedFields.all(a, object.metadata.managedFields.all(b, a == b))\", message: m}\n";
        let err = PolicySet::from_yaml(Path::new("p.yaml"), nested)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"nested\"") && err.contains("exceeds the limit"),
            "{err}"
        );
        // The same over spec.env, bounded by its 128 entries, is fine.
        let env = "policies:\n  - {name: unique, expression: \"object.spec.env.all(a, object.spec.env.exists_one(b, a.name == b.name))\", message: m}\n";
        let set = PolicySet::from_yaml(Path::new("p.yaml"), env).unwrap();
        assert!(set.cost() < PER_EXPRESSION_COST_LIMIT);
        let object = json!({"spec": {"env": [{"name": "A"}, {"name": "A"}]}});
        assert_eq!(
            set.evaluate(object, None, request("CREATE", "a"), None)
                .len(),
            1
        );
    }

    #[test]
    fn the_whole_language_is_accepted() {
        let yaml = r#"
policies:
  - name: no-aws
    expression: "object.spec.env.all(e, !e.name.startsWith('AWS_'))"
    message: "no AWS_ variables"
  - name: bound
    expression: "cel.bind(r, object.spec.replicas, r >= 1 && r <= 10)"
    message: "1 to 10 replicas"
  - name: sets
    expression: "sets.contains(['a', 'b', 'c'], object.spec.env.map(e, e.name.lowerAscii()))"
    message: "only a, b, c"
  - name: math
    expression: "math.abs(object.spec.replicas - 5) <= 5"
    message: "math"
"#;
        let set = PolicySet::from_yaml(Path::new("p.yaml"), yaml).unwrap();
        let ok = json!({"spec": {"replicas": 3, "env": [{"name": "A"}]}});
        assert!(
            set.evaluate(ok, None, request("CREATE", "a"), None)
                .is_empty()
        );
        let bad = json!({"spec": {"replicas": 30, "env": [{"name": "AWS_KEY"}]}});
        let names: Vec<String> = set
            .evaluate(bad, None, request("CREATE", "a"), None)
            .into_iter()
            .map(|v| v.policy)
            .collect();
        assert_eq!(names, ["no-aws", "bound", "sets", "math"]);
        let err = PolicySet::from_yaml(
            Path::new("p.yaml"),
            "policies:\n  - {name: double, expression: '!!true', message: m}\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unary operators"), "{err}");
    }
}
