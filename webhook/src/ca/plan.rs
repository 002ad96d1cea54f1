//! The runtime CA's rules as a pure function: given what the CA Secret holds, what the
//! caBundles of the API server's configurations hold and the time, what the Secret must
//! hold next. No I/O; the clock and the minting of keys are passed in.
//!
//! The CA that signs serving certificates (*active*) is replaced without a moment in
//! which the API server and a serving certificate disagree:
//! 1. at two thirds of its lifetime (or when an admin asks, see [`Input::rotate_before`])
//!    a *next* CA is minted and added to every caBundle, next to the active one;
//! 2. once every caBundle has carried it for [`PROPAGATION`] (the API server reads
//!    webhook configurations through an informer), it becomes the active CA and the
//!    replicas re-issue their serving certificates from it;
//! 3. the previous CA stays in the bundle, *retired*, for [`RETENTION`], so a replica
//!    that has not switched yet is still trusted; then it is dropped.
//!
//! The first CA adopts, as retired, every CA the caBundles already trust (the previous
//! chart minted its CA with Helm), so an upgrade keeps old serving certificates trusted
//! until they are gone.

use std::time::Duration;

/// How long a next CA must be in every caBundle before it signs: far above the API
/// server's informer delay (milliseconds), and above the time between a Helm render and
/// its apply, which may write back a bundle read a moment earlier.
pub const PROPAGATION: Duration = Duration::from_secs(60);
/// How long a retired CA stays in the bundles: every replica notices a promotion through
/// its watch within seconds and at the latest at its periodic pass (5 min).
pub const RETENTION: Duration = Duration::from_secs(3600);
/// Certificates are valid from this long before they are made, so an API server whose
/// clock is behind ours accepts them at once.
pub const CLOCK_SKEW: Duration = Duration::from_secs(3600);
/// Lifetime of a serving certificate (never past its CA's); re-issued at two thirds.
pub const LEAF_VALIDITY: Duration = Duration::from_secs(90 * 24 * 3600);

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// A CA certificate: its PEM, its DER (what bundles are compared by) and its validity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaCert {
    pub pem: String,
    pub der: Vec<u8>,
    pub not_before: i64,
    pub not_after: i64,
}

impl CaCert {
    /// When a certificate valid from `not_before` to `not_after` is due for renewal.
    pub fn renewal_due(not_before: i64, not_after: i64) -> i64 {
        not_before + (not_after - not_before) / 3 * 2
    }
}

/// A CA that can sign: certificate and private key.
#[derive(Clone, PartialEq, Eq)]
pub struct CaKeyPair {
    pub cert: CaCert,
    pub key_pem: String,
}

impl std::fmt::Debug for CaKeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaKeyPair")
            .field("cert", &self.cert)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// The next CA and when it was added to the bundle (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    pub pair: CaKeyPair,
    pub since: i64,
}

/// What the CA Secret holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CaState {
    /// The CA that signs serving certificates.
    pub active: Option<CaKeyPair>,
    /// The CA that will, once every bundle has carried it long enough.
    pub next: Option<Next>,
    /// Previous CAs still trusted, newest first.
    pub retired: Vec<CaCert>,
    /// When the newest of them was retired (Unix seconds).
    pub retired_since: Option<i64>,
}

impl CaState {
    /// Every CA the caBundles must trust: active, next, retired, each once.
    pub fn bundle(&self) -> Vec<&CaCert> {
        let mut out: Vec<&CaCert> = Vec::new();
        let all = self
            .active
            .iter()
            .map(|a| &a.cert)
            .chain(self.next.iter().map(|n| &n.pair.cert))
            .chain(self.retired.iter());
        for cert in all {
            if !out.iter().any(|c| c.der == cert.der) {
                out.push(cert);
            }
        }
        out
    }

    /// [`CaState::bundle`] as one PEM text: the exact bytes every caBundle gets.
    pub fn bundle_pem(&self) -> String {
        self.bundle()
            .iter()
            .map(|c| c.pem.trim_end().to_owned() + "\n")
            .collect()
    }
}

/// What a pass changed, for the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// A first CA (or one replacing an expired CA with no successor).
    Created,
    /// A next CA, added to the bundles.
    NextCreated,
    /// The next CA signs now; the previous one is retired.
    Promoted,
    /// An expired or long-retired CA left the bundles.
    Dropped(usize),
    /// CAs the bundles trusted before this CA Secret existed, kept as retired.
    Adopted(usize),
}

/// The inputs of [`plan`].
#[derive(Debug)]
pub struct Input<'a> {
    /// What the Secret (or, when it was lost, this replica's memory) holds.
    pub state: &'a CaState,
    /// The CA certificates of each caBundle found in the API server's configurations,
    /// one list per webhook entry (each must carry the next CA before it signs).
    pub bundles: &'a [Vec<CaCert>],
    /// Now, Unix seconds.
    pub now: i64,
    /// Lifetime of a new CA.
    pub ca_validity: Duration,
    /// An admin's request: rotate if the active CA was made before this time.
    pub rotate_before: Option<i64>,
}

/// What the Secret must hold, what changed, and when to look again at the latest.
#[derive(Debug)]
pub struct Plan {
    pub state: CaState,
    pub steps: Vec<Step>,
    /// The next moment a rule falls due (Unix seconds), if any.
    pub wake_at: Option<i64>,
}

/// Applies the rules of the module docs. `mint(not_before, not_after)` makes a new CA.
pub fn plan<E>(
    input: &Input<'_>,
    mut mint: impl FnMut(i64, i64) -> Result<CaKeyPair, E>,
) -> Result<Plan, E> {
    let now = input.now;
    let mut state = input.state.clone();
    let mut steps = Vec::new();
    let new_validity = (now - secs(CLOCK_SKEW), now + secs(input.ca_validity));

    // Expired certificates help nobody; long-retired ones have been replaced everywhere.
    let before = state.retired.len();
    let retention_over = state
        .retired_since
        .is_some_and(|since| now >= since + secs(RETENTION));
    state
        .retired
        .retain(|c| c.not_after > now && !retention_over);
    if state
        .next
        .as_ref()
        .is_some_and(|n| n.pair.cert.not_after <= now)
    {
        state.next = None;
    }
    let dropped = before - state.retired.len();
    if dropped > 0 {
        steps.push(Step::Dropped(dropped));
    }
    if state.retired.is_empty() {
        state.retired_since = None;
    }

    // Nothing to sign with: the next CA if there is one, else a new CA at once (there is
    // no valid CA to overlap with), keeping what the bundles already trust.
    if state
        .active
        .as_ref()
        .is_none_or(|a| a.cert.not_after <= now)
    {
        let first = state.active.is_none();
        if let Some(next) = state.next.take() {
            state.active = Some(next.pair);
            steps.push(Step::Promoted);
        } else {
            state.active = Some(mint(new_validity.0, new_validity.1)?);
            steps.push(Step::Created);
        }
        if first {
            let mut adopted = 0;
            for cert in input.bundles.iter().flatten() {
                if cert.not_after > now && !state.bundle().iter().any(|c| c.der == cert.der) {
                    state.retired.push(cert.clone());
                    adopted += 1;
                }
            }
            if adopted > 0 {
                state.retired_since = Some(now);
                steps.push(Step::Adopted(adopted));
            }
        }
    }
    let Some(active) = state.active.clone() else {
        // Unreachable: set just above. Plan nothing rather than panic.
        return Ok(Plan {
            state,
            steps,
            wake_at: None,
        });
    };

    let renewal = CaCert::renewal_due(active.cert.not_before, active.cert.not_after);
    let requested = input
        .rotate_before
        .is_some_and(|t| t > active.cert.not_before + secs(CLOCK_SKEW));
    if state.next.is_none() && (now >= renewal || requested) {
        state.next = Some(Next {
            pair: mint(new_validity.0, new_validity.1)?,
            since: now,
        });
        steps.push(Step::NextCreated);
    }

    if let Some(next) = state.next.clone() {
        let carried = input
            .bundles
            .iter()
            .all(|bundle| bundle.iter().any(|c| c.der == next.pair.cert.der));
        if carried && now >= next.since + secs(PROPAGATION) {
            state.retired.insert(0, active.cert.clone());
            state.retired_since = Some(now);
            state.active = Some(next.pair);
            state.next = None;
            steps.push(Step::Promoted);
        }
    }

    let mut wake: Vec<i64> = Vec::new();
    if let Some(active) = &state.active {
        wake.push(active.cert.not_after);
        if state.next.is_none() {
            wake.push(CaCert::renewal_due(
                active.cert.not_before,
                active.cert.not_after,
            ));
        }
    }
    if let Some(next) = &state.next {
        wake.push(next.since + secs(PROPAGATION));
    }
    if let Some(since) = state.retired_since {
        wake.push(since + secs(RETENTION));
    }
    wake.extend(state.retired.iter().map(|c| c.not_after));
    let wake_at = wake.into_iter().filter(|&t| t > now).min();
    Ok(Plan {
        state,
        steps,
        wake_at,
    })
}

/// Whether every bundle trusts `cert`.
pub fn trusted_everywhere(bundles: &[Vec<CaCert>], cert: &CaCert) -> bool {
    bundles
        .iter()
        .all(|bundle| bundle.iter().any(|c| c.der == cert.der))
}

/// The validity of a serving certificate issued now by `ca`.
pub fn leaf_validity(ca: &CaCert, now: i64) -> (i64, i64) {
    let not_before = (now - secs(CLOCK_SKEW)).max(ca.not_before);
    let not_after = (now + secs(LEAF_VALIDITY)).min(ca.not_after);
    (not_before, not_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 24 * 3600;
    const VALIDITY: Duration = Duration::from_secs(3650 * 24 * 3600);

    /// A fake CA: its DER is a counter, so tests compare identities, not cryptography.
    fn minter() -> impl FnMut(i64, i64) -> Result<CaKeyPair, ()> {
        let mut n = 0u8;
        move |not_before, not_after| {
            n += 1;
            Ok(CaKeyPair {
                cert: cert(n, not_before, not_after),
                key_pem: format!("key {n}"),
            })
        }
    }

    fn cert(n: u8, not_before: i64, not_after: i64) -> CaCert {
        CaCert {
            pem: format!("cert {n}"),
            der: vec![n],
            not_before,
            not_after,
        }
    }

    fn run(
        state: &CaState,
        bundles: &[Vec<CaCert>],
        now: i64,
        mint: &mut impl FnMut(i64, i64) -> Result<CaKeyPair, ()>,
    ) -> Plan {
        plan(
            &Input {
                state,
                bundles,
                now,
                ca_validity: VALIDITY,
                rotate_before: None,
            },
            mint,
        )
        .unwrap()
    }

    /// What the manager's next pass sees after writing `state`'s bundle everywhere.
    fn injected(state: &CaState, entries: usize) -> Vec<Vec<CaCert>> {
        let bundle: Vec<CaCert> = state.bundle().into_iter().cloned().collect();
        vec![bundle; entries]
    }

    #[test]
    fn a_first_ca_adopts_what_the_bundles_trusted() {
        let mut mint = minter();
        let helm_ca = cert(200, 0, 10 * DAY);
        let expired = cert(201, 0, DAY);
        let now = 2 * DAY;
        let plan = run(
            &CaState::default(),
            &[vec![helm_ca.clone(), expired], vec![helm_ca.clone()]],
            now,
            &mut mint,
        );
        assert_eq!(plan.steps, [Step::Created, Step::Adopted(1)]);
        let active = plan.state.active.clone().unwrap();
        assert_eq!(active.cert.not_before, now - secs(CLOCK_SKEW));
        assert_eq!(active.cert.not_after, now + secs(VALIDITY));
        assert_eq!(plan.state.retired, std::slice::from_ref(&helm_ca));
        // The bundle: the new CA first, then the adopted one until the retention ends.
        let ders: Vec<_> = plan.state.bundle().iter().map(|c| c.der.clone()).collect();
        assert_eq!(ders, [vec![1], vec![200]]);
        assert_eq!(plan.wake_at, Some(now + secs(RETENTION)));
        let later = run(
            &plan.state,
            &injected(&plan.state, 2),
            now + secs(RETENTION),
            &mut mint,
        );
        assert_eq!(later.steps, [Step::Dropped(1)]);
        assert!(later.state.retired.is_empty() && later.state.retired_since.is_none());
    }

    #[test]
    fn a_steady_state_changes_nothing() {
        let mut mint = minter();
        let first = run(&CaState::default(), &[], 0, &mut mint).state;
        for now in [1, DAY, 365 * DAY] {
            let again = run(&first, &injected(&first, 3), now, &mut mint);
            assert!(again.steps.is_empty(), "{now}: {:?}", again.steps);
            assert_eq!(again.state, first);
        }
    }

    /// The whole rotation: next minted at two thirds, promoted only once every bundle
    /// carried it for the propagation delay, the old one retired and then dropped; at
    /// every moment the signing CA is in the bundle the manager writes.
    #[test]
    fn rotation_overlaps_and_waits_for_every_bundle() {
        let mut mint = minter();
        let start = run(&CaState::default(), &[], 0, &mut mint).state;
        let old = start.active.clone().unwrap();
        let due = CaCert::renewal_due(old.cert.not_before, old.cert.not_after);

        let before_due = run(&start, &injected(&start, 2), due - 1, &mut mint);
        assert!(before_due.steps.is_empty());
        assert_eq!(before_due.wake_at, Some(due));

        let rotating = run(&start, &injected(&start, 2), due, &mut mint);
        assert_eq!(rotating.steps, [Step::NextCreated]);
        let next = rotating.state.next.clone().unwrap();
        assert_eq!(
            rotating.state.active,
            Some(old.clone()),
            "still signing with the old CA"
        );
        assert_eq!(rotating.wake_at, Some(due + secs(PROPAGATION)));

        // One bundle lags behind (a stale writer, or not written yet): no promotion, even
        // long after the delay.
        let mut lagging = injected(&rotating.state, 2);
        lagging[1] = vec![old.cert.clone()];
        let waiting = run(
            &rotating.state,
            &lagging,
            due + 10 * secs(PROPAGATION),
            &mut mint,
        );
        assert!(waiting.steps.is_empty(), "{:?}", waiting.steps);
        assert_eq!(waiting.state.active, Some(old.clone()));

        // Everywhere, but not long enough yet.
        let early = run(
            &rotating.state,
            &injected(&rotating.state, 2),
            due + secs(PROPAGATION) - 1,
            &mut mint,
        );
        assert!(early.steps.is_empty());

        let promoted = run(
            &rotating.state,
            &injected(&rotating.state, 2),
            due + secs(PROPAGATION),
            &mut mint,
        );
        assert_eq!(promoted.steps, [Step::Promoted]);
        assert_eq!(promoted.state.active, Some(next.pair.clone()));
        assert_eq!(promoted.state.retired, std::slice::from_ref(&old.cert));
        let bundle = promoted.state.bundle();
        assert!(
            bundle.iter().any(|c| c.der == old.cert.der),
            "the old CA is still trusted"
        );
        assert!(bundle.iter().any(|c| c.der == next.pair.cert.der));

        let dropped = run(
            &promoted.state,
            &injected(&promoted.state, 2),
            due + secs(PROPAGATION) + secs(RETENTION),
            &mut mint,
        );
        assert_eq!(dropped.steps, [Step::Dropped(1)]);
        assert_eq!(dropped.state.bundle().len(), 1);
    }

    #[test]
    fn an_admin_can_ask_for_a_rotation() {
        let mut mint = minter();
        let start = run(&CaState::default(), &[], 100 * DAY, &mut mint).state;
        let made = start.active.as_ref().unwrap().cert.not_before + secs(CLOCK_SKEW);
        let bundles = injected(&start, 1);
        let mut ask = |rotate_before| {
            plan(
                &Input {
                    state: &start,
                    bundles: &bundles,
                    now: 101 * DAY,
                    ca_validity: VALIDITY,
                    rotate_before: Some(rotate_before),
                },
                &mut mint,
            )
            .unwrap()
        };
        // A request older than the CA is already satisfied.
        assert!(ask(made).steps.is_empty());
        assert_eq!(ask(made + 1).steps, [Step::NextCreated]);
    }

    #[test]
    fn an_expired_ca_is_replaced_at_once() {
        let mut mint = minter();
        let stale = CaState {
            active: Some(CaKeyPair {
                cert: cert(100, 0, DAY),
                key_pem: "k".into(),
            }),
            ..CaState::default()
        };
        let plan = run(&stale, &injected(&stale, 1), 2 * DAY, &mut mint);
        assert_eq!(plan.steps, [Step::Created]);
        assert_eq!(plan.state.bundle().len(), 1, "the expired CA is not kept");
        // With a next CA waiting, that one signs at once instead.
        let with_next = CaState {
            next: Some(Next {
                pair: CaKeyPair {
                    cert: cert(101, 0, 30 * DAY),
                    key_pem: "k".into(),
                },
                since: DAY - 10,
            }),
            ..stale
        };
        let plan = run(&with_next, &[], 2 * DAY, &mut mint);
        assert_eq!(plan.steps, [Step::Promoted]);
        assert_eq!(plan.state.active.unwrap().cert.der, [101]);
    }

    #[test]
    fn serving_certificates_stay_inside_their_ca() {
        let ca = cert(1, 1000, 1000 + 30 * DAY);
        assert_eq!(leaf_validity(&ca, 1000), (1000, 1000 + 30 * DAY));
        let now = 1000 + 2 * DAY;
        assert_eq!(
            leaf_validity(&ca, now),
            (now - secs(CLOCK_SKEW), 1000 + 30 * DAY)
        );
        let long = cert(2, 0, 3650 * DAY);
        assert_eq!(
            leaf_validity(&long, 10 * DAY).1,
            10 * DAY + secs(LEAF_VALIDITY)
        );
    }
}
