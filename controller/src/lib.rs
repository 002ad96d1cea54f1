//! The AppService controller, assembled: its core ([`controller_core`]: watches,
//! reconcile, desired state, drift, status, views) and its database provider
//! ([`database`], the crate `controller_database`), which depends on the core's
//! [`external::External`] and never the reverse.
//!
//! This crate holds no logic of its own: it names the parts for the binaries
//! (`src/main.rs`, `src/bin/`) and for the tests and benchmarks of the whole.

pub use controller_core::*;
pub use controller_database as database;
