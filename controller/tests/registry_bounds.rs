//! Image verification against a hostile registry (`harness::HostileRegistry`): every
//! answer the controller reads from a registry has a bound, and a registry that goes
//! past it gets a verdict naming the bound, not the controller's memory. The controller
//! runs in process at its shipped defaults (registry timeout 10 s), with one `Enforce`
//! policy over the hostile registry in the test's namespace (`support::hostile`).
//!
//! A verdict alone would not show that the controller stopped reading: a client that
//! buffers 256 MiB and then refuses it gets the same condition. So each test also reads
//! how many body bytes the server produced for each request, and the verdict wait fails
//! as soon as any request goes past what a bounded client can have been sent
//! ([`ceiling`]), without waiting for a whole huge body.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use anyhow::Context as _;
use common::conditions::reasons::{REGISTRY_RESPONSE_INVALID, REGISTRY_RESPONSE_TOO_LARGE};
use common::conditions::{FALSE, UNKNOWN, reasons};
use harness::hostile_registry::{
    DRIP_BYTES, HUGE_BYTES, HUGE_SIGNATURE_BYTES, Length, REDIRECT_CHAIN_HOPS,
};
use harness::{HostileRequest, Scenario};
use support::hostile::{FIRST, Hostile};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// The largest bound any one registry response may have (a manifest's); the bound of
/// a response the verdict does not name (an error body) is taken to be this.
const LARGEST_BOUND: u64 = 4 * MIB;
/// What a condition message may hold of a registry's error body: the registry's text
/// is cut, never copied whole into the AppService's status.
const MAX_MESSAGE: usize = 1024;

/// The most body bytes the server can have produced for a request whose client stopped
/// reading at `bound`: the client may notice the bound only after the read that crossed
/// it, which we allow to be as large as the bound itself (2 × `bound`); what the client
/// never read may then sit in its socket's receive buffer and ours's send buffer (at
/// most `tcp_rmem` and `tcp_wmem`'s maximum, which autotuning can reach on loopback),
/// and in hyper's write queue (16 chunks of 64 KiB) and rustls' buffer (64 KiB) of the
/// server: 2 MiB covers both. On this kind of machine (rmem 32 MiB, wmem 4 MiB) that is
/// 46 MiB for a 4 MiB bound: far under the 128 and 256 MiB bodies, so staying under it
/// means the client stopped, not the body.
fn ceiling(bound: u64) -> u64 {
    2 * bound + tcp_buffer_max("tcp_rmem", 6 * MIB) + tcp_buffer_max("tcp_wmem", 4 * MIB) + 2 * MIB
}

/// The largest socket buffer autotuning may give (`/proc/sys/net/ipv4/<name>`'s third
/// field), or `default`, Linux's, when it cannot be read.
fn tcp_buffer_max(name: &str, default: u64) -> u64 {
    std::fs::read_to_string(format!("/proc/sys/net/ipv4/{name}"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(default)
}

/// The bound a verdict names (`... larger than its bound of 4 MiB ...`), in bytes.
fn bound_named(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("larger than its bound of ")?;
    let mut words = rest.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    let unit = match words.next()?.trim_end_matches(|c: char| !c.is_alphabetic()) {
        "B" | "bytes" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => 1024 * MIB,
        _ => return None,
    };
    Some((number * unit as f64) as u64)
}

/// The first request of `scenario` whose body went past `ceiling`, if any.
fn overrun(
    registry: &harness::HostileRegistry,
    scenario: Scenario,
    ceiling: u64,
) -> Option<HostileRequest> {
    registry
        .requests_of(scenario)
        .into_iter()
        .find(|r| r.body_sent > ceiling)
}

impl Hostile {
    /// [`Hostile::verdict`], failing as soon as a request of `scenario` is sent more
    /// than any bounded client can have been sent ([`ceiling`] of [`LARGEST_BOUND`]):
    /// a client that buffers whole bodies fails here in a second, not after 256 MiB.
    async fn verdict_within_bounds(
        &self,
        name: &str,
        scenario: Scenario,
        status: &str,
        reason: &str,
    ) -> anyhow::Result<String> {
        let limit = ceiling(LARGEST_BOUND);
        let what = format!(
            "{name}: a request of {} past {limit} bytes",
            scenario.repo()
        );
        let overran = harness::eventually(&what, 2 * FIRST, || async {
            overrun(&self.registry, scenario, limit)
        });
        tokio::select! {
            message = self.verdict(name, status, reason, FIRST) => message,
            Ok(request) = overran => anyhow::bail!(
                "{name}: the controller read past any bound ({limit} bytes): {request:?}"
            ),
        }
    }

    /// Waits until the server is done with every body of `scenario` (sent whole or cut
    /// off by the client) and returns its requests: a client that stops reading a body
    /// must also close its connection.
    async fn ended(&self, scenario: Scenario) -> anyhow::Result<Vec<HostileRequest>> {
        Ok(harness::eventually(
            &format!("every body of {} ended", scenario.repo()),
            FIRST,
            || async {
                let requests = self.registry.requests_of(scenario);
                match requests.iter().find(|r| !r.body_ended) {
                    None if !requests.is_empty() => Ok(Some(requests)),
                    None => Err("no request yet".into()),
                    Some(open) => Err(format!("still sending {open:?}").into()),
                }
            },
        )
        .await?)
    }

    /// Asserts that no Deployment of `name` exists: its image was never verified.
    async fn nothing_runs(&self, name: &str) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.f.deployments.get_opt(name).await?.is_none(),
            "{name}: a Deployment exists, though nothing was verified"
        );
        Ok(())
    }

    /// The checks of every too-large answer: the verdict names a bound no larger than
    /// [`LARGEST_BOUND`], nothing runs, and no request of `scenario` was sent more than a
    /// client reading up to that bound can have been sent.
    async fn refused_as_too_large(
        &self,
        name: &str,
        scenario: Scenario,
        served: u64,
    ) -> anyhow::Result<u64> {
        let message = self
            .verdict_within_bounds(name, scenario, FALSE, REGISTRY_RESPONSE_TOO_LARGE)
            .await?;
        let bound = bound_named(&message)
            .with_context(|| format!("{name}: no bound named in {message:?}"))?;
        assert!(bound <= LARGEST_BOUND, "{name}: {message}");
        // Below this the byte count would prove nothing on this machine.
        assert!(
            ceiling(bound) < served,
            "{name}: socket buffers of {} bytes hide a bound of {bound}",
            ceiling(bound) - 2 * bound
        );
        self.nothing_runs(name).await?;
        let requests = self.ended(scenario).await?;
        for r in &requests {
            assert!(
                r.body_sent <= ceiling(bound),
                "{name}: {} bytes sent past the bound of {bound} (ceiling {}): {r:?}",
                r.body_sent,
                ceiling(bound)
            );
        }
        println!(
            "{name}: bound {bound} B; body bytes sent per request: {:?}",
            requests
                .iter()
                .map(|r| (r.method.as_str(), r.path.as_str(), r.body_sent))
                .collect::<Vec<_>>()
        );
        Ok(bound)
    }
}

#[tokio::test]
async fn an_unsigned_image_of_the_hostile_registry_is_found_unsigned() -> anyhow::Result<()> {
    // The control: the controller reads this registry (its token, its manifests) and
    // finds what a well-behaved registry would give: an image without signature.
    let w = Hostile::start().await?;
    w.app("control", &w.registry.image(Scenario::Unsigned))
        .await?;
    w.verdict("control", FALSE, reasons::IMAGE_UNSIGNED, FIRST)
        .await?;
    w.nothing_runs("control").await?;
    let asked = w.registry.requests_of(Scenario::Unsigned);
    assert!(asked.iter().any(|r| r.is_signature()), "{asked:?}");
    w.stop().await
}

#[tokio::test]
async fn huge_manifests_declared_or_chunked_are_refused_at_their_bound() -> anyhow::Result<()> {
    // A tag answered without Docker-Content-Digest: its manifest must be read to be
    // digested, and it is 256 MiB.
    let w = Hostile::start().await?;
    let declared = Scenario::HugeManifest(Length::Declared);
    let chunked = Scenario::HugeManifest(Length::Chunked);
    w.app("declared", &w.registry.image(declared)).await?;
    w.app("chunked", &w.registry.image(chunked)).await?;
    w.refused_as_too_large("declared", declared, HUGE_BYTES)
        .await?;
    w.refused_as_too_large("chunked", chunked, HUGE_BYTES)
        .await?;
    w.stop().await
}

#[tokio::test]
async fn huge_signature_manifests_are_refused_at_their_bound() -> anyhow::Result<()> {
    // The tag resolves to a small manifest; its signature manifest is 128 MiB.
    let w = Hostile::start().await?;
    let declared = Scenario::HugeSignature(Length::Declared);
    let chunked = Scenario::HugeSignature(Length::Chunked);
    w.app("declared", &w.registry.image(declared)).await?;
    w.app("chunked", &w.registry.image(chunked)).await?;
    for (name, scenario) in [("declared", declared), ("chunked", chunked)] {
        w.refused_as_too_large(name, scenario, HUGE_SIGNATURE_BYTES)
            .await?;
        // It was the signature that was refused: the tag resolved.
        let asked = w.registry.requests_of(scenario);
        assert!(asked.iter().any(|r| r.is_signature()), "{name}: {asked:?}");
    }
    w.stop().await
}

#[tokio::test]
async fn huge_tokens_are_refused_at_their_bound() -> anyhow::Result<()> {
    // Every request of the repository asks for a bearer token; the token endpoint
    // answers its scope with 256 MiB.
    let w = Hostile::start().await?;
    let declared = Scenario::HugeToken(Length::Declared);
    let chunked = Scenario::HugeToken(Length::Chunked);
    w.app("declared", &w.registry.image(declared)).await?;
    w.app("chunked", &w.registry.image(chunked)).await?;
    for (name, scenario) in [("declared", declared), ("chunked", chunked)] {
        w.refused_as_too_large(name, scenario, HUGE_BYTES).await?;
        let asked = w.registry.requests_of(scenario);
        assert!(
            asked.iter().any(|r| r.path == "/token"),
            "{name}: {asked:?}"
        );
    }
    w.stop().await
}

#[tokio::test]
async fn a_huge_header_is_refused() -> anyhow::Result<()> {
    // The tag's answer carries a 1 MiB header: refused before any body is read.
    let w = Hostile::start().await?;
    w.app("header", &w.registry.image(Scenario::HugeHeader))
        .await?;
    let message = w
        .verdict("header", FALSE, REGISTRY_RESPONSE_TOO_LARGE, FIRST)
        .await?;
    let bound = bound_named(&message).with_context(|| format!("no bound named in {message:?}"))?;
    assert!(
        bound < harness::hostile_registry::HUGE_HEADER_BYTES as u64,
        "{message}"
    );
    w.nothing_runs("header").await?;
    w.stop().await
}

#[tokio::test]
async fn redirect_loops_and_long_chains_are_refused() -> anyhow::Result<()> {
    let w = Hostile::start().await?;
    w.app("loop", &w.registry.image(Scenario::RedirectLoop))
        .await?;
    w.app("chain", &w.registry.image(Scenario::RedirectChain))
        .await?;
    for (name, scenario) in [
        ("loop", Scenario::RedirectLoop),
        ("chain", Scenario::RedirectChain),
    ] {
        let message = w
            .verdict_within_bounds(name, scenario, FALSE, REGISTRY_RESPONSE_INVALID)
            .await?;
        assert!(message.contains("redirects"), "{name}: {message}");
        w.nothing_runs(name).await?;
    }
    // The chain's end, 50 redirects away, was never reached.
    let end = format!("hop={REDIRECT_CHAIN_HOPS}");
    let asked = w.registry.requests_of(Scenario::RedirectChain);
    assert!(
        !asked
            .iter()
            .any(|r| r.query.as_deref() == Some(end.as_str())),
        "{asked:?}"
    );
    w.stop().await
}

#[tokio::test]
async fn huge_error_bodies_are_cut_short_and_classified_by_their_status() -> anyhow::Result<()> {
    // The tag's GET answers 404 or 500 with 256 MiB of error body: the status decides
    // the verdict, as for any error, and the body is read no further than a bound.
    let w = Hostile::start().await?;
    let missing = Scenario::HugeError(404, Length::Declared);
    let failing = Scenario::HugeError(500, Length::Chunked);
    w.app("missing", &w.registry.image(missing)).await?;
    w.app("failing", &w.registry.image(failing)).await?;
    for (name, scenario, status, reason) in [
        ("missing", missing, FALSE, reasons::IMAGE_NOT_FOUND),
        ("failing", failing, UNKNOWN, reasons::REGISTRY_UNAVAILABLE),
    ] {
        let message = w
            .verdict_within_bounds(name, scenario, status, reason)
            .await?;
        assert!(
            message.chars().count() <= MAX_MESSAGE,
            "{name}: a message of {} characters",
            message.chars().count()
        );
        w.nothing_runs(name).await?;
        let requests = w.ended(scenario).await?;
        assert!(
            requests
                .iter()
                .any(|r| r.method == "GET" && r.body_length == HUGE_BYTES),
            "{name}: {requests:?}"
        );
        for r in &requests {
            assert!(r.body_sent <= ceiling(LARGEST_BOUND), "{name}: {r:?}");
        }
    }
    w.stop().await
}

#[tokio::test]
async fn a_dripping_registry_is_cut_by_the_registry_timeout() -> anyhow::Result<()> {
    // The tag's manifest comes one byte a second (17 minutes in all): the registry
    // timeout (10 s) ends the wait, as for a registry that does not answer.
    let w = Hostile::start().await?;
    w.app("drip", &w.registry.image(Scenario::Drip)).await?;
    w.verdict("drip", UNKNOWN, reasons::REGISTRY_UNAVAILABLE, FIRST)
        .await?;
    w.nothing_runs("drip").await?;
    // The client hung up on a body it had not finished: the server saw it go.
    let cut = harness::eventually("a dripping body cut off", FIRST, || async {
        w.registry
            .requests_of(Scenario::Drip)
            .into_iter()
            .find(|r| r.method == "GET" && r.is_manifest() && r.body_ended)
    })
    .await?;
    assert!(!cut.body_complete(), "{cut:?}");
    assert!(cut.body_sent < DRIP_BYTES, "{cut:?}");
    w.stop().await
}

#[test]
fn the_bound_is_read_from_the_message() {
    let message = "127.0.0.1:1/a:v1: the registry's manifest is larger than its bound of 4 MiB";
    assert_eq!(bound_named(message), Some(4 * MIB));
    assert_eq!(
        bound_named("token larger than its bound of 64 KiB."),
        Some(64 * KIB)
    );
    assert_eq!(bound_named("larger than its bound of 512 B"), Some(512));
    assert_eq!(bound_named("too large"), None);
    assert!(
        ceiling(LARGEST_BOUND) < HUGE_SIGNATURE_BYTES,
        "this machine's socket buffers are larger than the bodies that test the bounds"
    );
}
