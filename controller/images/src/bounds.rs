//! Every bound of image verification, in one table: what a registry may make the
//! controller read, hold and wait for. A registry is named by tenants (any image on any
//! host), so each answer is bounded before it is buffered: a body declared larger than
//! its bound is refused before a byte is read, and one that grows past it is cut there
//! (the connection is dropped, the rest never read). With [`MAX_CONCURRENT_REQUESTS`]
//! requests at once, the controller holds at most about
//! `MAX_CONCURRENT_REQUESTS × (SIGNATURE_MANIFEST + its parse)` for registries, whatever
//! they send (measured in `controller/tests/registry_memory.rs`).
//!
//! | what | bound | past it |
//! | --- | --- | --- |
//! | a tag's manifest (read only to hash it, when the registry sends no digest header) | [`MANIFEST`] 4 MiB, as the distribution registry's own limit | `RegistryResponseTooLarge` |
//! | a signature manifest (`sha256-<hex>.sig`) | [`SIGNATURE_MANIFEST`] 1 MiB | `RegistryResponseTooLarge` |
//! | its layers | [`MAX_LAYERS`] 64 looked at | `SignatureInvalid` |
//! | one signature layer (a cosign payload) | [`SIGNATURE_LAYER`] 64 KiB: declared larger, never fetched; never read past it | `SignatureInvalid` |
//! | a base64 signature | [`MAX_SIGNATURE_B64`] 512 B | `SignatureInvalid` |
//! | a token response | [`TOKEN`] 64 KiB | `RegistryResponseTooLarge` |
//! | an error body | [`ERROR_BODY`] 16 KiB read for its error codes, the rest dropped unread | classified by the HTTP status |
//! | redirects of one request | [`MAX_REDIRECTS`] 5, HTTPS only | `RegistryResponseInvalid` |
//! | a response head (status line and headers) | [`RESPONSE_HEAD`] 408 KiB, hyper's own | `RegistryResponseTooLarge` |
//! | time of one operation (token, redirects and body included) | `--registry-timeout` 10 s | `RegistryUnavailable` |
//! | registry requests at once | [`MAX_CONCURRENT_REQUESTS`] 8; the others wait their turn | - |
//! | bearer tokens kept | [`MAX_TOKENS`] 256 (registry × credentials × scope), each until it expires | the map starts again |
//! | a registry's text in a condition | [`MAX_MESSAGE`] 300 characters | cut with `…` |

/// A bound on the bytes of one answer, with the words a status uses to name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// What is bounded, as a message names it ("manifest").
    pub what: &'static str,
    pub bytes: usize,
}

impl Bound {
    /// `4 MiB`, `64 KiB`, `100 B`: the bound as a person reads it.
    pub fn human(&self) -> String {
        let b = self.bytes;
        if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
            format!("{} MiB", b >> 20)
        } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
            format!("{} KiB", b >> 10)
        } else {
            format!("{b} B")
        }
    }
}

pub const MANIFEST: Bound = Bound {
    what: "manifest",
    bytes: 4 << 20,
};
pub const SIGNATURE_MANIFEST: Bound = Bound {
    what: "signature manifest",
    bytes: 1 << 20,
};
pub const SIGNATURE_LAYER: Bound = Bound {
    what: "signature layer",
    bytes: 64 << 10,
};
pub const TOKEN: Bound = Bound {
    what: "token response",
    bytes: 64 << 10,
};
/// hyper's bound on a response head (`8192 + 4096 × 100` bytes, its default, which
/// reqwest keeps): past it hyper refuses the answer.
pub const RESPONSE_HEAD: Bound = Bound {
    what: "response head",
    bytes: 8192 + 4096 * 100,
};
/// Bytes of an error body read for its distribution error codes.
pub const ERROR_BODY: usize = 16 << 10;
pub const MAX_REDIRECTS: usize = 5;
pub const MAX_LAYERS: usize = 64;
/// A DER P-256 signature is at most 72 bytes; its base64 about 96.
pub const MAX_SIGNATURE_B64: usize = 512;
pub const MAX_CONCURRENT_REQUESTS: usize = 8;
pub const MAX_TOKENS: usize = 256;
pub const MAX_MESSAGE: usize = 300;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_read_as_people_write_them() {
        assert_eq!(MANIFEST.human(), "4 MiB");
        assert_eq!(SIGNATURE_MANIFEST.human(), "1 MiB");
        assert_eq!(TOKEN.human(), "64 KiB");
        assert_eq!(RESPONSE_HEAD.human(), "408 KiB");
        assert_eq!(
            Bound {
                what: "x",
                bytes: 1500
            }
            .human(),
            "1500 B"
        );
    }
}
