//! What a hostile registry can cost the controller in memory, measured on the process
//! itself: this test is alone in its binary so that nothing else runs in the process
//! whose resident set it reads (`/proc/self/status`). The hostile registry serves from
//! the same process, but its bodies are generated from one static buffer and never held
//! (`harness::hostile_registry`): what grows is the controller's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use common::conditions::reasons::REGISTRY_RESPONSE_TOO_LARGE;
use common::conditions::{FALSE, reasons};
use harness::Scenario;
use harness::hostile_registry::Length;
use support::hostile::{FIRST, Hostile};

const MIB: u64 = 1024 * 1024;
/// The most the peak resident set may grow while 16 AppServices are refused by hostile
/// registries. The chart limits the controller to 256Mi, and the controller at rest
/// (its caches of AppServices, children and policies, its runtime) needs most of it at
/// scale: a registry must not be able to take more than a quarter. What a bounded client
/// needs is far less: the shipped `--concurrency` of 4 reconciles fetch at once, each
/// holding at most one response of at most its bound (4 MiB for a manifest, the largest)
/// and its decoded form, so 4 × 2 × 4 MiB = 32 MiB at the worst, plus the buffers of the
/// connections. The client this replaces grew by 503 MiB for one 256 MiB manifest.
const MAX_GROWTH: u64 = 64 * MIB;
/// AppServices per scenario, each with its own tag, so that no two share a fetch.
const APPS_PER_SCENARIO: usize = 4;

/// `VmHWM` (the peak resident set) and `VmRSS` of this process, in bytes.
fn memory() -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .ok_or_else(|| anyhow::anyhow!("no {name} in /proc/self/status"))?;
        let kib: u64 = line.trim().trim_end_matches("kB").trim().parse()?;
        Ok(kib * 1024)
    };
    Ok((field("VmHWM:")?, field("VmRSS:")?))
}

#[tokio::test]
async fn hostile_registries_cannot_grow_the_controller_past_a_quarter_of_its_limit()
-> anyhow::Result<()> {
    let w = Hostile::start().await?;
    // One verification through the whole path first, so that what is made once (the
    // registry client, its TLS configuration, the watches' first lists) is in the
    // baseline and not counted as growth.
    w.app("warm-up", &w.registry.image(Scenario::Unsigned))
        .await?;
    w.verdict("warm-up", FALSE, reasons::IMAGE_UNSIGNED, FIRST)
        .await?;

    // The peak is measured from now: writing 5 to clear_refs resets VmHWM to the
    // current resident set (Linux 4.0+). Where it cannot be reset, the old peak stays
    // in the figure and the measure only gets stricter.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (hwm_before, rss_before) = memory()?;
    let scenarios = [
        Scenario::HugeManifest(Length::Declared),
        Scenario::HugeManifest(Length::Chunked),
        Scenario::HugeSignature(Length::Chunked),
        Scenario::HugeToken(Length::Chunked),
    ];
    let mut names = Vec::new();
    for (s, scenario) in scenarios.into_iter().enumerate() {
        for i in 0..APPS_PER_SCENARIO {
            let name = format!("hostile-{s}-{i}");
            let image = w.registry.image_tagged(scenario, &format!("v{i}"));
            w.app(&name, &image).await?;
            names.push(name);
        }
    }
    let verdicts = futures::future::try_join_all(
        names
            .iter()
            .map(|name| w.verdict(name, FALSE, REGISTRY_RESPONSE_TOO_LARGE, 2 * FIRST)),
    );
    // A client that buffers whole bodies fails here as soon as it has grown too much,
    // not after reading gigabytes.
    let grown_too_much = harness::eventually(
        "the peak resident set past its bound",
        4 * FIRST,
        || async {
            let (hwm, _) = memory().ok()?;
            (hwm.saturating_sub(rss_before) >= MAX_GROWTH).then_some(hwm)
        },
    );
    tokio::select! {
        verdicts = verdicts => { verdicts?; }
        Ok(hwm) = grown_too_much => anyhow::bail!(
            "the peak resident set grew by {} MiB (from {} MiB) before every verdict",
            (hwm - rss_before) / MIB,
            rss_before / MIB
        ),
    }
    let (hwm_after, rss_after) = memory()?;
    let growth = hwm_after.saturating_sub(rss_before);
    let sent: u64 = scenarios
        .iter()
        .flat_map(|s| w.registry.requests_of(*s))
        .map(|r| r.body_sent)
        .sum();
    println!(
        "{} AppServices refused: VmRSS {} -> {} MiB, VmHWM {} -> {} MiB (peak growth {:.1} MiB, bound {} MiB); the registry sent {:.1} MiB of bodies",
        names.len(),
        rss_before / MIB,
        rss_after / MIB,
        hwm_before / MIB,
        hwm_after / MIB,
        growth as f64 / MIB as f64,
        MAX_GROWTH / MIB,
        sent as f64 / MIB as f64,
    );
    assert!(
        growth < MAX_GROWTH,
        "the peak resident set grew by {growth} bytes"
    );
    w.stop().await
}
