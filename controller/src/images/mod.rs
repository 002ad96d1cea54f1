//! Image verification (the `ImagePolicy` API of `common::image_policy`): the controller,
//! not the webhook, resolves a tag to a digest, fetches the digest's cosign signatures,
//! and verifies them against the policy's keys, so admission never waits on a registry.
//!
//! | module | holds |
//! | --- | --- |
//! | [`cosign`] | cosign's tag-based signature layout and the pure check of a signature against keys |

pub mod cosign;
