//! End-to-end tests of the whole operator on a real control plane; they are in `tests/`.
//! This library is empty: the package exists so that the harness (`tests/`, a library
//! only) needs no product crate, while these tests use the harness and both binaries.

#![forbid(unsafe_code)]
