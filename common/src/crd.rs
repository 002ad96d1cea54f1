//! The CustomResourceDefinition, generated from the Rust types, and its YAML form as
//! committed to the Helm chart.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::types::AppService;

/// Where the generated CRD lives, relative to the repository root.
pub const CRD_PATH: &str = "charts/appservice-operator/crds/appservices.platform.example.com.yaml";

const HEADER: &str = "\
# Generated from common/src/types.rs by `cargo xtask crd`. Do not edit by hand:
# a test fails when this file differs from what the code generates.
";

/// The AppService CRD.
pub fn crd() -> CustomResourceDefinition {
    AppService::crd()
}

/// The CRD as the YAML document committed under [`CRD_PATH`].
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    Ok(format!("{HEADER}{}", serde_saphyr::to_string(&crd())?))
}
