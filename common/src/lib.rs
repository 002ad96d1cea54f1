//! The AppService API shared by the webhook and the controller: types and CRD, defaulting,
//! validation, conditions, and the names and labels of children. Everything here is pure,
//! so one rule lives in one place and is unit-tested without a cluster.
//!
//! The API has two versions: [`v1alpha1`] (served) and [`v1beta1`] (served and stored, the
//! hub). The unversioned names (`common::AppService`, `common::types::*`) are the hub;
//! [`conversion`] converts between the two without losing anything.

pub mod conditions;
pub mod conversion;
pub mod crd;
pub mod database_class;
pub mod defaults;
pub mod duration;
pub mod field_errors;
pub mod image;
pub mod image_policy;
pub mod limits;
pub mod names;
pub mod namespace_selector;
pub mod quantity;
pub mod shared;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod types;
pub mod v1alpha1;
pub mod v1beta1;
pub mod validation;

pub use database_class::{
    DatabaseClass, DatabaseClassSpec, DatabaseClassStatus, DeletionPolicy, OrphanPolicy, TlsMode,
};
pub use types::{
    AppPort, AppService, AppServiceSpec, AppServiceStatus, AutoscalingSpec, CanarySpec,
    CanaryStatus, ConfigKind, ConfigSource, DatabaseSpec, EnvVar, ExposeSpec, ExposeTls,
    ImageStatus, ImageVerification, IssuerRef, PodSecurity, Protocol, RolloutSpec, SecurityProfile,
};
