//! A Scale (`autoscaling/v1`) of a write of an AppService's scale subresource: the
//! replicas it asks for and the resourceVersion of the object it scales, nothing else.

use serde::Deserialize;

use super::Json;

impl Json {
    /// The object as a Scale.
    pub fn scale(&self) -> Result<Scale, serde_json::Error> {
        serde_json::from_slice(self.bytes())
    }
}

/// The parts of a Scale the rules need.
#[derive(Debug, Deserialize)]
pub struct Scale {
    #[serde(default)]
    metadata: ScaleMeta,
    #[serde(default)]
    spec: ScaleSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ScaleMeta {
    #[serde(default)]
    resource_version: Option<String>,
}

/// `replicas` is `omitempty` in Go: a Scale to zero has no `replicas` at all.
#[derive(Debug, Default, Deserialize)]
struct ScaleSpec {
    #[serde(default)]
    replicas: i32,
}

impl Scale {
    pub fn replicas(&self) -> i32 {
        self.spec.replicas
    }

    /// The resourceVersion of the scaled object (in an old Scale: the stored one).
    pub fn into_resource_version(self) -> Option<String> {
        self.metadata.resource_version
    }
}
