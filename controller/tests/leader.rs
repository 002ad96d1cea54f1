//! Leader election with real controller processes sharing one Lease: only the leader
//! reconciles; SIGKILL of the leader → a standby takes over once the lease expires;
//! SIGTERM → the leader releases the lease and a standby takes over at once.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use common::AppService;
use harness::eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use support::binary::Binary;
use support::{app, create, init};

const LEASE_SECS: u64 = 12;

/// A controller process at its shipped defaults but for a short lease, scoped to `ns`.
fn spawn(kubeconfig: &Path, ns: &str, identity: &str, dir: &Path) -> anyhow::Result<Binary> {
    let lease = format!("{LEASE_SECS}s");
    let flags = [
        "--watch-namespace",
        ns,
        "--lease-namespace",
        ns,
        "--lease-duration",
        &lease,
        "--renew-deadline",
        "8s",
        "--retry-period",
        "1s",
    ];
    support::binary::spawn(kubeconfig, identity, dir, &flags)
}

/// The value of an (unlabelled or fully labelled) metric line of `bin`, 0 when absent.
async fn metric(bin: &Binary, line_prefix: &str) -> anyhow::Result<f64> {
    let body = harness::process::http_get(bin.ops_port, "/metrics").await?;
    Ok(body
        .lines()
        .find_map(|l| {
            l.strip_prefix(line_prefix)
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0.0))
}

async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    Ok(leases
        .get_opt(common::names::LEASE_NAME)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

async fn wait_holder(leases: &Api<Lease>, who: &str, timeout: Duration) -> anyhow::Result<()> {
    eventually(&format!("{who} to hold the lease"), timeout, || async {
        Ok((holder(leases).await?.as_deref() == Some(who)).then_some(()))
    })
    .await?;
    Ok(())
}

async fn wait_deployment(
    deployments: &Api<Deployment>,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    eventually(&format!("Deployment {name}"), timeout, || async {
        Ok(deployments.get_opt(name).await?.map(|_| ()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn only_the_leader_reconciles_and_failover_works() -> anyhow::Result<()> {
    init();
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let client = cp.client();
    let dir = tempfile::tempdir()?;
    let kubeconfig = cp.kubeconfig_path();
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let apps: Api<AppService> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);

    let a = spawn(kubeconfig, &ns, "ctl-a", dir.path())?;
    wait_holder(&leases, "ctl-a", Duration::from_secs(30))
        .await
        .with_context(|| a.log_tail(60))?;
    let mut b = spawn(kubeconfig, &ns, "ctl-b", dir.path())?;
    eventually("ctl-b ready", Duration::from_secs(30), || async {
        Ok(harness::process::http_get(b.ops_port, "/readyz")
            .await
            .ok()
            .filter(|r| r.contains(" 200 "))
            .map(|_| ()))
    })
    .await
    .with_context(|| format!("{}\n{}", b.log_tail(60), a.log_tail(60)))?;

    // Only the leader reconciles.
    create(&apps, &app("one", "nginx:1.27", 1)).await?;
    wait_deployment(&deployments, "one", Duration::from_secs(30)).await?;
    // More events the standby would see if it (wrongly) watched: a second AppService,
    // which the leader reconciles.
    create(&apps, &app("also-one", "nginx:1.27", 1)).await?;
    wait_deployment(&deployments, "also-one", Duration::from_secs(30)).await?;
    assert!(
        metric(
            &a,
            "appservice_controller_reconciles_total{result=\"success\"}"
        )
        .await?
            >= 1.0
    );
    assert_eq!(
        metric(
            &b,
            "appservice_controller_reconciles_total{result=\"success\"}"
        )
        .await?,
        0.0
    );
    assert_eq!(metric(&a, "appservice_controller_leader ").await?, 1.0);
    assert_eq!(metric(&b, "appservice_controller_leader ").await?, 0.0);

    // SIGKILL: no release; the standby waits out the lease, then takes over.
    a.signal("KILL")?;
    drop(a);
    create(&apps, &app("two", "nginx:1.27", 1)).await?;
    let takeover = Duration::from_secs(LEASE_SECS + 8);
    wait_holder(&leases, "ctl-b", takeover)
        .await
        .with_context(|| b.log_tail(60))?;
    wait_deployment(&deployments, "two", Duration::from_secs(10)).await?;
    assert_eq!(metric(&b, "appservice_controller_leader ").await?, 1.0);

    // SIGTERM: the leader releases the lease; the standby takes over well within the
    // lease duration.
    let c = spawn(kubeconfig, &ns, "ctl-c", dir.path())?;
    eventually("ctl-c ready", Duration::from_secs(30), || async {
        Ok(harness::process::http_get(c.ops_port, "/readyz")
            .await
            .ok()
            .filter(|r| r.contains(" 200 "))
            .map(|_| ()))
    })
    .await
    .with_context(|| c.log_tail(60))?;
    assert_eq!(holder(&leases).await?.as_deref(), Some("ctl-b"));
    b.signal("TERM")?;
    let status = tokio::time::timeout(Duration::from_secs(30), b.child.wait())
        .await
        .context("ctl-b did not exit after SIGTERM")??;
    assert!(
        status.success(),
        "ctl-b exit status {status}: {}",
        b.log_tail(60)
    );
    // Released, not expired: the handover must not wait for the lease duration.
    wait_holder(&leases, "ctl-c", Duration::from_secs(LEASE_SECS / 2))
        .await
        .with_context(|| c.log_tail(60))?;
    create(&apps, &app("three", "nginx:1.27", 1)).await?;
    wait_deployment(&deployments, "three", Duration::from_secs(15)).await?;
    let lease = leases.get(common::names::LEASE_NAME).await?;
    assert!(lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0) >= 2);
    Ok(())
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_leading() -> anyhow::Result<()> {
    use controller::leader::{ElectionConfig, Elector};
    use kube::api::{Patch, PatchParams};
    init();
    let cp = harness::shared().await?;
    let ns = cp.namespace().await?;
    let leases: Api<Lease> = Api::namespaced(cp.client(), &ns);
    let (leading_tx, mut leading) = tokio::sync::watch::channel(false);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let elector = Elector::new(
        leases.clone(),
        ElectionConfig {
            lease_name: common::names::LEASE_NAME.into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(LEASE_SECS),
            renew_deadline: Duration::from_secs(8),
            retry_period: Duration::from_secs(1),
        },
    );
    let task = tokio::spawn(elector.run(leading_tx, stop_rx));
    tokio::time::timeout(Duration::from_secs(20), leading.wait_for(|l| *l)).await??;

    // Someone else writes itself into the Lease (e.g. after a long pause of ours).
    let now = k8s_openapi::jiff::Timestamp::now();
    leases
        .patch(
            common::names::LEASE_NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "holderIdentity": "intruder",
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(now),
            }})),
        )
        .await?;
    // Noticed on the next renewal: leadership is given up, not fought over.
    tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| !*l)).await??;
    assert_eq!(holder(&leases).await?.as_deref(), Some("intruder"));

    // Shutting down a non-leader leaves the Lease alone.
    stop_tx.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), task).await??;
    assert_eq!(holder(&leases).await?.as_deref(), Some("intruder"));
    Ok(())
}
