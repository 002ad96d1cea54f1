//! The CustomResourceDefinitions, generated from the Rust types, and their YAML form as
//! committed to the Helm chart.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::database_class::DatabaseClass;
use crate::types::AppService;

/// Where the generated AppService CRD lives, relative to the repository root.
pub const CRD_PATH: &str = "charts/appservice-operator/crds/appservices.platform.example.com.yaml";
/// Where the generated DatabaseClass CRD lives, relative to the repository root.
pub const DATABASE_CLASS_CRD_PATH: &str =
    "charts/appservice-operator/crds/databaseclasses.platform.example.com.yaml";

fn header(source: &str) -> String {
    format!(
        "# Generated from {source} by `cargo xtask crd`. Do not edit by hand:\n\
         # a test fails when this file differs from what the code generates.\n"
    )
}

/// The AppService CRD.
pub fn crd() -> CustomResourceDefinition {
    AppService::crd()
}

/// The DatabaseClass CRD.
pub fn database_class_crd() -> CustomResourceDefinition {
    DatabaseClass::crd()
}

/// The AppService CRD as the YAML document committed under [`CRD_PATH`].
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    Ok(format!(
        "{}{}",
        header("common/src/types.rs"),
        serde_saphyr::to_string(&crd())?
    ))
}

/// Every generated CRD: `(path relative to the repository root, YAML, source file)`.
pub fn generated() -> Result<Vec<(&'static str, String, &'static str)>, serde_saphyr::ser::Error> {
    Ok(vec![
        (CRD_PATH, crd_yaml()?, "common/src/types.rs"),
        (
            DATABASE_CLASS_CRD_PATH,
            format!(
                "{}{}",
                header("common/src/database_class.rs"),
                serde_saphyr::to_string(&database_class_crd())?
            ),
            "common/src/database_class.rs",
        ),
    ])
}
