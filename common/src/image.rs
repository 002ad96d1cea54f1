//! Image references, parsed by the grammar of the distribution project
//! (`github.com/distribution/reference`), which is what containerd and the kubelet
//! implement.
//!
//! oci-spec's `Reference` was used before. Its expression writes the tag as
//! `[\w][\w.-]{0,127}` with Rust's *Unicode* `\w`: 128 copies of the Unicode word class,
//! compiled into an automaton of about 7.7 MB on first use (measured with heaptrack),
//! held by every webhook and controller process for its lifetime, and slow to run. In
//! the Go original `\w` is ASCII, so it also accepted tags such as `v1-ü` that no
//! runtime can pull. This is the same grammar with ASCII classes, compiled by the
//! `regex` crate once per process (a few kilobytes).

use std::sync::LazyLock;

use regex::Regex;

/// The longest repository name (domain and path), as in the distribution project.
pub const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// `name[:tag][@digest]`, anchored, with the name, tag and digest captured. Built from
/// the distribution grammar:
///
/// ```text
/// reference  := name [ ":" tag ] [ "@" digest ]
/// name       := [domain '/'] remote-name
/// domain     := host [':' port-number]
/// host       := domain-name | IPv4address | \[ IPv6address \]
/// remote-name:= path-component ['/' path-component]*
/// path-component := alpha-numeric [separator alpha-numeric]*
/// separator  := /[_.]|__|[-]+/
/// tag        := /[\w][\w.-]{0,127}/            (ASCII \w)
/// digest     := algorithm ":" encoded
/// ```
static REFERENCE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    let alnum = "[a-z0-9]+";
    let separator = "(?:[._]|__|[-]+)";
    let component = format!("{alnum}(?:{separator}{alnum})*");
    let domain_component = "(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])";
    let ipv6 = r"\[(?:[a-fA-F0-9:]+)\]";
    let host = format!(r"(?:{domain_component}(?:\.{domain_component})*|{ipv6})");
    let domain = format!("{host}(?::[0-9]+)?");
    let name = format!("(?:{domain}/)?{component}(?:/{component})*");
    let tag = r"[\w][\w.-]{0,127}";
    let digest = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}";
    // `(?-u)`: ASCII classes, as in Go.
    Regex::new(&format!(r"(?-u)^({name})(?::({tag}))?(?:@({digest}))?$")).ok()
});

/// Why a string is not an image reference (the distribution project's messages).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("repository name must have at least one component")]
    NameEmpty,
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("repository name must not be more than {NAME_TOTAL_LENGTH_MAX} characters")]
    NameTooLong,
    #[error("unsupported digest algorithm")]
    DigestUnsupported,
    #[error("invalid checksum digest length")]
    DigestInvalidLength,
    /// The encoded part is not lower-case hex. The reference grammar allows `A-F`, but
    /// go-digest (what containerd and the kubelet parse digests with) refuses them.
    #[error("invalid checksum digest format")]
    DigestInvalidFormat,
}

/// The parts of an image reference, borrowed from the string parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRef<'a> {
    pub name: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// Parses `image` as the kubelet would pull it.
pub fn parse(image: &str) -> Result<ImageRef<'_>, ImageError> {
    if image.is_empty() {
        return Err(ImageError::NameEmpty);
    }
    // The expression is a constant: it always compiles (a unit test holds it to that).
    let re = REFERENCE.as_ref().ok_or(ImageError::InvalidFormat)?;
    let caps = re.captures(image).ok_or(ImageError::InvalidFormat)?;
    let name = caps.get(1).map_or("", |m| m.as_str());
    if name.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ImageError::NameTooLong);
    }
    let digest = caps.get(3).map(|m| m.as_str());
    if let Some(digest) = digest {
        let (algorithm, encoded) = digest.split_once(':').unwrap_or((digest, ""));
        let want = match algorithm {
            "sha256" => 64,
            "sha384" => 96,
            "sha512" => 128,
            _ => return Err(ImageError::DigestUnsupported),
        };
        // go-digest's order: the length first, then the characters.
        if encoded.len() != want {
            return Err(ImageError::DigestInvalidLength);
        }
        if !encoded
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(ImageError::DigestInvalidFormat);
        }
    }
    Ok(ImageRef {
        name,
        tag: caps.get(2).map(|m| m.as_str()),
        digest,
    })
}

/// Docker Hub, as image references name it when they name no registry.
pub const DOCKER_HUB: &str = "docker.io";

/// Whether the first component of a name is a registry host rather than a path (the
/// distribution project's rule: it has a dot, a port or an upper-case letter, or is
/// `localhost`).
pub fn is_registry_host(component: &str) -> bool {
    component.contains('.')
        || component.contains(':')
        || component == "localhost"
        || component.bytes().any(|b| b.is_ascii_uppercase())
}

/// The repository `image` is pulled from, normalized as the kubelet does: the registry
/// host always present and in lower case (`nginx` → `docker.io/library/nginx`,
/// `index.docker.io/x/y` → `docker.io/x/y`, `Registry.Example.com/a` →
/// `registry.example.com/a`), tag and digest dropped. Image policies match on this, so
/// no spelling of a reference escapes them.
pub fn repository(image: &str) -> Result<String, ImageError> {
    let name = parse(image)?.name;
    let (host, path) = match name.split_once('/') {
        Some((first, rest)) if is_registry_host(first) => (first.to_ascii_lowercase(), rest),
        _ => (DOCKER_HUB.to_owned(), name),
    };
    let host = if host == "index.docker.io" {
        DOCKER_HUB.to_owned()
    } else {
        host
    };
    if host == DOCKER_HUB && !path.contains('/') {
        return Ok(format!("{host}/library/{path}"));
    }
    Ok(format!("{host}/{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_compiles() {
        assert!(REFERENCE.is_some());
    }

    #[test]
    fn accepted_forms() {
        let sha = "a".repeat(64);
        for (image, name, tag, digest) in [
            ("nginx", "nginx", None, None),
            ("nginx:1.27", "nginx", Some("1.27"), None),
            (
                "registry.example.com:5000/team/app:v1.2.3",
                "registry.example.com:5000/team/app",
                Some("v1.2.3"),
                None,
            ),
            (
                "localhost/app_x__y-z.w:TAG_1",
                "localhost/app_x__y-z.w",
                Some("TAG_1"),
                None,
            ),
            ("[::1]:5000/app:v1", "[::1]:5000/app", Some("v1"), None),
        ] {
            let r = parse(image).unwrap_or_else(|e| panic!("{image}: {e}"));
            assert_eq!((r.name, r.tag, r.digest), (name, tag, digest), "{image}");
        }
        let pinned = format!("registry.example.com/app:v1@sha256:{sha}");
        let r = parse(&pinned).unwrap();
        assert_eq!(r.tag, Some("v1"));
        assert_eq!(r.digest, Some(format!("sha256:{sha}").as_str()));
    }

    #[test]
    fn repositories_are_normalized() {
        let sha = "a".repeat(64);
        for (image, repo) in [
            ("nginx", "docker.io/library/nginx"),
            ("nginx:1.27", "docker.io/library/nginx"),
            ("library/nginx", "docker.io/library/nginx"),
            ("docker.io/nginx", "docker.io/library/nginx"),
            ("index.docker.io/bitnami/nginx:1", "docker.io/bitnami/nginx"),
            ("bitnami/nginx", "docker.io/bitnami/nginx"),
            ("localhost/app", "localhost/app"),
            ("localhost:5000/team/app:v1", "localhost:5000/team/app"),
            (
                "Registry.Example.com/team/app",
                "registry.example.com/team/app",
            ),
            ("REGISTRY/app", "registry/app"),
            ("[::1]:5000/app", "[::1]:5000/app"),
        ] {
            assert_eq!(repository(image).unwrap(), repo, "{image}");
        }
        let pinned = format!("registry.example.com/app@sha256:{sha}");
        assert_eq!(repository(&pinned).unwrap(), "registry.example.com/app");
        assert_eq!(repository("app:"), Err(ImageError::InvalidFormat));
    }

    #[test]
    fn refused_forms() {
        let long_tag = format!("app:{}", "t".repeat(129));
        let long_name = format!("{}/app", "a".repeat(256));
        for (image, err) in [
            ("", ImageError::NameEmpty),
            ("team/App", ImageError::InvalidFormat),
            ("app:", ImageError::InvalidFormat),
            ("app:-tag", ImageError::InvalidFormat),
            ("app:v1-ü", ImageError::InvalidFormat),
            ("app::v1", ImageError::InvalidFormat),
            ("app@sha256:abc", ImageError::InvalidFormat),
            (long_tag.as_str(), ImageError::InvalidFormat),
            (long_name.as_str(), ImageError::NameTooLong),
            (" app", ImageError::InvalidFormat),
            ("app/", ImageError::InvalidFormat),
            ("a//b", ImageError::InvalidFormat),
        ] {
            assert_eq!(parse(image), Err(err), "{image:?}");
        }
        let md5 = format!("app@md5:{}", "a".repeat(32));
        assert_eq!(parse(&md5), Err(ImageError::DigestUnsupported));
        let short = format!("app@sha256:{}", "a".repeat(63));
        assert_eq!(parse(&short), Err(ImageError::DigestInvalidLength));
    }

    #[test]
    fn digests_are_lower_case_hex() {
        for (algorithm, len) in [("sha256", 64), ("sha384", 96), ("sha512", 128)] {
            let lower = format!("app@{algorithm}:{}", "ab".repeat(len / 2));
            assert!(parse(&lower).is_ok(), "{lower}");
            let upper = format!("app@{algorithm}:{}", "AB".repeat(len / 2));
            assert_eq!(
                parse(&upper),
                Err(ImageError::DigestInvalidFormat),
                "{upper}"
            );
            let one = format!("app:v1@{algorithm}:{}F", "a".repeat(len - 1));
            assert_eq!(parse(&one), Err(ImageError::DigestInvalidFormat), "{one}");
            assert_eq!(repository(&one), Err(ImageError::DigestInvalidFormat));
        }
        // go-digest's message, and its order: a wrong length is reported as such.
        assert_eq!(
            ImageError::DigestInvalidFormat.to_string(),
            "invalid checksum digest format"
        );
        let short_upper = format!("app@sha256:{}", "A".repeat(63));
        assert_eq!(parse(&short_upper), Err(ImageError::DigestInvalidLength));
    }
}
