//! The `AppService` API's names without a version: the bounds and default values
//! ([`crate::limits`]), what both versions share ([`crate::shared`]: the environment
//! variable and status types), and the hub. The versions themselves live in
//! [`crate::v1alpha1`] and [`crate::v1beta1`]; the names here without a version
//! (`AppService`, `AppServiceSpec`, `DatabaseSpec`) are the hub, `v1beta1`, the version the
//! API server stores and the controller works on.
//!
//! Optional fields are `Option`s (or empty lists) so that "absent" and "set to the default"
//! stay distinguishable on the wire; [`crate::defaults`] defines the defaults and fills
//! them, and the schema carries the same constants so the API server applies them even
//! when the webhook is not installed.

pub use crate::limits::*;
pub use crate::shared::{AppServiceStatus, CanaryStatus, EnvVar, ImageStatus, ImageVerification};
pub use crate::v1beta1::{
    AppPort, AppService, AppServiceSpec, AutoscalingSpec, CanarySpec, ConfigKind, ConfigSource,
    DatabaseSpec, ExposeSpec, ExposeTls, IssuerRef, PodSecurity, Protocol, RolloutSpec,
    SecurityProfile,
};
