//! The CustomResourceDefinitions, generated from the Rust types, and their YAML form as
//! committed to the Helm chart.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::core::crd::merge_crds;

use crate::database_class::DatabaseClass;
use crate::image_policy::ImagePolicy;
use crate::{v1alpha1, v1beta1};

/// Where the generated AppService CRD lives, relative to the repository root.
/// Not in the chart's `crds/`: Helm would install it there without the conversion webhook
/// and never upgrade it; `templates/crd-appservices.yaml` renders it with its conversion.
pub const CRD_PATH: &str = "charts/appservice-operator/files/appservices.platform.example.com.yaml";
/// Where the generated DatabaseClass CRD lives, relative to the repository root.
pub const DATABASE_CLASS_CRD_PATH: &str =
    "charts/appservice-operator/crds/databaseclasses.platform.example.com.yaml";

/// Where the generated ImagePolicy CRD lives, relative to the repository root.
pub const IMAGE_POLICY_CRD_PATH: &str =
    "charts/appservice-operator/crds/imagepolicies.platform.example.com.yaml";

fn header(source: &str) -> String {
    format!(
        "# Generated from {source} by `cargo xtask crd`. Do not edit by hand:\n\
         # a test fails when this file differs from what the code generates.\n"
    )
}

/// The version the API server stores AppServices in.
pub const STORAGE_VERSION: &str = "v1beta1";

/// The AppService CRD: `v1alpha1` and `v1beta1` served, `v1beta1` stored. It carries no
/// `spec.conversion`: where the conversion webhook runs is the installation's business
/// (the chart's template adds it); without it the API server would convert by relabelling.
pub fn crd() -> Result<CustomResourceDefinition, Error> {
    Ok(merge_crds(
        vec![v1alpha1::AppService::crd(), v1beta1::AppService::crd()],
        STORAGE_VERSION,
    )?)
}

/// Why a CRD could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("merging the AppService versions into one CRD: {0}")]
    Merge(kube::core::crd::MergeError),
    #[error("serializing a CRD: {0}")]
    Yaml(serde_saphyr::ser::Error),
}

impl From<kube::core::crd::MergeError> for Error {
    fn from(e: kube::core::crd::MergeError) -> Self {
        Error::Merge(e)
    }
}

impl From<serde_saphyr::ser::Error> for Error {
    fn from(e: serde_saphyr::ser::Error) -> Self {
        Error::Yaml(e)
    }
}

/// The DatabaseClass CRD.
pub fn database_class_crd() -> CustomResourceDefinition {
    DatabaseClass::crd()
}

/// The ImagePolicy CRD, installed with the chart (the controller enforces it).
pub fn image_policy_crd() -> CustomResourceDefinition {
    ImagePolicy::crd()
}

/// The AppService CRD as the YAML document committed under [`CRD_PATH`].
pub fn crd_yaml() -> Result<String, Error> {
    Ok(format!(
        "{}{}",
        header("common/src/v1alpha1.rs and common/src/v1beta1.rs"),
        serde_saphyr::to_string(&crd()?)?
    ))
}

/// Every generated CRD: `(path relative to the repository root, YAML, source file)`.
pub fn generated() -> Result<Vec<(&'static str, String, &'static str)>, Error> {
    Ok(vec![
        (
            CRD_PATH,
            crd_yaml()?,
            "common/src/v1alpha1.rs and v1beta1.rs",
        ),
        (
            IMAGE_POLICY_CRD_PATH,
            format!(
                "{}{}",
                header("common/src/image_policy.rs"),
                serde_saphyr::to_string(&image_policy_crd())?
            ),
            "common/src/image_policy.rs",
        ),
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
