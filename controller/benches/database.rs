//! Database benchmark (a command, not a test):
//!
//! ```text
//! cargo bench -p appservice-controller --bench database -- --n 100
//! ```
//!
//! On a private control plane (etcd + kube-apiserver) and the harness's real PostgreSQL,
//! the in-process controller with the database step gets N AppServices with a database at
//! once; measured: the time until all are `DatabaseReady`, then the time until all are
//! deleted, and the databases and roles left on the server (must be 0). The floor, in
//! the same run: a client with the same number of connections issuing the same
//! CREATE ROLE / CREATE DATABASE / REVOKE statements directly, then the DROPs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Parser;
use common::conditions::{DATABASE_READY, TRUE};
use common::{AppService, AppServiceSpec, DatabaseClass, DatabaseSpec};
use controller::database::{DatabaseConfig, Databases, sql};
use controller::metrics::Metrics;
use controller::{Config, Hooks};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

#[derive(Parser, Debug)]
struct Args {
    /// Number of AppServices.
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// Connections per class (the controller's pool, and the floor's connections).
    #[arg(long, default_value_t = 4)]
    pool: usize,
    /// Controller concurrency.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Give up after this many seconds per phase.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !support::is_bench_run(args.bench, "database benchmark", "database") {
        return Ok(());
    }
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let timeout = Duration::from_secs(args.timeout_secs);
    eprintln!("starting a control plane and PostgreSQL …");
    let cp = harness::ControlPlane::start(harness::Options::plain()).await?;
    let pg = harness::Postgres::start().await?;
    let client = cp.client();
    let ns = cp.namespace_with_prefix("bench-db").await?;

    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), &ns);
    for (name, data) in [
        (
            "pg-admin",
            json!({"username": harness::postgres::SUPERUSER, "password": pg.password()}),
        ),
        ("pg-ca", json!({"ca.crt": pg.ca_pem()})),
    ] {
        let labels = if name == "pg-admin" {
            json!({(common::database_class::ADMIN_SECRET_LABEL): "true"})
        } else {
            json!({})
        };
        let s = serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}, "stringData": data}),
        )?;
        secrets.create(&PostParams::default(), &s).await?;
    }
    let class: DatabaseClass = serde_json::from_value(json!({
        "apiVersion": "platform.example.com/v1alpha1", "kind": "DatabaseClass",
        "metadata": {"name": "bench"},
        "spec": {
            "host": "localhost", "port": pg.port(),
            "tls": {"mode": "verify-full", "ca": {"secretRef": {"name": "pg-ca"}}},
            "adminCredentials": {"secretName": "pg-admin"},
        }
    }))?;
    Api::<DatabaseClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;

    // ---- the controller ----------------------------------------------------------
    let mut config = Config::for_namespace(&ns);
    config.concurrency = args.concurrency;
    let metrics = Arc::new(Metrics::default());
    let databases = Databases::new(
        client.clone(),
        &DatabaseConfig {
            admin_namespace: Some(ns.name().to_owned()),
            pool_size: args.pool,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(15),
            orphan_scan_interval: Duration::from_secs(3600),
        },
        ns.name(),
        metrics.clone(),
    );
    let hooks = Hooks {
        metrics: metrics.clone(),
        external: Arc::new(databases),
        ..Hooks::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller::run_with(
        config,
        client.clone(),
        hooks,
        async move {
            let _ = stop_rx.await;
        },
    ));

    let apps: Api<AppService> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();
    for i in 0..args.n {
        let mut app = AppService::new(
            &format!("db-{i}"),
            AppServiceSpec {
                image: "registry.example.com/bench:v1".into(),
                database: Some(DatabaseSpec {
                    class: "bench".into(),
                }),
                ..AppServiceSpec::default()
            },
        );
        app.metadata.namespace = Some(ns.name().to_owned());
        apps.create(&PostParams::default(), &app).await?;
    }
    let created = started.elapsed();
    wait(&apps, timeout, "all DatabaseReady", |list| {
        list.len() == args.n
            && list.iter().all(|a| {
                a.status.as_ref().is_some_and(|s| {
                    common::conditions::find(&s.conditions, DATABASE_READY)
                        .is_some_and(|c| c.status == TRUE)
                })
            })
    })
    .await?;
    let ready = started.elapsed();
    let deleting = Instant::now();
    apps.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait(&apps, timeout, "all deleted", |list| list.is_empty()).await?;
    let deleted = deleting.elapsed();
    let _ = stop_tx.send(());
    let _ = run.await;
    let leaks = leftovers(&pg).await?;

    // ---- the floor ---------------------------------------------------------------
    let floor_create = Instant::now();
    let names: Vec<String> = (0..args.n).map(|i| format!("floor_{i:05}")).collect();
    run_statements(&pg, args.pool, &names, |n| {
        vec![
            // The same work as the controller: a verifier computed here (4096 PBKDF2
            // iterations), the class's default connection limit.
            sql::create_role(
                n,
                &sql::Verifier::of(&sql::new_password()).expect("a verifier"),
                common::database_class::DEFAULT_CONNECTION_LIMIT,
            ),
            sql::create_database(n, n),
            sql::revoke_public_connect(n),
        ]
    })
    .await?;
    let floor_created = floor_create.elapsed();
    let floor_drop = Instant::now();
    run_statements(&pg, args.pool, &names, |n| {
        vec![sql::drop_database(n), sql::drop_role(n)]
    })
    .await?;
    let floor_dropped = floor_drop.elapsed();

    println!(
        "n={} pool={} concurrency={}\n\
         controller: created {n} AppServices in {created:.1?}; all DatabaseReady after {ready:.1?}; all deleted (databases dropped) in {deleted:.1?}\n\
         floor (direct SQL, {pool} connections): create {floor_created:.1?}, drop {floor_dropped:.1?}\n\
         ratio: provisioning {:.1}x, cleanup {:.1}x the floor\n\
         leaked databases+roles after deleting: {leaks}\n\
         attempts: {}",
        args.n,
        args.pool,
        args.concurrency,
        ready.as_secs_f64() / floor_created.as_secs_f64().max(1e-9),
        deleted.as_secs_f64() / floor_dropped.as_secs_f64().max(1e-9),
        metrics
            .families::<controller::database::metrics::DatabaseMetrics>()
            .summary(),
        n = args.n,
        pool = args.pool,
    );
    if leaks != 0 {
        bail!("{leaks} databases or roles leaked");
    }
    Ok(())
}

async fn wait(
    apps: &Api<AppService>,
    timeout: Duration,
    what: &str,
    done: impl Fn(&[AppService]) -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = apps.list(&ListParams::default()).await?.items;
        if done(&list) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Databases and roles of the controller still on the server.
async fn leftovers(pg: &harness::Postgres) -> anyhow::Result<i64> {
    let admin = pg.connect_admin().await?;
    let row = admin
        .query_one(
            "SELECT (SELECT count(*) FROM pg_database WHERE datname LIKE 'appsvc\\_%') + (SELECT count(*) FROM pg_roles WHERE rolname LIKE 'appsvc\\_%')",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Runs each name's statements on `connections` admin connections in parallel.
async fn run_statements(
    pg: &harness::Postgres,
    connections: usize,
    names: &[String],
    statements: impl Fn(&str) -> Vec<String>,
) -> anyhow::Result<()> {
    let chunks: Vec<Vec<String>> = names
        .chunks(names.len().div_ceil(connections.max(1)).max(1))
        .map(|c| c.iter().flat_map(|n| statements(n)).collect())
        .collect();
    let mut tasks = Vec::new();
    for chunk in chunks {
        let conn = pg.connect_admin().await?;
        tasks.push(tokio::spawn(async move {
            for s in chunk {
                conn.batch_execute(&s).await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
