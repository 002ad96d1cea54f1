//! The AppService controller, assembled: its core ([`controller_core`]: watches,
//! reconcile, desired state, drift, status, views), its database provider
//! ([`database`], the crate `controller_database`), which depends on the core's
//! [`external::External`], its image verification ([`images`], the crate
//! `controller_images`), which depends on the core's [`image_gate::ImageGate`], and its
//! sharding ([`sharding`], the crate `controller_sharding`), which depends on the core's
//! [`share::Share`]; none the reverse.
//!
//! This crate holds no logic of its own: it names the parts for the binaries
//! (`src/main.rs`, `src/bin/`) and for the tests and benchmarks of the whole.

pub use controller_core::*;
pub use controller_database as database;
pub use controller_images as images;
pub use controller_sharding as sharding;
