//! JSON to CEL values: the object of a review (only the fields its policies read,
//! property names escaped as the API server does, a bounded number of values, with the
//! members a [`Replace`] changes put in as the JSON is read) and the namespace object.

use std::fmt;
use std::sync::Arc;

use kube::core::cel::cel::Value;
use kube::core::cel::cel::objects::{Key, Map};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{ExpressionError, Projection};

/// Where a JSON value sits in an AppService, for key escaping: property names of
/// structured fields are escaped like the API server does (`__namespace__`,
/// `__dot__`...), keys of metadata and of maps (labels, annotations, resource lists,
/// managed fields' field sets) are not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Root,
    Metadata,
    ManagedFields,
    Spec,
    Resources,
    Other,
    /// A map's keys: not escaped; its values are `Other`.
    Map,
    /// A free-form subtree (`fieldsV1`): nothing escaped.
    FreeForm,
}

impl Position {
    fn child(self, key: &str) -> Position {
        match (self, key) {
            (Position::Root, "metadata") => Position::Metadata,
            (Position::Root, "spec") => Position::Spec,
            (Position::Metadata, "labels" | "annotations") => Position::Map,
            (Position::Metadata, "managedFields") => Position::ManagedFields,
            (Position::ManagedFields, "fieldsV1") => Position::FreeForm,
            (Position::Spec, "resources") => Position::Resources,
            (Position::Resources, "limits" | "requests") => Position::Map,
            (Position::FreeForm, _) => Position::FreeForm,
            (Position::Map, _) => Position::Other,
            _ => Position::Other,
        }
    }

    /// Whether keys of a map at this position are escaped. Metadata's are not: the API
    /// server exposes `object.metadata.namespace` as is (checked in cel_conformance.rs).
    fn escapes(self) -> bool {
        !matches!(
            self,
            Position::Map | Position::FreeForm | Position::Metadata
        )
    }
}

/// Escapes a property name as Kubernetes' CEL does.
fn escape(name: &str) -> String {
    const RESERVED: [&str; 21] = [
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    if RESERVED.contains(&name) {
        return format!("__{name}__");
    }
    if !name.contains(['_', '.', '-', '/']) {
        return name.to_owned();
    }
    let mut escaped = String::with_capacity(name.len() + 8);
    for ch in name.chars() {
        match ch {
            '_' => escaped.push_str("__"),
            '.' => escaped.push_str("__dot__"),
            '-' => escaped.push_str("__dash__"),
            '/' => escaped.push_str("__slash__"),
            _ => escaped.push(ch),
        }
    }
    escaped
}

/// A member changed while an object is converted, instead of what its JSON holds: the
/// hub form of a `v1alpha1` object (its `apiVersion`, `spec` and conversion annotations),
/// the new replicas of a scale write. `path` names the member from the top of the object
/// (JSON names, `["metadata", "annotations"]`). What is put in is converted like the rest
/// of the object (projected, escaped, counted). Nothing is put under a parent the object
/// does not have.
#[derive(Clone, Copy, Debug)]
pub struct Replace<'a> {
    pub path: &'a [&'a str],
    pub with: With<'a>,
}

/// What a [`Replace`] puts in.
#[derive(Clone, Copy, Debug)]
pub enum With<'a> {
    /// This value.
    Value(&'a serde_json::Value),
    /// Nothing: the member is left out.
    Nothing,
    /// The member as a map (absent, null or not a map: an empty one) without the members
    /// named in `drop`, and with those of `put` (a JSON object); left out when that leaves
    /// it empty.
    Merge {
        drop: &'a [&'a str],
        put: &'a serde_json::Value,
    },
}

/// The state of a [`With::Merge`] while its map is converted.
struct Merging<'a> {
    drop: &'a [&'a str],
    put: &'a serde_json::Value,
    /// Members of the merged map, whether a policy reads them or not.
    members: std::cell::Cell<usize>,
}

impl Merging<'_> {
    fn put(&self) -> impl Iterator<Item = (&String, &serde_json::Value)> {
        self.put.as_object().into_iter().flatten()
    }
}

/// Converts an AppService's JSON into a CEL value, only the projected parts, in one pass
/// and without an intermediate generic JSON value, with the members of `replace` put in.
/// More than `max_values` values converted is an error, which bounds the memory of the
/// CEL copy.
pub fn object_to_cel(
    json: &[u8],
    projection: &Projection,
    max_values: usize,
    replace: &[Replace<'_>],
) -> Result<Value, ExpressionError> {
    convert(
        &mut serde_json::Deserializer::from_slice(json),
        projection,
        max_values,
        replace,
    )
}

/// [`object_to_cel`] of an object already held as generic JSON (tests and tools).
pub fn value_to_cel(
    value: &serde_json::Value,
    projection: &Projection,
    max_values: usize,
) -> Result<Value, ExpressionError> {
    convert(value, projection, max_values, &[])
}

fn convert<'de, D: Deserializer<'de, Error = serde_json::Error>>(
    json: D,
    projection: &Projection,
    max_values: usize,
    replace: &[Replace<'_>],
) -> Result<Value, ExpressionError> {
    let remaining = std::cell::Cell::new(max_values);
    let replace: Vec<&Replace<'_>> = replace.iter().collect();
    let value = CelSeed {
        projection: Some(projection),
        position: Position::Root,
        remaining: &remaining,
        replace: &replace,
        depth: 0,
        merge: None,
    }
    .deserialize(json)
    .map_err(|e| {
        if remaining.get() == 0 {
            ExpressionError::TooManyValues { max: max_values }
        } else {
            ExpressionError::Json(e)
        }
    })?;
    Ok(value)
}

/// Converts any JSON (the namespace object) into a CEL value, keys unescaped.
pub fn json_to_cel(value: &serde_json::Value) -> Value {
    match value {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => number(n.as_i64(), n.as_u64(), n.as_f64()),
        serde_json::Value::String(s) => Value::String(Arc::new(s.clone())),
        serde_json::Value::Array(items) => {
            Value::List(Arc::new(items.iter().map(json_to_cel).collect()))
        }
        serde_json::Value::Object(map) => Value::Map(Map {
            map: Arc::new(
                map.iter()
                    .map(|(k, v)| (Key::String(Arc::new(k.clone())), json_to_cel(v)))
                    .collect(),
            ),
        }),
    }
}

fn number(i: Option<i64>, u: Option<u64>, f: Option<f64>) -> Value {
    match (i, u, f) {
        (Some(i), _, _) => Value::Int(i),
        (None, Some(u), _) => Value::UInt(u),
        (None, None, f) => Value::Float(f.unwrap_or(f64::NAN)),
    }
}

struct CelSeed<'p, 'r> {
    /// `None`: take everything below.
    projection: Option<&'p Projection>,
    position: Position,
    /// Values that may still be converted.
    remaining: &'p std::cell::Cell<usize>,
    /// The replacements at or below this value; `depth` is how deep it is in the object.
    replace: &'r [&'r Replace<'r>],
    depth: usize,
    /// This value is a map merged with others ([`With::Merge`]).
    merge: Option<&'r Merging<'r>>,
}

impl CelSeed<'_, '_> {
    /// What a member called `key` of this map is converted with, and its CEL name; `None`
    /// when no policy reads it.
    fn member(&self, key: &str) -> Option<(Option<&Projection>, Position, String)> {
        let name = if self.position.escapes() {
            escape(key)
        } else {
            key.to_owned()
        };
        let projection = match self.projection {
            None => None,
            Some(projection) => {
                let child = projection.child(&name)?;
                (!child.whole).then_some(child)
            }
        };
        Some((projection, self.position.child(key), name))
    }

    /// Whether the replacement ends at the member `key` of this map.
    fn replaces(&self, replace: &Replace<'_>, key: &str) -> bool {
        replace.path.len() == self.depth + 1 && replace.path.get(self.depth) == Some(&key)
    }
}

impl<'de> DeserializeSeed<'de> for CelSeed<'_, '_> {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.remaining.get().checked_sub(1) {
            Some(left) => self.remaining.set(left),
            None => return Err(de::Error::custom("too many values")),
        }
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CelSeed<'_, '_> {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(Arc::new(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(Arc::new(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        // A list is read whole (its elements are read through an index or a macro); its
        // elements sit where the list does (managed-field entries under managedFields).
        let element = self.position;
        while let Some(item) = seq.next_element_seed(CelSeed {
            projection: None,
            position: element,
            remaining: self.remaining,
            replace: &[],
            depth: self.depth + 1,
            merge: None,
        })? {
            items.push(item);
        }
        Ok(Value::List(Arc::new(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = std::collections::HashMap::new();
        // Members replaced here that the JSON has (a merged map is put in even if not).
        let mut seen = Vec::new();
        while let Some(key) = access.next_key::<std::borrow::Cow<'de, str>>()? {
            if let Some(merge) = self.merge {
                if merge.drop.contains(&key.as_ref()) {
                    access.next_value::<de::IgnoredAny>()?;
                    continue;
                }
                merge.members.set(merge.members.get() + 1);
            }
            let replace = self.replace.iter().find(|r| self.replaces(r, &key));
            let merging = match replace.map(|r| r.with) {
                Some(With::Value(_) | With::Nothing) => {
                    access.next_value::<de::IgnoredAny>()?;
                    continue;
                }
                Some(With::Merge { drop, put }) => {
                    seen.push(key.clone());
                    Some(Merging {
                        drop,
                        put,
                        members: std::cell::Cell::new(0),
                    })
                }
                None => None,
            };
            let Some((projection, position, name)) = self.member(&key) else {
                access.next_value::<de::IgnoredAny>()?;
                continue;
            };
            let below: Vec<&Replace<'_>> = self
                .replace
                .iter()
                .copied()
                .filter(|r| r.path.len() > self.depth + 1 && r.path.get(self.depth) == Some(&&*key))
                .collect();
            let mut value = access.next_value_seed(CelSeed {
                projection,
                position,
                remaining: self.remaining,
                replace: &below,
                depth: self.depth + 1,
                merge: merging.as_ref(),
            })?;
            if let Some(merging) = &merging {
                if !matches!(value, Value::Map(_)) {
                    // Not a map: the merge is `put` alone.
                    merging.members.set(merging.put().count());
                    value = self.convert(projection, position, merging.put)?;
                }
                if merging.members.get() == 0 {
                    continue;
                }
            }
            map.insert(Key::String(Arc::new(name)), value);
        }
        if let Some(merge) = self.merge {
            for (key, with) in merge.put() {
                merge.members.set(merge.members.get() + 1);
                if let Some((projection, position, name)) = self.member(key) {
                    let value = self.convert(projection, position, with)?;
                    map.insert(Key::String(Arc::new(name)), value);
                }
            }
        }
        for replace in self.replace {
            let Some(key) = replace.path.get(self.depth) else {
                continue;
            };
            if !self.replaces(replace, key) {
                continue;
            }
            let with = match replace.with {
                With::Value(with) => with,
                With::Merge { put, .. }
                    if !seen.iter().any(|s| s == key)
                        && put.as_object().is_some_and(|p| !p.is_empty()) =>
                {
                    put
                }
                With::Nothing | With::Merge { .. } => continue,
            };
            let Some((projection, position, name)) = self.member(key) else {
                continue;
            };
            let value = self.convert(projection, position, with)?;
            map.insert(Key::String(Arc::new(name)), value);
        }
        Ok(Value::Map(Map { map: Arc::new(map) }))
    }
}

impl CelSeed<'_, '_> {
    /// `with`, a replacement, converted as a member of this map.
    fn convert<E: de::Error>(
        &self,
        projection: Option<&Projection>,
        position: Position,
        with: &serde_json::Value,
    ) -> Result<Value, E> {
        CelSeed {
            projection,
            position,
            remaining: self.remaining,
            replace: &[],
            depth: self.depth + 1,
            merge: None,
        }
        .deserialize(with)
        .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Expression;
    use super::*;

    const VARS: [&str; 3] = ["object", "oldObject", "request"];

    fn get<'v>(value: &'v Value, name: &str) -> Option<&'v Value> {
        let Value::Map(map) = value else {
            return None;
        };
        map.map.get(&Key::String(Arc::new(name.into())))
    }

    #[test]
    fn only_the_read_fields_are_converted() {
        let expression = Expression::compile("object.spec.replicas > 1", &VARS).unwrap();
        let json = br#"{"metadata":{"name":"a"},"spec":{"replicas":2,"env":[]}}"#;
        let root = object_to_cel(json, &expression.object, 1000, &[]).unwrap();
        let Value::Map(map) = &root else {
            panic!("not a map");
        };
        assert_eq!(map.map.len(), 1);
        let Some(Value::Map(spec)) = get(&root, "spec") else {
            panic!("no spec");
        };
        assert_eq!(spec.map.len(), 1);
        // Only converted values count against the bound: root, spec, replicas.
        assert!(object_to_cel(json, &expression.object, 3, &[]).is_ok());
        let err = object_to_cel(json, &expression.object, 2, &[]).unwrap_err();
        assert!(err.to_string().contains("more than 2 JSON values"), "{err}");
        // The same from generic JSON.
        let value: serde_json::Value = serde_json::from_slice(json).unwrap();
        assert_eq!(
            value_to_cel(&value, &expression.object, 1000).unwrap(),
            root
        );
    }

    #[test]
    fn replaced_members_are_converted_like_the_rest() {
        let json = br#"{"apiVersion":"v1","metadata":{"name":"a","annotations":{"x":"1"}},
            "spec":{"replicas":2,"image":"i"}}"#;
        let whole = Projection::whole();
        let replicas = serde_json::json!(5);
        let annotations = serde_json::json!({"y.example.com/z": "2"});
        let replaced = object_to_cel(
            json,
            &whole,
            1000,
            &[
                Replace {
                    path: &["spec", "replicas"],
                    with: With::Value(&replicas),
                },
                Replace {
                    path: &["metadata", "annotations"],
                    with: With::Value(&annotations),
                },
                Replace {
                    path: &["apiVersion"],
                    with: With::Nothing,
                },
                // No `status` in the object: nothing is put under it.
                Replace {
                    path: &["status", "replicas"],
                    with: With::Value(&replicas),
                },
            ],
        )
        .unwrap();
        let expected = value_to_cel(
            &serde_json::json!({"metadata": {"name": "a", "annotations": {"y.example.com/z": "2"}},
                                "spec": {"replicas": 5, "image": "i"}}),
            &whole,
            1000,
        )
        .unwrap();
        assert_eq!(replaced, expected);
        // A replacement counts against the bound like what it replaces: root, spec,
        // replicas, image.
        let spec = Expression::compile("object.spec.image != ''", &VARS).unwrap();
        let both = Expression::compile("has(object.spec.image) && object.spec.replicas > 0", &VARS)
            .unwrap();
        assert!(object_to_cel(json, &spec.object, 3, &[]).is_ok());
        let over = object_to_cel(
            json,
            &both.object,
            3,
            &[Replace {
                path: &["spec", "replicas"],
                with: With::Value(&replicas),
            }],
        );
        assert!(
            matches!(over, Err(ExpressionError::TooManyValues { max: 3 })),
            "{over:?}"
        );
    }

    #[test]
    fn a_merged_map_keeps_its_other_members_and_goes_when_empty() {
        let whole = Projection::whole();
        let merged = |json: &str, put: serde_json::Value| {
            object_to_cel(
                json.as_bytes(),
                &whole,
                1000,
                &[Replace {
                    path: &["metadata", "annotations"],
                    with: With::Merge {
                        drop: &["a", "b"],
                        put: &put,
                    },
                }],
            )
            .unwrap()
        };
        let expect = |json: serde_json::Value| value_to_cel(&json, &whole, 1000).unwrap();
        let json = r#"{"metadata":{"annotations":{"a":"1","b":"2","c":"3"}}}"#;
        assert_eq!(
            merged(json, serde_json::json!({"b": "new"})),
            expect(serde_json::json!({"metadata": {"annotations": {"b": "new", "c": "3"}}}))
        );
        // Nothing left: no annotations at all.
        let json = r#"{"metadata":{"annotations":{"a":"1"}}}"#;
        assert_eq!(
            merged(json, serde_json::json!({})),
            expect(serde_json::json!({"metadata": {}}))
        );
        // Absent or null: `put` alone; under no metadata, nothing.
        for json in [r#"{"metadata":{}}"#, r#"{"metadata":{"annotations":null}}"#] {
            assert_eq!(
                merged(json, serde_json::json!({"a": "x"})),
                expect(serde_json::json!({"metadata": {"annotations": {"a": "x"}}}))
            );
            assert_eq!(
                merged(json, serde_json::json!({})),
                expect(serde_json::json!({"metadata": {}}))
            );
        }
        assert_eq!(
            merged("{}", serde_json::json!({"a": "x"})),
            expect(serde_json::json!({}))
        );
    }
}
