//! The AppService API shared by the webhook and the controller: types and CRD, defaulting,
//! validation, conditions, and the names and labels of children. Everything here is pure,
//! so one rule lives in one place and is unit-tested without a cluster.

pub mod conditions;
pub mod crd;
pub mod database_class;
pub mod defaults;
pub mod duration;
pub mod image;
pub mod names;
pub mod types;
pub mod validation;

pub use database_class::{
    DatabaseClass, DatabaseClassSpec, DatabaseClassStatus, DeletionPolicy, TlsMode,
};
pub use types::{AppService, AppServiceSpec, AppServiceStatus, DatabaseSpec, EnvVar};
