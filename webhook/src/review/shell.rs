//! One pass over an object: the metadata the rules and the ratchet read, and the spec
//! kept as a slice of the JSON until it is checked for size ([`super::shape`]) and
//! decoded into its type.
//!
//! A written object ([`Written`]: a review's `object`, a cached AppService) is read for
//! its name, generateName, namespace, name label and conversion annotations ([`Rules`]);
//! the new object of an UPDATE also for every label and annotation, which the ratchet
//! compares ([`Ratchet`]). The stored object of an UPDATE ([`Stored`]: `oldObject`) is
//! read for its annotations (the conversion annotations are part of the spec the update
//! rules compare), labels, name and deletionTimestamp. Managed fields, status and
//! everything else are skipped unread; labels and annotations that are kept stay
//! borrowed from the JSON (copied only when they hold escapes), and only an UPDATE keeps
//! them, so a CREATE of 150,000 annotations costs nothing for them.
//!
//! The rules are strict where they read: a name, generateName, namespace, name label or
//! conversion annotation of the wrong type refuses a written object. What only the
//! ratchet reads is read leniently: a label or annotation that is not a string makes the
//! update judged as usual ([`Facts`] are not given), it does not refuse it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use common::conversion::Version;
use common::names::{CONVERSION_ANNOTATIONS, LABEL_NAME};
use common::{AppService, v1alpha1};
use kube::core::ObjectMeta;
use serde::Deserialize;
use serde::de::{
    self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor,
};
use serde_json::value::RawValue;

use super::{App, Json, Labels, Object, ObjectError, decode_at, shape};

/// Labels or annotations, borrowed from the object's JSON where they can be.
pub type StringMap<'a> = BTreeMap<Cow<'a, str>, Cow<'a, str>>;

impl Json {
    /// One pass over a written object (a review's `object` of a CREATE, a cached
    /// AppService): what the rules read.
    pub fn written(&self) -> Result<Written<'_>, ObjectError> {
        decode_at(self.bytes(), "").map_err(ObjectError::invalid)
    }

    /// One pass over the new object of an UPDATE: what the rules and the ratchet read.
    pub fn updated(&self) -> Result<Written<'_, Ratchet<'_>>, ObjectError> {
        decode_at(self.bytes(), "").map_err(ObjectError::invalid)
    }

    /// One pass over the stored object of an UPDATE (`oldObject`).
    pub fn stored(&self) -> Result<Stored<'_>, ObjectError> {
        decode_at(self.bytes(), "").map_err(ObjectError::invalid)
    }

    /// A written object, decoded for the rules ([`Json::written`], then
    /// [`Written::decode`]), when nothing else of it is needed.
    pub fn object(&self, version: Version) -> Result<Object, ObjectError> {
        self.written()?.decode(version)
    }
}

/// A written object after one pass: its metadata as `M` reads it, its spec not yet
/// decoded.
#[derive(Deserialize)]
#[serde(bound(deserialize = "M: Deserialize<'de> + Default"))]
pub struct Written<'a, M = Rules> {
    #[serde(default)]
    metadata: M,
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
}

/// What a pass over a written object reads of its metadata.
pub trait Metadata {
    /// The metadata the rules read, and whether `labels` is there with its name label.
    fn for_rules(&self) -> (ObjectMeta, Labels);
    /// The name, labels and annotations the ratchet compares; `None` when they are not
    /// kept, or a label or annotation is not a string.
    fn for_ratchet(&self) -> Option<(Option<&str>, &StringMap<'_>, &StringMap<'_>)>;
}

/// The metadata of a written object as the rules read it, and nothing else.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rules {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: NameLabel,
    #[serde(default)]
    annotations: ConversionAnnotations,
}

/// The metadata of the new object of an UPDATE: what the rules read, and every label and
/// annotation for the ratchet.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ratchet<'a> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default, borrow)]
    labels: LabelsField<'a>,
    #[serde(default, borrow)]
    annotations: Annotations<'a>,
}

impl Metadata for Rules {
    fn for_rules(&self) -> (ObjectMeta, Labels) {
        let metadata = rules_metadata(
            &self.name,
            &self.generate_name,
            &self.namespace,
            &self.labels.0,
            self.annotations.conversion(),
        );
        (metadata, self.labels.0.clone())
    }

    fn for_ratchet(&self) -> Option<(Option<&str>, &StringMap<'_>, &StringMap<'_>)> {
        None
    }
}

impl Metadata for Ratchet<'_> {
    fn for_rules(&self) -> (ObjectMeta, Labels) {
        let metadata = rules_metadata(
            &self.name,
            &self.generate_name,
            &self.namespace,
            &self.labels.labels,
            self.annotations.conversion(),
        );
        (metadata, self.labels.labels.clone())
    }

    fn for_ratchet(&self) -> Option<(Option<&str>, &StringMap<'_>, &StringMap<'_>)> {
        (!self.labels.odd && !self.annotations.odd).then_some((
            self.name.as_deref(),
            &self.labels.all,
            &self.annotations.all,
        ))
    }
}

/// The metadata of a written object for the rules: name, generateName, namespace, the
/// name label (in a map when `labels` is there) and the conversion annotations.
fn rules_metadata(
    name: &Option<String>,
    generate_name: &Option<String>,
    namespace: &Option<String>,
    labels: &Labels,
    annotations: Option<BTreeMap<String, String>>,
) -> ObjectMeta {
    let labels = match labels {
        Labels::Absent => None,
        Labels::Present { name_label } => Some(
            name_label
                .iter()
                .map(|value| (LABEL_NAME.to_owned(), value.clone()))
                .collect(),
        ),
    };
    ObjectMeta {
        name: name.clone(),
        generate_name: generate_name.clone(),
        namespace: namespace.clone(),
        labels,
        annotations,
        ..ObjectMeta::default()
    }
}

/// The stored object of an UPDATE after one pass: what the update rules and the ratchet
/// read of its metadata, its spec not yet decoded.
#[derive(Deserialize)]
pub struct Stored<'a> {
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
    #[serde(default, borrow)]
    metadata: StoredMeta<'a>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredMeta<'a> {
    #[serde(default, borrow)]
    annotations: Annotations<'a>,
    #[serde(default, borrow)]
    name: Loose<'a>,
    #[serde(default, borrow)]
    labels: LooseMap<'a>,
    #[serde(default)]
    deletion_timestamp: Option<IgnoredAny>,
}

/// What the ratchet compares of an object ([`crate::admission::ratchet`]).
#[derive(Debug)]
pub struct Facts<'s> {
    /// The spec as the API server wrote it, compared as text.
    pub spec: Option<SpecText<'s>>,
    pub name: Option<&'s str>,
    /// Absent, null and empty are all empty.
    pub labels: &'s StringMap<'s>,
    pub annotations: &'s StringMap<'s>,
    /// `deletionTimestamp` is set.
    pub deleting: bool,
}

/// A spec as the text of its JSON: it can be compared, not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecText<'s>(&'s str);

impl<M: Metadata> Written<'_, M> {
    /// What the ratchet compares; `None` when the pass did not keep it, or a label or
    /// annotation is not a string.
    pub fn facts(&self) -> Option<Facts<'_>> {
        let (name, labels, annotations) = self.metadata.for_ratchet()?;
        Some(Facts {
            spec: self.spec.map(|spec| SpecText(spec.get())),
            name,
            labels,
            annotations,
            deleting: false,
        })
    }

    /// The AppService of `version`: the spec is checked for size, then decoded; metadata
    /// holds what the rules read.
    pub fn decode(&self, version: Version) -> Result<Object, ObjectError> {
        let (metadata, labels) = self.metadata.for_rules();
        decode(self.spec, metadata, labels, version)
    }
}

impl Stored<'_> {
    /// What the ratchet compares; `None` when the name, a label or an annotation is not a
    /// string.
    pub fn facts(&self) -> Option<Facts<'_>> {
        let meta = &self.metadata;
        let name = match &meta.name {
            Loose::Null => None,
            Loose::Text(name) => Some(name.as_ref()),
            Loose::Other => return None,
        };
        if meta.labels.odd || meta.annotations.odd {
            return None;
        }
        Some(Facts {
            spec: self.spec.map(|spec| SpecText(spec.get())),
            name,
            labels: &meta.labels.all,
            annotations: &meta.annotations.all,
            deleting: meta.deletion_timestamp.is_some(),
        })
    }

    /// The spec of the stored AppService (the update rules compare specs), checked for
    /// size, then decoded; metadata holds only the conversion annotations.
    pub fn decode(&self, version: Version) -> Result<Object, ObjectError> {
        let metadata = ObjectMeta {
            annotations: self.metadata.annotations.conversion(),
            ..ObjectMeta::default()
        };
        decode(self.spec, metadata, Labels::Absent, version)
    }
}

fn decode(
    spec: Option<&RawValue>,
    metadata: ObjectMeta,
    labels: Labels,
    version: Version,
) -> Result<Object, ObjectError> {
    let Some(spec) = spec else {
        return Err(ObjectError::Invalid("missing field `spec`".to_owned()));
    };
    if let Some(errors) = shape::oversized(spec) {
        return Err(ObjectError::TooLarge(errors));
    }
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
    Ok(Object { app, labels })
}

fn typed_spec<S: DeserializeOwned>(spec: &RawValue) -> Result<S, ObjectError> {
    decode_at(spec.get().as_bytes(), "spec").map_err(ObjectError::invalid)
}

/// `metadata.labels` as the rules read it: whether the map is there, and its name label;
/// every other label is skipped without being stored.
#[derive(Default)]
struct NameLabel(Labels);

impl<'de> Deserialize<'de> for NameLabel {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NameLabel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_unit<E: de::Error>(self) -> Result<NameLabel, E> {
                Ok(NameLabel(Labels::Absent))
            }
            fn visit_none<E: de::Error>(self) -> Result<NameLabel, E> {
                Ok(NameLabel(Labels::Absent))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NameLabel, A::Error> {
                let mut name_label = None;
                while let Some(is_name) = map.next_key_seed(IsKey(LABEL_NAME))? {
                    if is_name {
                        name_label = Some(map.next_value::<String>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(NameLabel(Labels::Present { name_label }))
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

/// `metadata.annotations` as the rules read it: the conversion annotations; every other
/// one is skipped without being stored.
#[derive(Default)]
struct ConversionAnnotations(BTreeMap<String, String>);

impl ConversionAnnotations {
    fn conversion(&self) -> Option<BTreeMap<String, String>> {
        (!self.0.is_empty()).then(|| self.0.clone())
    }
}

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
                let mut kept = BTreeMap::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
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

/// `metadata.labels` of the new object of an UPDATE: as the rules read it, and every
/// label for the ratchet.
#[derive(Default)]
struct LabelsField<'a> {
    labels: Labels,
    all: StringMap<'a>,
    /// A label other than the name label is not a string.
    odd: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for LabelsField<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LabelsField<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of labels")
            }
            fn visit_unit<E: de::Error>(self) -> Result<LabelsField<'de>, E> {
                Ok(LabelsField::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<LabelsField<'de>, E> {
                Ok(LabelsField::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<LabelsField<'de>, A::Error> {
                let mut field = LabelsField::default();
                let mut name_label = None;
                while let Some(Text(key)) = map.next_key()? {
                    if key == LABEL_NAME {
                        let value: String = map.next_value()?;
                        field.all.insert(key, Cow::Owned(value.clone()));
                        name_label = Some(value);
                    } else {
                        field.odd |= insert(&mut field.all, key, map.next_value()?);
                    }
                }
                field.labels = Labels::Present { name_label };
                Ok(field)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `metadata.annotations` of an UPDATE's objects: every annotation, for the ratchet, of
/// which the rules read only the conversion annotations (and refuse one that is not a
/// string).
#[derive(Default)]
struct Annotations<'a> {
    all: StringMap<'a>,
    /// An annotation other than a conversion annotation is not a string.
    odd: bool,
}

impl Annotations<'_> {
    /// The conversion annotations, for the typed object (`None` when there are none).
    fn conversion(&self) -> Option<BTreeMap<String, String>> {
        let kept: BTreeMap<String, String> = CONVERSION_ANNOTATIONS
            .iter()
            .filter_map(|key| Some(((*key).to_owned(), self.all.get(*key)?.to_string())))
            .collect();
        (!kept.is_empty()).then_some(kept)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Annotations<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Annotations<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of annotations")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Annotations<'de>, E> {
                Ok(Annotations::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Annotations<'de>, E> {
                Ok(Annotations::default())
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Annotations<'de>, A::Error> {
                let mut field = Annotations::default();
                while let Some(Text(key)) = map.next_key()? {
                    if CONVERSION_ANNOTATIONS.contains(&key.as_ref()) {
                        let value: String = map.next_value()?;
                        field.all.insert(key, Cow::Owned(value));
                    } else {
                        field.odd |= insert(&mut field.all, key, map.next_value()?);
                    }
                }
                Ok(field)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Puts `value` in `map` when it is a string; true when it is not.
fn insert<'a>(map: &mut StringMap<'a>, key: Cow<'a, str>, value: Loose<'a>) -> bool {
    match value {
        Loose::Text(value) => {
            map.insert(key, value);
            false
        }
        Loose::Null | Loose::Other => true,
    }
}

/// A string, borrowed from the JSON when it holds no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(V)
    }
}

/// Any JSON value, kept when it is a string: what only the ratchet reads.
#[derive(Default)]
enum Loose<'a> {
    /// Absent or null.
    #[default]
    Null,
    Text(Cow<'a, str>),
    Other,
}

impl<'de: 'a, 'a> Deserialize<'de> for Loose<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Loose<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Loose<'de>, E> {
                Ok(Loose::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Loose<'de>, E> {
                Ok(Loose::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Loose<'de>, E> {
                Ok(Loose::Text(Cow::Owned(s)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Loose<'de>, E> {
                Ok(Loose::Null)
            }
            fn visit_none<E: de::Error>(self) -> Result<Loose<'de>, E> {
                Ok(Loose::Null)
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Loose<'de>, E> {
                Ok(Loose::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Loose<'de>, E> {
                Ok(Loose::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Loose<'de>, E> {
                Ok(Loose::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Loose<'de>, E> {
                Ok(Loose::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Loose<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Loose<'de>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Loose::Other)
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// `metadata.labels` of a stored object, read only by the ratchet: anything but a map
/// of strings (or null) is odd.
#[derive(Default)]
struct LooseMap<'a> {
    all: StringMap<'a>,
    odd: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for LooseMap<'a> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        fn odd<'a>() -> LooseMap<'a> {
            LooseMap {
                all: StringMap::new(),
                odd: true,
            }
        }
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = LooseMap<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LooseMap<'de>, A::Error> {
                let mut field = LooseMap::default();
                while let Some(Text(key)) = map.next_key()? {
                    field.odd |= insert(&mut field.all, key, map.next_value()?);
                }
                Ok(field)
            }
            fn visit_unit<E: de::Error>(self) -> Result<LooseMap<'de>, E> {
                Ok(LooseMap::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<LooseMap<'de>, E> {
                Ok(LooseMap::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<LooseMap<'de>, E> {
                Ok(odd())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<LooseMap<'de>, E> {
                Ok(odd())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<LooseMap<'de>, E> {
                Ok(odd())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<LooseMap<'de>, E> {
                Ok(odd())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<LooseMap<'de>, E> {
                Ok(odd())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LooseMap<'de>, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(odd())
            }
        }
        deserializer.deserialize_any(V)
    }
}
