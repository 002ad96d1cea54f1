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

use std::net::{Ipv4Addr, Ipv6Addr};
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

/// The repository `image` is pulled from, normalized as the kubelet pulls it: the
/// registry host always present and spelled one way ([`normalize_host`]: `nginx` →
/// `docker.io/library/nginx`, `index.docker.io/x/y` → `docker.io/x/y`,
/// `Registry.Example.com:443/a` → `registry.example.com/a`, `127.0.0.1:5000/a` →
/// `localhost:5000/a`), tag and digest dropped. Image policies match on this, so no
/// spelling of a reference escapes them.
pub fn repository(image: &str) -> Result<String, ImageError> {
    let (host, path) = split_name(parse(image)?.name, normalize_host);
    Ok(format!("{host}/{path}"))
}

/// A reference's name (as [`parse`] gives it) split into its registry host, written by
/// `spell` (Docker Hub when the name has none), and its repository path on that
/// registry (`library/` before Docker Hub's one-component names). Policies spell the host
/// with [`normalize_host`]; the registry client keeps the host it connects to.
pub fn split_name(name: &str, spell: impl Fn(&str) -> String) -> (String, String) {
    let (host, path) = match name.split_once('/') {
        Some((first, rest)) if is_registry_host(first) => (spell(first), rest),
        _ => (DOCKER_HUB.to_owned(), name),
    };
    if host == DOCKER_HUB && !path.contains('/') {
        return (host, format!("library/{path}"));
    }
    (host, path.to_owned())
}

/// A registry host (`host[:port]`, as the first component of a reference names it) in
/// the one spelling image policies match on. One registry answers to many spellings, and
/// a policy written for one of them must govern them all, or an image escapes it by
/// naming its registry another way:
///
/// * letters in lower case (DNS names are case-insensitive);
/// * every loopback address, and the unspecified address (Linux connects `0.0.0.0` and
///   `::` to the local host), is `localhost`: `127.0.0.0/8`, `[::1]` in any spelling
///   (`[0:0:0:0:0:0:0:1]`), `[::ffff:127.0.0.1]`;
/// * an IPv4 address in any form glibc's `inet_aton` reads, which is what `getaddrinfo`
///   resolves a numeric host with (`2130706433`, `0x7f.0.0.1`, `0177.0.0.1`, `127.1`),
///   is written in dotted decimal;
/// * an IPv4-mapped IPv6 address is its IPv4 address; any other IPv6 address is its
///   RFC 5952 form in brackets (`[2001:DB8:0::1]` → `[2001:db8::1]`);
/// * the port loses its leading zeros (`:05000` → `:5000`), and `:443`, the port of
///   HTTPS that registries are reached on when no port is named, is dropped;
/// * Docker Hub's other names (`index.docker.io`, `registry-1.docker.io`) are
///   [`DOCKER_HUB`].
///
/// Anything else (a host name) is returned in lower case. Distinct registries may come
/// out as one (`127.0.0.2:5000` and `localhost:5000`): a policy then governs more, never
/// less.
pub fn normalize_host(host: &str) -> String {
    let host = host.to_ascii_lowercase();
    let (name, port) = split_port(&host);
    let name = normalize_host_name(name);
    let port = port.map(|port| {
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
            return port; // not a port a reference can hold: kept as written
        }
        match port.trim_start_matches('0') {
            "" => "0",
            digits => digits,
        }
    });
    let host = match port {
        Some(port) if port != "443" => format!("{name}:{port}"),
        _ => name,
    };
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_owned(),
        _ => host,
    }
}

/// `host[:port]` into the host and the port, the brackets of an IPv6 address kept.
fn split_port(host: &str) -> (&str, Option<&str>) {
    let after_address = if host.starts_with('[') {
        host.find(']').map_or(host.len(), |i| i + 1)
    } else {
        0
    };
    match host[after_address..].find(':') {
        Some(i) => (
            &host[..after_address + i],
            Some(&host[after_address + i + 1..]),
        ),
        None => (host, None),
    }
}

/// A host without its port, in lower case, per [`normalize_host`].
fn normalize_host_name(name: &str) -> String {
    if let Some(inner) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        let Ok(v6) = inner.parse::<Ipv6Addr>() else {
            return name.to_owned();
        };
        if v6.is_loopback() || v6.is_unspecified() {
            return LOCALHOST.to_owned();
        }
        return match v6.to_ipv4_mapped() {
            Some(v4) => normalize_ipv4(v4),
            None => format!("[{v6}]"),
        };
    }
    match inet_aton(name) {
        Some(v4) => normalize_ipv4(v4),
        None => name.to_owned(),
    }
}

/// The name every loopback address is written as.
const LOCALHOST: &str = "localhost";

fn normalize_ipv4(v4: Ipv4Addr) -> String {
    if v4.is_loopback() || v4.is_unspecified() {
        LOCALHOST.to_owned()
    } else {
        v4.to_string()
    }
}

/// An IPv4 address as glibc's `inet_aton` (and so `getaddrinfo`) reads it: one to four
/// numbers separated by dots, each decimal, octal after a leading `0` or hexadecimal
/// after `0x`; the last number fills the bits the others leave (`a`: 32 bits, `a.b`:
/// 8 and 24, `a.b.c`: 8, 8 and 16, `a.b.c.d`: 8 each). `None` when `s` is not one.
fn inet_aton(s: &str) -> Option<Ipv4Addr> {
    let mut numbers = [0u32; 4];
    let mut count = 0;
    for part in s.split('.') {
        *numbers.get_mut(count)? = inet_aton_number(part)?;
        count += 1;
    }
    let (last, leading) = numbers[..count].split_last()?;
    if leading.iter().any(|&n| n > 0xff) {
        return None;
    }
    let leading_bits = 8 * leading.len() as u32;
    if leading_bits > 0 && u64::from(*last) >= 1u64 << (32 - leading_bits) {
        return None;
    }
    let address = leading
        .iter()
        .enumerate()
        .fold(*last, |acc, (i, &n)| acc | n << (24 - 8 * i as u32));
    Some(Ipv4Addr::from(address))
}

/// One number of [`inet_aton`]: `0x` hex, `0` octal, else decimal; at most 32 bits.
fn inet_aton_number(part: &str) -> Option<u32> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1
        && let Some(octal) = part.strip_prefix('0')
    {
        (octal, 8)
    } else {
        (part, 10)
    };
    // from_str_radix also takes a sign, which inet_aton does not.
    if digits.is_empty() || !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

/// The warning for a reference that names both a tag and a digest
/// (`app:v1@sha256:…`), or `None`. The runtime pulls the digest and ignores the tag, so
/// every column and log line that shows the tag says something that may not run. The
/// text starts with "names both": the caller puts the field or the reference before it.
pub fn tag_and_digest(image: &str) -> Option<String> {
    let reference = parse(image).ok()?;
    let (tag, digest) = (reference.tag?, reference.digest?);
    Some(format!(
        "names both tag {tag:?} and digest {digest}: the digest runs and the tag is ignored; write one of them"
    ))
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
            ("[::1]:5000/app", "localhost:5000/app"),
            ("127.0.0.1:5000/app:v1", "localhost:5000/app"),
            ("registry-1.docker.io/nginx", "docker.io/library/nginx"),
            ("docker.io:443/library/nginx", "docker.io/library/nginx"),
            ("registry.example.com:0443/app", "registry.example.com/app"),
            // A number without a dot or a port is a path, as the runtime reads it.
            ("2130706433/app", "docker.io/2130706433/app"),
            ("2130706433:5000/app", "localhost:5000/app"),
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

    #[test]
    fn hosts_are_spelled_one_way() {
        for (host, want) in [
            ("registry.example.com", "registry.example.com"),
            ("Registry.Example.COM:5000", "registry.example.com:5000"),
            ("localhost", "localhost"),
            ("LOCALHOST:5000", "localhost:5000"),
            // Loopback, every spelling.
            ("127.0.0.1", "localhost"),
            ("127.0.0.1:5000", "localhost:5000"),
            ("127.1.2.3:5000", "localhost:5000"),
            ("[::1]:5000", "localhost:5000"),
            ("[::1]", "localhost"),
            ("[0:0:0:0:0:0:0:1]:5000", "localhost:5000"),
            ("[0000::0001]:5000", "localhost:5000"),
            ("[::ffff:127.0.0.1]:5000", "localhost:5000"),
            ("[::ffff:7f00:1]:5000", "localhost:5000"),
            ("0.0.0.0:5000", "localhost:5000"),
            ("[::]:5000", "localhost:5000"),
            // Numeric IPv4 as inet_aton reads it.
            ("2130706433:5000", "localhost:5000"),
            ("0x7f.0.0.1:5000", "localhost:5000"),
            ("0X7F.0.0.1:5000", "localhost:5000"),
            ("0177.0.0.1:5000", "localhost:5000"),
            ("127.1:5000", "localhost:5000"),
            ("127.0.1:5000", "localhost:5000"),
            ("0x7f000001:5000", "localhost:5000"),
            ("10.0.0.1:5000", "10.0.0.1:5000"),
            ("010.0.0.1:5000", "8.0.0.1:5000"),
            ("167772161:5000", "10.0.0.1:5000"),
            ("10.1:5000", "10.0.0.1:5000"),
            ("192.168.1", "192.168.0.1"),
            ("[::ffff:10.0.0.1]", "10.0.0.1"),
            ("[::ffff:a00:1]:5000", "10.0.0.1:5000"),
            // Not numbers: names.
            ("0x.0.0.1", "0x.0.0.1"),
            ("08.0.0.1", "08.0.0.1"),
            ("0x1g.0.0.1", "0x1g.0.0.1"),
            ("256.0.0.1", "256.0.0.1"),
            ("1.2.3.256", "1.2.3.256"),
            ("1.2.65536", "1.2.65536"),
            ("1.2.3.4.5", "1.2.3.4.5"),
            ("4294967296", "4294967296"),
            ("1e100.net", "1e100.net"),
            ("127.0.0.1.nip.io:5000", "127.0.0.1.nip.io:5000"),
            // IPv6: RFC 5952.
            ("[2001:DB8:0:0::1]:5000", "[2001:db8::1]:5000"),
            ("[2001:0db8:0000:0000:0000:0000:0000:0001]", "[2001:db8::1]"),
            ("[fe80::1]:443", "[fe80::1]"),
            ("[:::]:5000", "[:::]:5000"),
            // Ports.
            ("registry.example.com:05000", "registry.example.com:5000"),
            ("registry.example.com:443", "registry.example.com"),
            ("registry.example.com:00443", "registry.example.com"),
            ("registry.example.com:4430", "registry.example.com:4430"),
            ("registry.example.com:80", "registry.example.com:80"),
            ("registry.example.com:000", "registry.example.com:0"),
            ("localhost:0443", "localhost"),
            // Docker Hub.
            ("docker.io", "docker.io"),
            ("index.docker.io", "docker.io"),
            ("Registry-1.Docker.io", "docker.io"),
            ("index.docker.io:443", "docker.io"),
            ("index.docker.io:5000", "index.docker.io:5000"),
        ] {
            assert_eq!(normalize_host(host), want, "{host}");
            // Once is enough.
            assert_eq!(normalize_host(want), want, "{want}");
        }
    }

    #[test]
    fn inet_aton_reads_what_glibc_reads() {
        for (s, want) in [
            ("0", Some([0, 0, 0, 0])),
            ("1.2.3.4", Some([1, 2, 3, 4])),
            ("0xff.0377.255.0", Some([255, 255, 255, 0])),
            ("1.0x10000", Some([1, 1, 0, 0])),
            ("1.0xffffff", Some([1, 255, 255, 255])),
            ("1.0x1000000", None),
            ("1.2.0xffff", Some([1, 2, 255, 255])),
            ("1.2.0x10000", None),
            ("4294967295", Some([255, 255, 255, 255])),
            ("0xffffffff", Some([255, 255, 255, 255])),
            ("037777777777", Some([255, 255, 255, 255])),
            ("0x100000000", None),
            ("00000000000000000000000177.1", Some([127, 0, 0, 1])),
            ("", None),
            ("1..2", None),
            ("1.2.3.", None),
            (".1.2.3", None),
            ("+1.2.3.4", None),
            ("0x+1.2.3.4", None),
            ("1.2.3.4 ", None),
        ] {
            assert_eq!(inet_aton(s), want.map(Ipv4Addr::from), "{s:?}");
        }
    }

    #[test]
    fn a_tag_beside_a_digest_is_named() {
        let sha = "a".repeat(64);
        assert_eq!(
            tag_and_digest(&format!("registry.example.com:5000/app:v1@sha256:{sha}")).as_deref(),
            Some(
                format!(
                    "names both tag \"v1\" and digest sha256:{sha}: the digest runs and the tag is ignored; write one of them"
                )
                .as_str()
            )
        );
        for image in [
            format!("app@sha256:{sha}"),
            "app:v1".to_owned(),
            "registry.example.com:5000/app".to_owned(),
            format!("app:v1@sha256:{}", "A".repeat(64)),
            "not a reference".to_owned(),
        ] {
            assert_eq!(tag_and_digest(&image), None, "{image}");
        }
    }
}
