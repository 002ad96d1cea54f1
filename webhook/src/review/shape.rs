//! The sizes of a spec's lists and strings, counted without storing them, so an
//! oversized object is refused before it is decoded.

use std::fmt;

use common::types::{
    MAX_CONFIG_SOURCES, MAX_ENV, MAX_ENV_NAME_LEN, MAX_ENV_VALUE_LEN, MAX_EXPOSE_HOSTNAMES,
    MAX_EXPOSE_PATHS, MAX_IMAGE_LEN, MAX_PORTS,
};
use common::validation::{FieldError, FieldErrors};
use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::MAX_RESOURCE_ENTRIES;

/// Specs up to this size are decoded without sizing their lists first: even made only of
/// the smallest env entries, the decoded form stays below 64 KiB.
const SHAPE_CHECK_FROM: usize = 2048;

/// Every field of `spec` over its bound, in Kubernetes' format; `None` when none is.
pub(super) fn oversized(spec: &RawValue) -> Option<FieldErrors> {
    // A spec this small cannot hold a list over its bound worth refusing before it is
    // decoded (its worst case is a few tens of KiB); larger ones are sized first.
    if spec.get().len() <= SHAPE_CHECK_FROM {
        return None;
    }
    let mut errors = Vec::new();
    if let Ok(shape) = serde_json::from_str::<SpecShape>(spec.get()) {
        shape.check(&mut errors);
    }
    (!errors.is_empty()).then_some(FieldErrors(errors))
}

/// Sizes of the spec's lists and strings, read without storing them. Type errors are
/// not reported here (everything unexpected counts as zero); the typed decode does that.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecShape {
    #[serde(default)]
    image: Len,
    #[serde(default)]
    env: EnvShape,
    #[serde(default)]
    ports: Len,
    #[serde(default)]
    resources: Option<ResourcesShape>,
    #[serde(default)]
    canary: Option<CanaryShape>,
    #[serde(default)]
    config: Len,
    #[serde(default)]
    expose: Option<ExposeShape>,
}

#[derive(Default, Deserialize)]
struct ExposeShape {
    #[serde(default)]
    hostnames: Len,
    #[serde(default)]
    paths: Len,
}

#[derive(Default, Deserialize)]
struct CanaryShape {
    #[serde(default)]
    image: Len,
}

#[derive(Default, Deserialize)]
struct ResourcesShape {
    #[serde(default)]
    limits: Len,
    #[serde(default)]
    requests: Len,
    #[serde(default)]
    claims: Len,
}

impl SpecShape {
    fn check(&self, errors: &mut Vec<FieldError>) {
        if self.image.0 > MAX_IMAGE_LEN {
            errors.push(FieldError::too_long("spec.image", MAX_IMAGE_LEN));
        }
        if self
            .canary
            .as_ref()
            .is_some_and(|c| c.image.0 > MAX_IMAGE_LEN)
        {
            errors.push(FieldError::too_long("spec.canary.image", MAX_IMAGE_LEN));
        }
        if self.env.count > MAX_ENV {
            errors.push(FieldError::too_many("spec.env", self.env.count, MAX_ENV));
        } else {
            errors.extend(self.env.errors.iter().cloned());
        }
        if self.ports.0 > MAX_PORTS {
            errors.push(FieldError::too_many("spec.ports", self.ports.0, MAX_PORTS));
        }
        if self.config.0 > MAX_CONFIG_SOURCES {
            errors.push(FieldError::too_many(
                "spec.config",
                self.config.0,
                MAX_CONFIG_SOURCES,
            ));
        }
        if let Some(expose) = &self.expose {
            for (field, len, max) in [
                (
                    "spec.expose.hostnames",
                    expose.hostnames.0,
                    MAX_EXPOSE_HOSTNAMES,
                ),
                ("spec.expose.paths", expose.paths.0, MAX_EXPOSE_PATHS),
            ] {
                if len > max {
                    errors.push(FieldError::too_many(field, len, max));
                }
            }
        }
        if let Some(resources) = &self.resources {
            for (field, len) in [
                ("spec.resources.limits", resources.limits.0),
                ("spec.resources.requests", resources.requests.0),
                ("spec.resources.claims", resources.claims.0),
            ] {
                if len > MAX_RESOURCE_ENTRIES {
                    errors.push(FieldError::too_many(field, len, MAX_RESOURCE_ENTRIES));
                }
            }
        }
    }
}

/// The length of a string (bytes), list or map; zero for anything else.
#[derive(Default)]
struct Len(usize);

impl<'de> Deserialize<'de> for Len {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Len;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Len, E> {
                Ok(Len(s.len()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Len, A::Error> {
                let mut n = 0;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Len(n))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Len, A::Error> {
                let mut n = 0;
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                    n += 1;
                }
                Ok(Len(n))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Len, E> {
                Ok(Len(0))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Len, E> {
                Ok(Len(0))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `spec.env`: how many entries, and the first entries whose name or value is too long
/// (only recorded while the count is within bounds).
#[derive(Default)]
struct EnvShape {
    count: usize,
    errors: Vec<FieldError>,
}

#[derive(Default, Deserialize)]
struct EnvEntryShape {
    #[serde(default)]
    name: Len,
    #[serde(default)]
    value: Len,
}

impl<'de> Deserialize<'de> for EnvShape {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EnvShape;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of environment variables")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EnvShape, A::Error> {
                let mut shape = EnvShape::default();
                loop {
                    if shape.count >= MAX_ENV {
                        // Past the bound only the count matters.
                        if seq.next_element::<IgnoredAny>()?.is_none() {
                            break;
                        }
                    } else {
                        let Some(entry) = seq.next_element::<Option<EnvEntryShapeOrAny>>()? else {
                            break;
                        };
                        if let Some(EnvEntryShapeOrAny(Some(entry))) = entry {
                            let i = shape.count;
                            if entry.name.0 > MAX_ENV_NAME_LEN {
                                shape.errors.push(FieldError::too_long(
                                    format!("spec.env[{i}].name"),
                                    MAX_ENV_NAME_LEN,
                                ));
                            }
                            if entry.value.0 > MAX_ENV_VALUE_LEN {
                                shape.errors.push(FieldError::too_long(
                                    format!("spec.env[{i}].value"),
                                    MAX_ENV_VALUE_LEN,
                                ));
                            }
                        }
                    }
                    shape.count += 1;
                }
                Ok(shape)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EnvShape, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(EnvShape::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<EnvShape, E> {
                Ok(EnvShape::default())
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// One env entry's sizes when it is a map; `None` for anything else.
struct EnvEntryShapeOrAny(Option<EnvEntryShape>);

impl<'de> Deserialize<'de> for EnvEntryShapeOrAny {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = EnvEntryShapeOrAny;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an environment variable")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<EnvEntryShapeOrAny, A::Error> {
                let entry = EnvEntryShape::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(EnvEntryShapeOrAny(Some(entry)))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<EnvEntryShapeOrAny, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<EnvEntryShapeOrAny, E> {
                Ok(EnvEntryShapeOrAny(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::types::LIST_BOUNDS;
    use serde_json::{Value, json};

    /// `n` entries of the list (or map) at `path`, each valid on its own.
    fn entries(path: &str, n: usize) -> Value {
        match path {
            "spec.env" => json!(
                (0..n)
                    .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
                    .collect::<Vec<_>>()
            ),
            "spec.ports" => json!(
                (0..n)
                    .map(|i| json!({"name": format!("p{i}"), "port": 1000 + i}))
                    .collect::<Vec<_>>()
            ),
            "spec.config" => json!(
                (0..n)
                    .map(|i| json!({"configMap": format!("c{i}")}))
                    .collect::<Vec<_>>()
            ),
            "spec.expose.hostnames" => json!(
                (0..n)
                    .map(|i| format!("h{i}.example.com"))
                    .collect::<Vec<_>>()
            ),
            "spec.expose.paths" => json!((0..n).map(|i| format!("/p{i}")).collect::<Vec<_>>()),
            "spec.resources.limits" | "spec.resources.requests" => Value::Object(
                (0..n)
                    .map(|i| (format!("example.com/r{i}"), json!("1")))
                    .collect(),
            ),
            "spec.resources.claims" => json!(
                (0..n)
                    .map(|i| json!({"name": format!("c{i}")}))
                    .collect::<Vec<_>>()
            ),
            other => panic!("{other} is in LIST_BOUNDS but this test cannot build it: add it here"),
        }
    }

    /// A spec with `n` entries at `path` (and, for the size check, padding that makes it
    /// large enough to be sized before decoding).
    fn spec(path: &str, n: usize, padded: bool) -> Value {
        let mut spec = json!({"image": "registry.example.com/web:v1"});
        let keys: Vec<&str> = path.split('.').skip(1).collect();
        let mut at = &mut spec;
        for key in &keys[..keys.len() - 1] {
            at = at
                .as_object_mut()
                .unwrap()
                .entry(key.to_string())
                .or_insert_with(|| json!({}));
        }
        at[keys[keys.len() - 1]] = entries(path, n);
        if path == "spec.expose.paths" {
            spec["expose"]["hostnames"] = json!(["shop.example.com"]);
        }
        if padded {
            spec["padding"] = json!("x".repeat(SHAPE_CHECK_FROM));
        }
        spec
    }

    /// Each bound of the table is held by the size check before decoding and by
    /// `validate`, at the same number: a bound added in one place only fails here.
    #[test]
    fn every_list_bound_is_held_before_decoding_and_by_validate() {
        for &(path, max) in LIST_BOUNDS {
            let over = spec(path, max + 1, true);
            let raw = RawValue::from_string(over.to_string()).unwrap();
            let errors = oversized(&raw).unwrap_or_else(|| panic!("{path}: not sized"));
            assert!(errors.to_string().contains(path), "{path}: {errors}");
            let at = RawValue::from_string(spec(path, max, true).to_string()).unwrap();
            assert!(oversized(&at).is_none(), "{path}: refused at its bound");

            let app = |spec: Value| -> common::AppService {
                serde_json::from_value(json!({
                    "apiVersion": "platform.example.com/v1beta1", "kind": "AppService",
                    "metadata": {"name": "web", "namespace": "team"}, "spec": spec,
                }))
                .unwrap()
            };
            let refused = common::validation::validate(&app(spec(path, max + 1, false)), None)
                .err()
                .unwrap_or_else(|| panic!("{path}: validate admits {} entries", max + 1));
            assert!(refused.to_string().contains(path), "{path}: {refused}");
            // Claims are refused whatever their number; every other list is valid at its bound.
            if path != "spec.resources.claims" {
                let at = common::validation::validate(&app(spec(path, max, false)), None);
                assert!(at.is_ok(), "{path}: {at:?}");
            }
        }
    }
}
