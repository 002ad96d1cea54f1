//! The decision on one image, pure: from the policies that govern it (their keys parsed,
//! or why not), what the registry gave (a digest and its signature layers, or an error),
//! and what the status recorded last, decide whether the image runs pinned to a digest,
//! is held (the previous digest keeps running), or waits on the registry.
//!
//! * Policies add up: each `Enforce` policy must verify; the keys within one policy are
//!   alternatives (any one suffices). An `Audit` policy that fails is reported, never
//!   holds, and the digest is still pinned.
//! * A registry that is down (`Unavailable`) is transient: when the status recorded this
//!   very reference verified under the same policy generations, its digest stands in and
//!   keeps running; otherwise the pass waits, with backoff, and nothing new runs.
//! * Missing images, refused credentials and answers the protocol does not allow or
//!   larger than their bound hold like a bad signature: no retry helps until someone
//!   acts (they are looked at again every [`super::HOLD_RECHECK`]).
//! * What keeps running while an image is held or waits ([`Verdict::runs`]): the
//!   reference status recorded last (`status.image`, the digest a pass let run), or, when
//!   none is recorded (the image ran before any policy governed it, or status was
//!   edited), what the live Deployment runs, then recorded. The children are converged
//!   to it like to any desired state: drift and foreign edits are repaired while held.
//!   Nothing, when nothing ran: then nothing is created.
//! * A digest that verified before and whose signature is gone from the registry (a
//!   revocation) holds the same way, with its own reason: what runs keeps running,
//!   nothing new rolls out. A signature replaced by one that does not verify holds as
//!   `SignatureInvalid` (a key rotated under the same name looks the same).

use std::sync::Arc;

use common::conditions::{FALSE, IMAGE_VERIFIED, TRUE, UNKNOWN, reasons};
use common::image_policy::{ImagePolicy, PolicyMode, RunningFailure};
use common::{ImageStatus, ImageVerification};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::cosign::{self, Key, Refusal, SignatureLayer};
use super::registry::RegistryError;
use crate::metrics::Verification;
use controller_core::external::ConditionReport;

/// A governing policy and its keys, parsed (or why they cannot be).
pub struct PolicyKeys {
    pub policy: Arc<ImagePolicy>,
    pub keys: Result<Vec<Key>, String>,
}

impl PolicyKeys {
    fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }

    fn generation(&self) -> i64 {
        self.policy.metadata.generation.unwrap_or_default()
    }

    fn enforces(&self) -> bool {
        self.policy.spec.mode == PolicyMode::Enforce
    }

    fn mode(&self) -> &'static str {
        if self.enforces() { "Enforce" } else { "Audit" }
    }
}

/// What the registry gave for an image.
pub enum Fetched {
    Signed {
        digest: String,
        layers: Arc<Vec<SignatureLayer>>,
    },
    Failed {
        digest: Option<String>,
        error: RegistryError,
    },
}

impl Fetched {
    pub fn failed(digest: Option<String>, error: RegistryError) -> Self {
        Fetched::Failed { digest, error }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    /// Runs, pinned to `digest` when there is one.
    Run,
    /// May not run: the pass stops before the children.
    Hold,
    /// Waiting for the registry, with backoff; the message says why.
    Transient(String),
}

/// The decision on one image.
#[derive(Clone, Debug)]
pub struct Verdict {
    image: String,
    pub(crate) result: Verification,
    kind: Kind,
    /// The digest the children run, when the image runs pinned.
    digest: Option<String>,
    verified_by: Vec<ImageVerification>,
    /// `ImageVerified`'s status and reason for this image.
    status: &'static str,
    reason: &'static str,
    message: String,
    /// The status to keep as it is (held, or the recorded digest standing in).
    keep: Option<ImageStatus>,
    /// What the children run while this image is held or waits: `keep`'s reference, or
    /// the live Deployment's when nothing was recorded; none when nothing ran.
    held: Option<String>,
    /// What runs fails a policy that scales such workloads to zero.
    stop: bool,
}

impl Verdict {
    pub fn holds(&self) -> bool {
        self.kind == Kind::Hold
    }

    /// Whether the image may not run now: held, or waiting for the registry.
    pub fn blocks(&self) -> bool {
        self.kind != Kind::Run
    }

    /// Whether what runs must stop (`onRunningFailure: ScaleToZero`).
    pub fn stops(&self) -> bool {
        self.stop
    }

    pub fn transient(&self) -> Option<String> {
        match &self.kind {
            Kind::Transient(m) => Some(m.clone()),
            _ => None,
        }
    }

    /// The reference the children run: `image@digest` (the tag kept for people; the
    /// kubelet pulls by the digest), or none to run the spec's as written.
    pub fn pin(&self) -> Option<String> {
        if self.kind != Kind::Run {
            return None;
        }
        let digest = self.digest.as_ref()?;
        if self.image.contains('@') {
            return Some(self.image.clone());
        }
        Some(format!("{}@{digest}", self.image))
    }

    /// The reference the children run after this verdict: the pin, or the image as
    /// written, when it runs; what ran before when it is held or waits; none when nothing
    /// may run.
    pub fn runs(&self) -> Option<String> {
        match self.kind {
            Kind::Run => Some(self.pin().unwrap_or_else(|| self.image.clone())),
            Kind::Hold | Kind::Transient(_) => self.held.clone(),
        }
    }

    /// `status.image` (or `canaryImage`) after this verdict. `verifiedAt` moves only
    /// when what was verified changed, so a steady state writes no status.
    pub fn status(&self, now: &Time) -> Option<ImageStatus> {
        if self.kind != Kind::Run {
            return self.keep.clone();
        }
        if let Some(keep) = &self.keep {
            return Some(keep.clone());
        }
        let digest = self.digest.clone()?;
        Some(ImageStatus {
            reference: self.image.clone(),
            digest,
            verified_at: Some(now.clone()),
            verified_by: self.verified_by.clone(),
        })
    }
}

/// The reference `status` records as running: `reference@digest` (or the reference alone
/// when it names its digest, or when no digest was ever resolved for it).
pub fn pinned(status: &ImageStatus) -> String {
    if runs_as_recorded(status) {
        status.reference.clone()
    } else {
        format!("{}@{}", status.reference, status.digest)
    }
}

/// What runs of `image`'s slot when no status records it: the live Deployment's image,
/// recorded with its digest (its own, or the one the tag resolved to now when it is
/// `image` as written). A live image of another tag is recorded without a digest.
fn live_record(image: &str, live: Option<&str>, digest: Option<&str>) -> Option<ImageStatus> {
    let live = live?;
    let (reference, digest) = match live.split_once('@') {
        Some((_, digest)) if image.contains('@') && live == image => {
            (live.to_owned(), digest.to_owned())
        }
        Some((reference, digest)) => (reference.to_owned(), digest.to_owned()),
        None if live == image => (live.to_owned(), digest.unwrap_or_default().to_owned()),
        None => (live.to_owned(), String::new()),
    };
    Some(ImageStatus {
        reference,
        digest,
        verified_at: None,
        verified_by: Vec::new(),
    })
}

/// Whether `status`'s reference is what runs as it is: it names its digest, or none was
/// ever resolved for it.
fn runs_as_recorded(status: &ImageStatus) -> bool {
    status.reference.contains('@') || status.digest.is_empty()
}

/// `registry/app:v1 (sha256:0123…)`, or the reference alone when it names its digest.
fn describe(status: &ImageStatus) -> String {
    if runs_as_recorded(status) {
        status.reference.clone()
    } else {
        format!("{} ({})", status.reference, short_digest(&status.digest))
    }
}

/// What the message says of a held image: what keeps running, if anything does.
fn what_runs(keep: Option<&ImageStatus>) -> String {
    match keep {
        Some(keep) => format!("{} keeps running", describe(keep)),
        None => "nothing runs until it verifies".to_owned(),
    }
}

/// Decides the fate of `image` under `policies` (at least one), from what was fetched,
/// the status recorded last (`prior`) and what the live Deployment of its slot runs
/// (`live`).
pub fn decide(
    image: &str,
    policies: &[PolicyKeys],
    fetched: Fetched,
    prior: Option<&ImageStatus>,
    live: Option<&str>,
) -> Verdict {
    let enforced = policies.iter().any(PolicyKeys::enforces);
    let prior_same = prior.filter(|p| p.reference == image);
    let fetched_digest = match &fetched {
        Fetched::Signed { digest, .. } => Some(digest.clone()),
        Fetched::Failed { digest, .. } => digest.clone(),
    };
    // What keeps running if this image may not: recorded, else read from the live object.
    let kept = prior
        .cloned()
        .or_else(|| live_record(image, live, fetched_digest.as_deref()));
    let held = kept.as_ref().map(pinned);
    match fetched {
        Fetched::Signed { digest, layers } => {
            let mut verified_by = Vec::with_capacity(policies.len());
            let mut failures: Vec<(&PolicyKeys, Verification, &'static str, String)> = Vec::new();
            for p in policies {
                let key = match &p.keys {
                    Err(e) => {
                        failures.push((
                            p,
                            Verification::PolicyNotUsable,
                            reasons::IMAGE_POLICY_NOT_USABLE,
                            e.clone(),
                        ));
                        None
                    }
                    Ok(keys) => match cosign::verify(&digest, &layers, keys) {
                        Ok(name) => Some(name.to_owned()),
                        Err(refusal) => {
                            let (result, reason) = match refusal {
                                Refusal::Unsigned => {
                                    (Verification::Unsigned, reasons::IMAGE_UNSIGNED)
                                }
                                _ => (Verification::Invalid, reasons::SIGNATURE_INVALID),
                            };
                            failures.push((p, result, reason, refusal.to_string()));
                            None
                        }
                    },
                };
                verified_by.push(ImageVerification {
                    policy: p.name().to_owned(),
                    generation: p.generation(),
                    mode: p.mode().to_owned(),
                    key,
                });
            }
            let short = short_digest(&digest);
            let blocking = failures.iter().find(|(p, ..)| p.enforces());
            if let Some((p, result, reason, why)) = blocking {
                // What runs is this very digest, and a failing policy stops such workloads.
                let stopper = kept
                    .as_ref()
                    .filter(|k| k.digest == digest)
                    .and_then(|_| {
                        failures.iter().find(|(f, ..)| {
                            f.enforces()
                                && f.policy.spec.on_running_failure == RunningFailure::ScaleToZero
                        })
                    })
                    .map(|(f, ..)| f.name().to_owned());
                let then = match (&stopper, kept.as_ref()) {
                    (Some(by), Some(kept)) => format!(
                        "{} is scaled to zero until it verifies (ImagePolicy {by}: onRunningFailure ScaleToZero)",
                        describe(kept)
                    ),
                    (_, kept) => what_runs(kept),
                };
                // The very digest verified under this policy before: its signature was
                // deleted since.
                let revoked_key = prior_same
                    .filter(|prior| prior.digest == digest)
                    .and_then(|prior| {
                        prior
                            .verified_by
                            .iter()
                            .find(|v| v.policy == p.name())
                            .and_then(|v| v.key.clone())
                    })
                    // Only a signature that is gone is surely a revocation: one that no
                    // longer verifies may as well be a key rotated under the same name.
                    .filter(|_| *result == Verification::Unsigned);
                let (result, reason, message) = match revoked_key {
                    Some(key) => (
                        Verification::Revoked,
                        reasons::SIGNATURE_REVOKED,
                        format!(
                            "{image} ({short}) verified with key {key} of ImagePolicy {} before and no longer does: {why}; {}, and nothing new rolls out with it",
                            p.name(),
                            then
                        ),
                    ),
                    None => (
                        *result,
                        *reason,
                        format!(
                            "{image} ({short}) fails ImagePolicy {}: {why}; {}",
                            p.name(),
                            then
                        ),
                    ),
                };
                return Verdict {
                    image: image.to_owned(),
                    result,
                    kind: Kind::Hold,
                    digest: Some(digest.clone()),
                    verified_by,
                    status: FALSE,
                    reason,
                    message,
                    keep: kept,
                    held,
                    stop: stopper.is_some(),
                };
            }
            // Runs pinned; an Audit failure is reported.
            let keep = prior_same
                .filter(|p| p.digest == digest && p.verified_by == verified_by)
                .cloned();
            if let Some((p, result, reason, why)) = failures.first() {
                return Verdict {
                    image: image.to_owned(),
                    result: *result,
                    kind: Kind::Run,
                    digest: Some(digest.clone()),
                    verified_by,
                    status: FALSE,
                    reason,
                    message: format!(
                        "{image} ({short}) fails ImagePolicy {} (Audit: it runs): {why}{}",
                        p.name(),
                        tag_ignored(image)
                    ),
                    keep,
                    held: None,
                    stop: false,
                };
            }
            let by: Vec<String> = verified_by
                .iter()
                .map(|v| format!("{}/{}", v.policy, v.key.as_deref().unwrap_or_default()))
                .collect();
            Verdict {
                image: image.to_owned(),
                result: Verification::Verified,
                kind: Kind::Run,
                digest: Some(digest.clone()),
                verified_by,
                status: TRUE,
                reason: reasons::VERIFIED,
                message: format!(
                    "{image} runs as {short}, verified by {}{}",
                    by.join(", "),
                    tag_ignored(image)
                ),
                keep,
                held: None,
                stop: false,
            }
        }
        Fetched::Failed { digest, error } => {
            let (result, reason) = match &error {
                RegistryError::NotFound(_) => (Verification::NotFound, reasons::IMAGE_NOT_FOUND),
                RegistryError::Denied(_) => (Verification::Denied, reasons::REGISTRY_DENIED),
                RegistryError::Unavailable(_) => {
                    (Verification::Unavailable, reasons::REGISTRY_UNAVAILABLE)
                }
                RegistryError::Invalid(_) => (
                    Verification::InvalidAnswer,
                    reasons::REGISTRY_RESPONSE_INVALID,
                ),
                RegistryError::TooLarge(_) => {
                    (Verification::TooLarge, reasons::REGISTRY_RESPONSE_TOO_LARGE)
                }
            };
            let transient = error.is_transient();
            let base = Verdict {
                image: image.to_owned(),
                result,
                kind: Kind::Run,
                digest: None,
                verified_by: Vec::new(),
                status: if transient { UNKNOWN } else { FALSE },
                reason,
                message: String::new(),
                keep: kept.clone(),
                held: held.clone(),
                stop: false,
            };
            // The digest verified last for this very reference, under the same policy
            // generations, stands in for a registry that is down.
            let standing = prior_same.filter(|p| {
                transient
                    && !p.digest.is_empty()
                    && digest.as_ref().is_none_or(|d| *d == p.digest)
                    && policies.iter().all(|pk| {
                        p.verified_by.iter().any(|v| {
                            v.policy == pk.name()
                                && v.generation == pk.generation()
                                && (v.key.is_some() || !pk.enforces())
                        })
                    })
            });
            if let Some(standing) = standing {
                return Verdict {
                    digest: Some(standing.digest.clone()),
                    message: format!(
                        "{error}; {} verified before keeps running",
                        short_digest(&standing.digest)
                    ),
                    keep: Some(standing.clone()),
                    held: None,
                    ..base
                };
            }
            if !enforced {
                return Verdict {
                    message: format!("{error} (Audit only: {image} runs as written)"),
                    keep: None,
                    held: None,
                    ..base
                };
            }
            let message = format!("{image}: {error}; {}", what_runs(kept.as_ref()));
            Verdict {
                kind: if transient {
                    Kind::Transient(message.clone())
                } else {
                    Kind::Hold
                },
                message,
                ..base
            }
        }
    }
}

/// For a reference that names a tag and a digest, what runs: the digest, never the tag
/// (the webhook warns at admission; status says it each pass).
fn tag_ignored(image: &str) -> String {
    match common::image::tag_and_digest(image) {
        Some(_) => {
            let tag = common::image::parse(image)
                .ok()
                .and_then(|r| r.tag)
                .unwrap_or_default();
            format!(
                " (the reference names tag {tag:?} and a digest: the digest runs, the tag is ignored)"
            )
        }
        None => String::new(),
    }
}

/// `sha256:0123456789ab…` for messages.
fn short_digest(digest: &str) -> String {
    match digest.get(..19) {
        Some(head) if digest.len() > 19 => format!("{head}…"),
        _ => digest.to_owned(),
    }
}

/// `ImageVerified` for the AppService's verdicts (the stable image first): the worst
/// one's status and reason, every image's message.
pub fn condition(verdicts: &[&Verdict]) -> ConditionReport {
    let rank = |v: &Verdict| match (&v.kind, v.status) {
        (Kind::Hold, _) => 0,
        (Kind::Transient(_), _) => 1,
        (_, FALSE) => 2,
        (_, UNKNOWN) => 3,
        _ => 4,
    };
    let worst = verdicts
        .iter()
        .min_by_key(|v| rank(v))
        .copied()
        .filter(|_| !verdicts.is_empty());
    let message = verdicts
        .iter()
        .map(|v| v.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    match worst {
        Some(w) => ConditionReport {
            type_: IMAGE_VERIFIED,
            status: w.status,
            reason: w.reason,
            message,
        },
        None => ConditionReport {
            type_: IMAGE_VERIFIED,
            status: TRUE,
            reason: reasons::VERIFIED,
            message,
        },
    }
}

#[cfg(test)]
mod tests;
