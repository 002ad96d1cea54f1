//! Databases of AppServices against a real kube-apiserver and a real PostgreSQL server
//! (the harness's, started from the machine's installation). Each test has its own
//! namespace, its own server and its own DatabaseClass.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::conditions::{DATABASE_READY, DEGRADED, READY, TRUE};
use common::names::{DATABASE_URL_ENV, FINALIZER};
use common::{AppService, DatabaseClass, DatabaseSpec};
use controller::database::metrics::{DatabaseMetrics, DatabaseOperation};
use controller::database::reasons;
use controller::metrics::Ended;
use controller::metrics::Metrics;
use harness::Postgres;
use harness::eventually;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{Fixture, Running, condition, start_controller_with};

const WAIT: Duration = Duration::from_secs(60);

/// One test's world: namespace, PostgreSQL, a DatabaseClass pointing at it.
struct World {
    fixture: Fixture,
    pg: Postgres,
    class: String,
}

impl std::ops::Deref for World {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.fixture
    }
}

impl World {
    /// A server, the admin Secret (with `admin_password`, the real one when `None`) and
    /// CA Secret in the test namespace, and a verify-full class with `policy`.
    async fn new(policy: &str, admin_password: Option<&str>) -> anyhow::Result<World> {
        let fixture = Fixture::setup().without_controller().await?;
        let pg = Postgres::start().await?;
        let class = support::database_class(&fixture, &pg, policy, admin_password).await?;
        Ok(World { fixture, pg, class })
    }

    /// A controller for this namespace with the real database step; admin Secrets are
    /// read from the test namespace.
    fn controller(&self) -> (Running, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let databases = support::databases(self, metrics.clone());
        let running =
            start_controller_with(self.client.clone(), &self.ns, |_| {}, Arc::new(databases));
        (running, metrics)
    }

    fn app(&self, name: &str) -> AppService {
        common::testing::app(name, "registry.example.com/shop:v1")
            .replicas(1)
            .database(&self.class)
            .build()
    }

    /// Names of the controller's databases and roles on the server.
    async fn catalog(&self) -> anyhow::Result<(BTreeSet<String>, BTreeSet<String>)> {
        let admin = self.pg.connect_admin().await?;
        let names = |rows: Vec<tokio_postgres::Row>| -> BTreeSet<String> {
            rows.iter().map(|r| r.get::<_, String>(0)).collect()
        };
        let dbs = admin
            .query(
                "SELECT datname FROM pg_database WHERE datname LIKE 'appsvc\\_%'",
                &[],
            )
            .await?;
        let roles = admin
            .query(
                "SELECT rolname FROM pg_roles WHERE rolname LIKE 'appsvc\\_%'",
                &[],
            )
            .await?;
        Ok((names(dbs), names(roles)))
    }

    async fn wait_database_ready(&self, name: &str) -> anyhow::Result<AppService> {
        let ready = eventually(&format!("DatabaseReady=True on {name}"), WAIT, || async {
            let app = self.apps.get(name).await?;
            Ok(condition(&app, DATABASE_READY)
                .is_some_and(|(s, _, _)| s == TRUE)
                .then_some(app))
        })
        .await?;
        Ok(ready)
    }

    /// Creates the AppService `name` with a database of this world's class and waits
    /// until the database is ready; returns the AppService and the database's name.
    async fn create_ready(&self, name: &str) -> anyhow::Result<(AppService, String)> {
        self.apps
            .create(&PostParams::default(), &self.app(name))
            .await?;
        let app = self.wait_database_ready(name).await?;
        // A database exists: its deletion must wait for the cleanup.
        assert!(app.finalizers().iter().any(|f| f == FINALIZER), "{name}");
        let db = db_name(&app);
        Ok((app, db))
    }

    /// Waits until `name`'s database is ready and its Secret settled, then logs in with
    /// the Secret's password (it must be the role's); returns the database's name.
    async fn wait_usable(&self, name: &str) -> anyhow::Result<String> {
        let db = db_name(&self.wait_database_ready(name).await?);
        let secrets = self.api::<Secret>();
        let secret_name = format!("{name}-database");
        let secret = eventually("a settled Secret", WAIT, || async {
            Ok(secrets.get_opt(&secret_name).await?.filter(|s| {
                !s.annotations()
                    .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION)
            }))
        })
        .await?;
        self.pg
            .connect(&db, &secret_value(&secret, "PGPASSWORD"), &db)
            .await?;
        Ok(db)
    }

    async fn wait_gone(&self, name: &str, timeout: Duration) -> anyhow::Result<()> {
        eventually(&format!("{name} to be gone"), timeout, || async {
            Ok(self.apps.get_opt(name).await?.is_none().then_some(()))
        })
        .await?;
        Ok(())
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Cluster-scoped: remove it so other tests' lists stay small. Best effort.
        let classes: Api<DatabaseClass> = Api::all(self.client.clone());
        let class = self.class.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = classes.delete(&class, &DeleteParams::default()).await;
            });
        }
    }
}

fn secret_value(secret: &Secret, key: &str) -> String {
    let data = secret.data.as_ref().expect("secret data");
    let ByteString(bytes) = data.get(key).unwrap_or_else(|| panic!("no key {key}"));
    String::from_utf8(bytes.clone()).unwrap()
}

fn db_name(app: &AppService) -> String {
    controller::database::sql::db_name(&app.uid().unwrap())
}

#[tokio::test]
async fn create_provisions_a_usable_database_and_delete_drops_it() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let (ctl, metrics) = w.controller();
    let apps = w.apps.clone();
    let (app, db) = w.create_ready("shop").await?;
    let (_, reason, message) = condition(&app, DATABASE_READY).unwrap();
    assert_eq!(reason, reasons::PROVISIONED);
    assert!(message.contains(&db), "{message}");

    // The Secret: owned by the AppService, every key, a URL that names the database.
    let secret = w.api::<Secret>().get("shop-database").await?;
    assert_eq!(secret.owner_references()[0].uid, app.uid().unwrap());
    assert_eq!(secret.owner_references()[0].controller, Some(true));
    for key in [
        "DATABASE_URL",
        "PGHOST",
        "PGPORT",
        "PGDATABASE",
        "PGUSER",
        "PGPASSWORD",
    ] {
        assert!(!secret_value(&secret, key).is_empty(), "{key}");
    }
    assert_eq!(secret_value(&secret, "PGDATABASE"), db);
    assert_eq!(secret_value(&secret, "PGUSER"), db);
    let password = secret_value(&secret, "PGPASSWORD");
    assert!(password.len() >= 32);
    assert_eq!(
        secret_value(&secret, "DATABASE_URL"),
        format!(
            "postgres://{db}:{password}@localhost:{}/{db}?sslmode=verify-full&sslrootcert={}",
            w.pg.port(),
            common::names::DATABASE_CA_PATH
        )
    );

    // The Deployment takes DATABASE_URL from the Secret, never as a value.
    let deployments: Api<Deployment> = w.api();
    let d = eventually("the Deployment", WAIT, || {
        let deployments = deployments.clone();
        async move { Ok(deployments.get_opt("shop").await?) }
    })
    .await?;
    let env = d.spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let url = env
        .iter()
        .find(|e| e.name == DATABASE_URL_ENV)
        .expect("DATABASE_URL");
    assert!(url.value.is_none());
    let key_ref = url
        .value_from
        .as_ref()
        .and_then(|v| v.secret_key_ref.as_ref())
        .expect("secretKeyRef");
    assert_eq!(key_ref.name, "shop-database");
    assert_eq!(key_ref.key, "DATABASE_URL");

    // The server: role and database exist, the database is the role's, PUBLIC may not
    // connect, and the application's login can create a table.
    let (dbs, roles) = w.catalog().await?;
    assert_eq!(dbs, BTreeSet::from([db.clone()]));
    assert_eq!(roles, BTreeSet::from([db.clone()]));
    let admin = w.pg.connect_admin().await?;
    let row = admin
        .query_one(
            "SELECT pg_get_userbyid(datdba), has_database_privilege('public', datname, 'CONNECT') FROM pg_database WHERE datname = $1",
            &[&db],
        )
        .await?;
    assert_eq!(row.get::<_, String>(0), db);
    assert!(!row.get::<_, bool>(1), "CONNECT is revoked from PUBLIC");
    let user = w.pg.connect(&db, &password, &db).await?;
    user.batch_execute(
        "CREATE TABLE orders (id bigint primary key); INSERT INTO orders VALUES (1)",
    )
    .await?;

    // Delete: database and role go, then the AppService.
    apps.delete("shop", &DeleteParams::default()).await?;
    w.wait_gone("shop", WAIT).await?;
    assert_eq!(w.catalog().await?, (BTreeSet::new(), BTreeSet::new()));
    assert!(
        metrics
            .families::<DatabaseMetrics>()
            .count(DatabaseOperation::Provision, Ended::Success)
            >= 1
    );
    assert!(
        metrics
            .families::<DatabaseMetrics>()
            .count(DatabaseOperation::Cleanup, Ended::Success)
            >= 1
    );
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn an_outage_during_delete_keeps_the_app_terminating_until_the_server_is_back()
-> anyhow::Result<()> {
    let mut w = World::new("Delete", None).await?;
    let (ctl, metrics) = w.controller();
    let apps = w.apps.clone();
    let (_, db) = w.create_ready("shop").await?;

    w.pg.stop();
    apps.delete("shop", &DeleteParams::default()).await?;
    let failing = eventually("Degraded=CleanupFailed", WAIT, || {
        let apps = apps.clone();
        async move {
            let app = apps.get("shop").await?;
            Ok(condition(&app, DEGRADED)
                .is_some_and(|(s, r, _)| {
                    s == TRUE && r == common::conditions::reasons::CLEANUP_FAILED
                })
                .then_some(app))
        }
    })
    .await?;
    let (_, _, message) = condition(&failing, DEGRADED).unwrap();
    assert!(message.contains("unreachable"), "{message}");
    assert!(message.contains(&w.class), "{message}");
    assert!(failing.metadata.deletion_timestamp.is_some());
    assert!(ctl.metrics.cleanup_failure_count() >= 1);
    assert!(
        metrics
            .families::<DatabaseMetrics>()
            .count(DatabaseOperation::Cleanup, Ended::Error)
            >= 1
    );
    // A Warning Event says so too.
    let events: Api<Event> = w.api();
    let warned = eventually("a CleanupFailed Event", WAIT, || {
        let events = events.clone();
        async move {
            Ok(events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("CleanupFailed")))
        }
    })
    .await?;
    assert!(warned.note.unwrap_or_default().contains("unreachable"));
    // Still there after the next attempts: nothing releases the finalizer while the
    // server is down.
    let failures = ctl.metrics.cleanup_failure_count();
    eventually("two more cleanup attempts", WAIT, || async {
        Ok((ctl.metrics.cleanup_failure_count() >= failures + 2).then_some(()))
    })
    .await?;
    assert!(apps.get_opt("shop").await?.is_some(), "stays Terminating");

    w.pg.start_again().await?;
    w.wait_gone("shop", Duration::from_secs(120)).await?;
    let (dbs, roles) = w.catalog().await?;
    assert!(
        !dbs.contains(&db) && !roles.contains(&db),
        "{dbs:?} {roles:?}"
    );
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_lost_secret_gets_a_new_password_and_the_old_one_stops_working() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let (ctl, _) = w.controller();
    let (_, db) = w.create_ready("shop").await?;
    let old = secret_value(&w.api::<Secret>().get("shop-database").await?, "PGPASSWORD");
    w.pg.connect(&db, &old, &db).await?;

    w.api::<Secret>()
        .delete("shop-database", &DeleteParams::default())
        .await?;
    let secrets = w.api::<Secret>();
    let renewed = eventually("a new Secret", WAIT, || {
        let secrets = secrets.clone();
        async move {
            Ok(secrets.get_opt("shop-database").await?.filter(|s| {
                // Settled: the password is the role's.
                !s.annotations()
                    .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION)
            }))
        }
    })
    .await?;
    let new = secret_value(&renewed, "PGPASSWORD");
    assert_ne!(new, old);
    assert!(
        w.pg.connect(&db, &old, &db).await.is_err(),
        "the old password no longer works"
    );
    w.pg.connect(&db, &new, &db).await?;
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn wrong_admin_credentials_are_reported_without_leaking_them() -> anyhow::Result<()> {
    let wrong = "wrong-admin-password-3f9c2e";
    let w = World::new("Delete", Some(wrong)).await?;
    let (ctl, _) = w.controller();
    let apps = w.apps.clone();
    apps.create(&PostParams::default(), &w.app("shop")).await?;

    let app = eventually("DatabaseReady=False/AdminCredentialsRejected", WAIT, || {
        let apps = apps.clone();
        async move {
            let app = apps.get("shop").await?;
            Ok(condition(&app, DATABASE_READY)
                .is_some_and(|(_, r, _)| r == reasons::ADMIN_CREDENTIALS_REJECTED)
                .then_some(app))
        }
    })
    .await?;
    let (status, _, message) = condition(&app, DATABASE_READY).unwrap();
    assert_eq!(status, "False");
    assert!(message.contains("rejected the admin login"), "{message}");
    let (ready, ready_reason, _) = condition(&app, READY).unwrap();
    assert_eq!(
        (ready.as_str(), ready_reason.as_str()),
        ("False", reasons::ADMIN_CREDENTIALS_REJECTED)
    );
    // No Deployment points at a Secret that does not exist.
    let deployments: Api<Deployment> = w.api();
    assert!(deployments.get_opt("shop").await?.is_none());

    // Nowhere a password: not in the AppService, the class's status, or any Event.
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    let class = eventually("the class's Reachable=False", WAIT, || {
        let classes = classes.clone();
        let name = w.class.clone();
        async move {
            let c = classes.get(&name).await?;
            Ok(c.status
                .as_ref()
                .is_some_and(|s| {
                    common::conditions::find(&s.conditions, "Reachable")
                        .is_some_and(|c| c.status == "False")
                })
                .then_some(c))
        }
    })
    .await?;
    let events: Api<Event> = w.api();
    let events = events.list(&ListParams::default()).await?;
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some(reasons::ADMIN_CREDENTIALS_REJECTED)),
        "an Event on the transition"
    );
    let everything = format!(
        "{} {} {}",
        serde_json::to_string(&apps.get("shop").await?)?,
        serde_json::to_string(&class)?,
        serde_json::to_string(&events)?
    );
    assert!(!everything.contains(wrong), "the wrong password leaked");
    assert!(
        !everything.contains(w.pg.password()),
        "the real password leaked"
    );

    // The admin fixes the Secret: provisioning goes on by itself.
    let fix = json!({"stringData": {"password": w.pg.password()}});
    w.api::<Secret>()
        .patch("pg-admin", &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    w.wait_database_ready("shop").await?;
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn an_unknown_class_is_reported_and_nothing_is_rolled_out() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let (ctl, _) = w.controller();
    let apps = w.apps.clone();
    let mut app = w.app("shop");
    app.spec.database = Some(DatabaseSpec {
        class: "no-such-class".into(),
    });
    apps.create(&PostParams::default(), &app).await?;
    let app = eventually("DatabaseClassNotFound", WAIT, || {
        let apps = apps.clone();
        async move {
            let app = apps.get("shop").await?;
            Ok(condition(&app, DATABASE_READY)
                .is_some_and(|(_, r, _)| r == reasons::CLASS_NOT_FOUND)
                .then_some(app))
        }
    })
    .await?;
    let (_, _, message) = condition(&app, READY).unwrap();
    assert!(
        message.contains("\"no-such-class\" does not exist"),
        "{message}"
    );
    let deployments: Api<Deployment> = w.api();
    assert!(deployments.get_opt("shop").await?.is_none());
    // Deleting it needs no server: nothing was ever created.
    apps.delete("shop", &DeleteParams::default()).await?;
    w.wait_gone("shop", WAIT).await?;
    ctl.stop().await?;
    Ok(())
}

#[tokio::test]
async fn two_controllers_at_once_make_one_database_with_one_password() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    // Both reconcile every object (no leader election): the worst case of a handover.
    let (a, _) = w.controller();
    let (b, _) = w.controller();
    let apps = w.apps.clone();
    let names: Vec<String> = (0..6).map(|i| format!("shop-{i}")).collect();
    for name in &names {
        apps.create(&PostParams::default(), &w.app(name)).await?;
    }
    let mut expected = BTreeSet::new();
    for name in &names {
        expected.insert(w.wait_usable(name).await?);
    }
    assert_eq!(w.catalog().await?, (expected.clone(), expected));
    a.stop().await?;
    b.stop().await?;
    Ok(())
}

#[tokio::test]
async fn disabling_or_deleting_follows_the_deletion_policy() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let (ctl, _) = w.controller();
    let apps = w.apps.clone();
    let (_, db) = w.create_ready("shop").await?;

    // Disable on a live AppService with Delete: dropped, Secret and condition gone.
    let disable = json!({"spec": {"database": null}});
    apps.patch("shop", &PatchParams::default(), &Patch::Merge(&disable))
        .await?;
    eventually("the database dropped after disabling it", WAIT, || {
        let apps = apps.clone();
        let w = &w;
        async move {
            let app = apps.get("shop").await?;
            let (dbs, _) = w.catalog().await?;
            Ok((condition(&app, DATABASE_READY).is_none()
                && dbs.is_empty()
                && w.api::<Secret>().get_opt("shop-database").await?.is_none())
            .then_some(()))
        }
    })
    .await?;
    assert!(!w.catalog().await?.1.contains(&db));

    // Retain: deleting keeps database and role, and an Event says so.
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    let retain = json!({"spec": {"deletionPolicy": "Retain"}});
    classes
        .patch(&w.class, &PatchParams::default(), &Patch::Merge(&retain))
        .await?;
    let (_, kept_db) = w.create_ready("kept").await?;
    apps.delete("kept", &DeleteParams::default()).await?;
    w.wait_gone("kept", WAIT).await?;
    let (dbs, roles) = w.catalog().await?;
    assert!(dbs.contains(&kept_db) && roles.contains(&kept_db));
    let events: Api<Event> = w.api();
    let events = events.list(&ListParams::default()).await?;
    let retained = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some(reasons::RETAINED))
        .expect("a DatabaseRetained Event");
    assert!(
        retained
            .note
            .as_deref()
            .unwrap_or_default()
            .contains(&kept_db)
    );
    ctl.stop().await?;
    Ok(())
}

/// Many create/delete cycles while the server restarts at random moments: afterwards the
/// server holds exactly the databases of the live AppServices. `APPSERVICE_DB_CYCLES`
/// sets the number of cycles (default 200).
#[tokio::test]
async fn cycles_with_server_restarts_leak_nothing() -> anyhow::Result<()> {
    let cycles: usize = std::env::var("APPSERVICE_DB_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut w = World::new("Delete", None).await?;
    let (ctl, metrics) = w.controller();
    let apps = w.apps.clone();
    let mut kept = Vec::new();
    let batch = 10;
    let mut restarts = 0;
    for (round, start) in (0..cycles).step_by(batch).enumerate() {
        let names: Vec<String> = (start..(start + batch).min(cycles))
            .map(|i| format!("c-{i}"))
            .collect();
        for name in &names {
            apps.create(&PostParams::default(), &w.app(name)).await?;
        }
        // A restart while these are being provisioned (every third round, and at random).
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
        if round % 3 == 0 || rand::random_bool(0.2) {
            restarts += 1;
            w.pg.stop();
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..500))).await;
            w.pg.start_again().await?;
        }
        for (i, name) in names.iter().enumerate() {
            // Every tenth stays, so the check also covers "exactly one per live app".
            if (start + i) % 10 == 9 {
                kept.push(name.clone());
            } else {
                apps.delete(name, &DeleteParams::default()).await?;
            }
        }
        // ... and one while they are being cleaned up.
        tokio::time::sleep(Duration::from_millis(rand::random_range(0..300))).await;
        if round % 3 == 1 || rand::random_bool(0.2) {
            restarts += 1;
            w.pg.stop();
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..500))).await;
            w.pg.start_again().await?;
        }
    }
    // Everything settles: the deleted ones go, the kept ones are ready.
    eventually(
        "deleted AppServices to be gone",
        Duration::from_secs(360),
        || {
            let apps = apps.clone();
            let kept = kept.len();
            async move {
                Ok((apps.list(&ListParams::default()).await?.items.len() == kept).then_some(()))
            }
        },
    )
    .await?;
    // Kept ones that failed during several outages in a row may be in backoff; the
    // error policy caps it at 300s, so that is the longest any of them may wait.
    let mut live = BTreeSet::new();
    for name in &kept {
        let app = eventually(
            "DatabaseReady after the outages",
            Duration::from_secs(330),
            || {
                let apps = apps.clone();
                let name = name.clone();
                async move {
                    let app = apps.get(&name).await?;
                    Ok(condition(&app, DATABASE_READY)
                        .is_some_and(|(s, _, _)| s == TRUE)
                        .then_some(app))
                }
            },
        )
        .await?;
        live.insert(db_name(&app));
    }
    let (dbs, roles) = w.catalog().await?;
    let leaked_dbs: Vec<_> = dbs.difference(&live).collect();
    let leaked_roles: Vec<_> = roles.difference(&live).collect();
    eprintln!(
        "cycles: {cycles}, server restarts: {restarts}, live: {}, leaked databases: {}, leaked roles: {}, {}",
        live.len(),
        leaked_dbs.len(),
        leaked_roles.len(),
        metrics.families::<DatabaseMetrics>().summary(),
    );
    assert!(leaked_dbs.is_empty(), "leaked databases: {leaked_dbs:?}");
    assert!(leaked_roles.is_empty(), "leaked roles: {leaked_roles:?}");
    assert_eq!(dbs, live, "one database per live AppService");
    assert_eq!(roles, live, "one role per live AppService");
    ctl.stop().await?;
    Ok(())
}

/// The controller binary, leader-elected on a Lease in `ns` (admin Secrets read there).
fn spawn_controller(
    w: &World,
    kubeconfig: &std::path::Path,
    identity: &str,
) -> anyhow::Result<tokio::process::Child> {
    let log = std::fs::File::create(w.pg.log_dir().join(format!("{identity}.log")))?;
    Ok(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_appservice-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--watch-namespace",
                w.ns.name(),
                "--lease-namespace",
                w.ns.name(),
            ])
            .args(["--identity", identity, "--ops-addr", "127.0.0.1:0"])
            .args([
                "--lease-duration",
                "6s",
                "--renew-deadline",
                "4s",
                "--retry-period",
                "1s",
            ])
            .args(["--log-format", "json"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()?,
    )
}

#[tokio::test]
async fn leader_killed_mid_provisioning_leaves_one_database_per_app() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let cp = harness::shared().await?;
    let mut a = spawn_controller(&w, cp.kubeconfig_path(), "db-a")?;
    let mut b = spawn_controller(&w, cp.kubeconfig_path(), "db-b")?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = w.api();
    let leader = eventually("a leader", WAIT, || {
        let leases = leases.clone();
        async move {
            Ok(leases
                .get_opt(common::names::LEASE_NAME)
                .await?
                .and_then(|l| l.spec?.holder_identity))
        }
    })
    .await?;

    let apps = w.apps.clone();
    let names: Vec<String> = (0..8).map(|i| format!("ho-{i}")).collect();
    for name in &names {
        apps.create(&PostParams::default(), &w.app(name)).await?;
    }
    // Kill the leader (SIGKILL, no lease release) as soon as provisioning is under way.
    eventually("the first credentials Secret", WAIT, || {
        let secrets = w.api::<Secret>();
        async move {
            let list = secrets.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .any(|s| s.name_any().starts_with("ho-"))
                .then_some(()))
        }
    })
    .await?;
    let (killed, survivor) = if leader == "db-a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    killed.kill().await?;

    // The standby takes over after the lease expires and finishes every one of them.
    let mut expected = BTreeSet::new();
    for name in &names {
        expected.insert(w.wait_usable(name).await?);
    }
    assert_eq!(w.catalog().await?, (expected.clone(), expected));
    assert!(
        survivor.try_wait()?.is_none(),
        "the standby is still running"
    );
    survivor.kill().await?;
    Ok(())
}

/// Sets server-wide settings as the superuser and reloads them (new and open sessions).
async fn server_settings(pg: &Postgres, settings: &[&str]) -> anyhow::Result<()> {
    let admin = pg.connect_admin().await?;
    for setting in settings {
        admin
            .batch_execute(&format!("ALTER SYSTEM SET {setting}"))
            .await?;
    }
    admin.batch_execute("SELECT pg_reload_conf()").await?;
    Ok(())
}

/// Waits until `name`'s Secret is settled with a password other than every one in
/// `not`, and returns that password.
async fn settled_password(w: &World, name: &str, not: &[Vec<u8>]) -> anyhow::Result<String> {
    let secrets = w.api::<Secret>();
    let secret_name = format!("{name}-database");
    let secret = eventually("the Secret settled with a new password", WAIT, || async {
        Ok(secrets.get_opt(&secret_name).await?.filter(|s| {
            let pending = s
                .annotations()
                .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION);
            let pw = s.data.as_ref().and_then(|d| d.get("PGPASSWORD"));
            !pending && pw.is_some_and(|ByteString(pw)| !not.contains(pw))
        }))
    })
    .await?;
    Ok(secret_value(&secret, "PGPASSWORD"))
}

/// A tenant who may edit Secrets in their namespace writes a password of their own into
/// `<name>-database`, everywhere the controller looks (PGPASSWORD, DATABASE_URL, the hash
/// annotation) and marks it pending, so that the controller would set it on the role.
async fn tenant_sets_password(w: &World, name: &str, password: &[u8]) -> anyhow::Result<()> {
    let secrets = w.api::<Secret>();
    let secret_name = format!("{name}-database");
    // A read-modify-write, as `kubectl edit` does; the controller may write in between.
    for _ in 0..10 {
        let mut secret = secrets.get(&secret_name).await?;
        let db = secret_value(&secret, "PGUSER");
        let mut url = format!("postgres://{db}:").into_bytes();
        url.extend_from_slice(password);
        url.extend_from_slice(
            format!("@localhost:{}/{db}?sslmode=verify-full", w.pg.port()).as_bytes(),
        );
        let data = secret.data.get_or_insert_with(Default::default);
        data.insert("PGPASSWORD".into(), ByteString(password.to_vec()));
        data.insert("DATABASE_URL".into(), ByteString(url));
        let annotations = secret
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        annotations.insert(
            controller::database::secret::PASSWORD_HASH_ANNOTATION.into(),
            controller::database::secret::password_hash(&String::from_utf8_lossy(password)),
        );
        annotations.insert(
            controller::database::PASSWORD_PENDING_ANNOTATION.into(),
            "true".into(),
        );
        match secrets
            .replace(&secret_name, &PostParams::default(), &secret)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("the Secret kept changing under the tenant's edit")
}

/// Hostile passwords a tenant puts in the credentials Secret are never sent to the
/// server: each is replaced by a generated one the role then logs in with, a tenant's
/// own password of the generated shape is accepted, and with `log_statement = 'all'`
/// the server's log holds none of them in clear text, only SCRAM verifiers. The server
/// runs with `standard_conforming_strings = off`, which the controller's sessions
/// override.
#[tokio::test]
async fn hostile_passwords_in_the_secret_never_reach_the_server() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    server_settings(
        &w.pg,
        &["log_statement = 'all'", "standard_conforming_strings = off"],
    )
    .await?;
    let (ctl, _) = w.controller();
    let db = {
        w.apps
            .create(&PostParams::default(), &w.app("shop"))
            .await?;
        w.wait_usable("shop").await?
    };
    let first = secret_value(&w.api::<Secret>().get("shop-database").await?, "PGPASSWORD");

    let marker = "Hx7qZ"; // in every hostile value, so the log can be searched for it
    let hostile: Vec<(&str, Vec<u8>)> = vec![
        (
            "quotes",
            format!("{marker}'; ALTER ROLE {} SUPERUSER; --", db).into_bytes(),
        ),
        (
            "backslashes",
            format!("{marker}\\' || pg_sleep(1) || '\\\\").into_bytes(),
        ),
        ("semicolons", format!("{marker};;SELECT 1;").into_bytes()),
        ("NUL", format!("{marker}\0after-nul").into_bytes()),
        (
            "10 KiB",
            format!("{marker}{}", "p".repeat(10 * 1024)).into_bytes(),
        ),
        (
            "not UTF-8",
            [marker.as_bytes(), &[0xff, 0xfe, 0xc3, 0x28, b'\''][..]].concat(),
        ),
        (
            "dollar quotes",
            format!("{marker}$$ || current_user || $$").into_bytes(),
        ),
    ];
    let mut seen = vec![first.clone().into_bytes()];
    for (what, password) in &hostile {
        tenant_sets_password(&w, "shop", password).await?;
        let mut not = seen.clone();
        not.push(password.clone());
        let new = settled_password(&w, "shop", &not).await?;
        assert!(
            controller::database::sql::is_generated_shape(&new),
            "{what}: replaced by a generated password"
        );
        w.pg.connect(&db, &new, &db).await.map_err(|e| {
            anyhow::anyhow!("{what}: the Secret's new password does not log in: {e}")
        })?;
        seen.push(new.into_bytes());
    }

    // A password of the generated shape that the tenant chose is theirs to set.
    let chosen = "TenantChosen0123456789abcdefghij";
    assert_eq!(chosen.len(), controller::database::sql::PASSWORD_LEN);
    tenant_sets_password(&w, "shop", chosen.as_bytes()).await?;
    eventually("the tenant's password to work", WAIT, || async {
        w.pg.connect(&db, chosen, &db).await.ok().map(|_| ())
    })
    .await?;
    seen.push(chosen.as_bytes().to_vec());

    // Nothing beyond the role was touched: it is no superuser, and the admin still logs in.
    let admin = w.pg.connect_admin().await?;
    let row = admin
        .query_one(
            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = $1",
            &[&db],
        )
        .await?;
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, bool>(1),
            row.get::<_, bool>(2)
        ),
        (false, false, false)
    );

    let log = w.pg.server_log()?;
    assert!(
        log.contains("ALTER ROLE") && log.contains("SCRAM-SHA-256$4096:"),
        "the server logged the controller's statements (log_statement = 'all'), verifiers only"
    );
    assert!(
        !log.contains(marker),
        "a hostile password reached the server's log"
    );
    for password in &seen {
        let text = String::from_utf8_lossy(password);
        assert!(
            !log.contains(&*text),
            "a password in clear text in the server's log"
        );
    }
    eprintln!(
        "hostile passwords: {} replaced, 1 tenant-chosen accepted; server log: {} bytes, {} ALTER ROLE statements, no plaintext",
        hostile.len(),
        log.len(),
        log.matches("ALTER ROLE").count()
    );
    ctl.stop().await?;
    Ok(())
}

/// Sets (or with `None` removes) the opt-in label of the world's admin Secret.
async fn admin_secret_label(w: &World, value: Option<&str>) -> anyhow::Result<()> {
    let patch =
        json!({"metadata": {"labels": {(common::database_class::ADMIN_SECRET_LABEL): value}}});
    w.api::<Secret>()
        .patch("pg-admin", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Everything a tenant of the namespace reads about its AppService: the object and the
/// namespace's Events.
async fn tenant_view(w: &World, name: &str) -> anyhow::Result<String> {
    let events: Api<Event> = w.api();
    Ok(format!(
        "{} {}",
        serde_json::to_string(&w.apps.get(name).await?)?,
        serde_json::to_string(&events.list(&ListParams::default()).await?)?
    ))
}

async fn wait_reason(w: &World, name: &str, reason: &str) -> anyhow::Result<AppService> {
    Ok(
        eventually(&format!("DatabaseReady reason {reason}"), WAIT, || async {
            let app = w.apps.get(name).await?;
            Ok(condition(&app, DATABASE_READY)
                .is_some_and(|(s, r, _)| s == "False" && r == reason)
                .then_some(app))
        })
        .await?,
    )
}

async fn class_reachable(w: &World) -> anyhow::Result<(String, String, String)> {
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    let c = classes.get(&w.class).await?;
    Ok(c.status
        .and_then(|s| {
            common::conditions::find(&s.conditions, "Reachable")
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        })
        .unwrap_or_default())
}

/// An admin Secret without the opt-in label is not used: the class says why (naming
/// the Secret), the AppService says only that an admin must fix the class; with the
/// label, provisioning goes on by itself.
#[tokio::test]
async fn a_class_is_usable_only_with_an_opted_in_admin_secret() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    admin_secret_label(&w, None).await?;
    let (ctl, _) = w.controller();
    w.apps
        .create(&PostParams::default(), &w.app("shop"))
        .await?;
    let app = wait_reason(&w, "shop", reasons::ADMIN_SECRET_NOT_OPTED_IN).await?;
    let (_, _, message) = condition(&app, DATABASE_READY).unwrap();
    assert!(message.contains(&w.class), "{message}");
    assert!(message.contains("cluster admin"), "{message}");
    assert!(w.api::<Deployment>().get_opt("shop").await?.is_none());
    assert_eq!(w.catalog().await?, (BTreeSet::new(), BTreeSet::new()));

    let (status, reason, class_message) = eventually("the class's condition", WAIT, || async {
        let r = class_reachable(&w).await?;
        Ok((r.1 == reasons::ADMIN_SECRET_NOT_OPTED_IN).then_some(r))
    })
    .await?;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", reasons::ADMIN_SECRET_NOT_OPTED_IN)
    );
    assert!(
        class_message.contains("pg-admin")
            && class_message.contains(common::database_class::ADMIN_SECRET_LABEL),
        "the admin's view names the Secret and the label: {class_message}"
    );
    eventually("the Warning Event", WAIT, || async {
        let events: Api<Event> = w.api();
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::ADMIN_SECRET_NOT_OPTED_IN)))
    })
    .await?;
    let seen = tenant_view(&w, "shop").await?;
    assert!(
        !seen.contains("pg-admin"),
        "the tenant sees the admin Secret's name"
    );
    assert!(
        !seen.contains(harness::postgres::SUPERUSER),
        "the tenant sees the admin user"
    );

    // Deleting it does not wait for the admin: nothing was ever created through the class.
    w.apps.delete("shop", &DeleteParams::default()).await?;
    w.wait_gone("shop", WAIT).await?;
    w.apps
        .create(&PostParams::default(), &w.app("shop"))
        .await?;

    // The admin opts the Secret in: provisioning goes on by itself.
    admin_secret_label(&w, Some("true")).await?;
    w.wait_usable("shop").await?;
    ctl.stop().await?;
    Ok(())
}

/// The admin user's name and Secret stay out of what tenants see when the login is
/// rejected too (the server's message names the user).
#[tokio::test]
async fn rejected_admin_logins_name_neither_user_nor_secret_to_tenants() -> anyhow::Result<()> {
    let w = World::new("Delete", Some("not-the-admin-password")).await?;
    let (ctl, _) = w.controller();
    w.apps
        .create(&PostParams::default(), &w.app("shop"))
        .await?;
    wait_reason(&w, "shop", reasons::ADMIN_CREDENTIALS_REJECTED).await?;
    eventually("the Warning Event", WAIT, || async {
        let events: Api<Event> = w.api();
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::ADMIN_CREDENTIALS_REJECTED)))
    })
    .await?;
    let seen = tenant_view(&w, "shop").await?;
    assert!(!seen.contains("pg-admin"), "{seen}");
    assert!(!seen.contains(harness::postgres::SUPERUSER), "{seen}");
    // The class's status has the server's words, for the admin.
    let (_, _, class_message) = eventually("the class's condition", WAIT, || async {
        let r = class_reachable(&w).await?;
        Ok((r.1 == reasons::ADMIN_CREDENTIALS_REJECTED).then_some(r))
    })
    .await?;
    assert!(
        class_message.contains(harness::postgres::SUPERUSER),
        "{class_message}"
    );
    ctl.stop().await?;
    Ok(())
}

/// `allowedNamespaces`: an AppService of a namespace the class does not list gets a
/// refusal and nothing on the server; listing it by label selector lets it in.
#[tokio::test]
async fn a_class_serves_only_the_namespaces_it_allows() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    let only_others = json!({"spec": {"allowedNamespaces": {"names": ["someone-else"]}}});
    classes
        .patch(
            &w.class,
            &PatchParams::default(),
            &Patch::Merge(&only_others),
        )
        .await?;
    let (ctl, _) = w.controller();
    w.apps
        .create(&PostParams::default(), &w.app("shop"))
        .await?;
    let app = wait_reason(&w, "shop", reasons::NAMESPACE_NOT_ALLOWED).await?;
    let (_, _, message) = condition(&app, DATABASE_READY).unwrap();
    assert!(
        message.contains(w.ns.name()) && message.contains(&w.class),
        "{message}"
    );
    let (ready, ready_reason, _) = condition(&app, READY).unwrap();
    assert_eq!(
        (ready.as_str(), ready_reason.as_str()),
        ("False", reasons::NAMESPACE_NOT_ALLOWED)
    );
    assert!(w.api::<Deployment>().get_opt("shop").await?.is_none());
    assert!(w.api::<Secret>().get_opt("shop-database").await?.is_none());
    assert_eq!(w.catalog().await?, (BTreeSet::new(), BTreeSet::new()));

    // A selector on the namespace's labels: the namespace gets the label, the class
    // selects it.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(w.client.clone());
    namespaces
        .patch(
            w.ns.name(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"db-tier": "gold"}}})),
        )
        .await?;
    let by_label = json!({"spec": {"allowedNamespaces": {"names": ["someone-else"], "selector": {"matchLabels": {"db-tier": "gold"}}}}});
    classes
        .patch(&w.class, &PatchParams::default(), &Patch::Merge(&by_label))
        .await?;
    w.wait_usable("shop").await?;
    ctl.stop().await?;
    Ok(())
}

/// `tls.mode: disable` is refused by the API server without the acknowledgement, and
/// with it the class works over plain TCP.
#[tokio::test]
async fn plain_tcp_needs_an_explicit_acknowledgement() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    let class = |name: &str, tls: serde_json::Value| -> anyhow::Result<DatabaseClass> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1alpha1", "kind": "DatabaseClass",
            "metadata": {"name": name},
            "spec": {"host": "127.0.0.1", "port": w.pg.port(), "tls": tls,
                     "adminCredentials": {"secretName": "pg-admin"}}
        }))?)
    };
    let plain = format!("{}-plain", w.ns.name());
    for tls in [
        json!({"mode": "disable"}),
        json!({"mode": "disable", "insecureAcknowledged": false}),
    ] {
        let refused = classes
            .create(&PostParams::default(), &class(&plain, tls.clone())?)
            .await
            .expect_err("refused without the acknowledgement");
        assert!(
            refused.to_string().contains("insecureAcknowledged"),
            "{tls}: {refused}"
        );
    }
    classes
        .create(
            &PostParams::default(),
            &class(
                &plain,
                json!({"mode": "disable", "insecureAcknowledged": true}),
            )?,
        )
        .await?;
    // Taking the acknowledgement back is refused as well.
    let unack = json!({"spec": {"tls": {"insecureAcknowledged": false}}});
    assert!(
        classes
            .patch(&plain, &PatchParams::default(), &Patch::Merge(&unack))
            .await
            .is_err()
    );
    let (ctl, _) = w.controller();
    let mut app = w.app("shop");
    app.spec.database = Some(DatabaseSpec {
        class: plain.clone(),
    });
    w.apps.create(&PostParams::default(), &app).await?;
    let db = w.wait_usable("shop").await?;
    let secret = w.api::<Secret>().get("shop-database").await?;
    assert_eq!(secret_value(&secret, "PGSSLMODE"), "disable");
    assert!(secret_value(&secret, "DATABASE_URL").ends_with(&format!("/{db}?sslmode=disable")));
    ctl.stop().await?;
    let _ = classes.delete(&plain, &DeleteParams::default()).await;
    Ok(())
}

/// Whether the role `db` may log in, and its connection limit, as the server says.
async fn role_state(pg: &Postgres, db: &str) -> anyhow::Result<(bool, i32)> {
    let admin = pg.connect_admin().await?;
    let row = admin
        .query_one(
            "SELECT rolcanlogin, rolconnlimit FROM pg_roles WHERE rolname = $1",
            &[&db],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Makes the controller look at `name` again (any change of the object wakes it).
async fn touch(w: &World, name: &str, value: &str) -> anyhow::Result<()> {
    let patch = json!({"metadata": {"annotations": {"test.example.com/touch": value}}});
    w.apps
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Tenant roles get the class's connection limit: applied on create, following the
/// class, enforced by the server (one connection more is refused), and put back after
/// someone changes it or takes LOGIN away.
#[tokio::test]
async fn tenant_roles_get_the_class_connection_limit() -> anyhow::Result<()> {
    let w = World::new("Delete", None).await?;
    let (ctl, _) = w.controller();
    let (_, db) = w.create_ready("shop").await?;
    assert_eq!(
        role_state(&w.pg, &db).await?,
        (true, common::database_class::DEFAULT_CONNECTION_LIMIT)
    );
    let password = secret_value(&w.api::<Secret>().get("shop-database").await?, "PGPASSWORD");

    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    classes
        .patch(
            &w.class,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"connectionLimit": 2}})),
        )
        .await?;
    touch(&w, "shop", "1").await?;
    eventually("the class's new limit on the role", WAIT, || async {
        Ok((role_state(&w.pg, &db).await? == (true, 2)).then_some(()))
    })
    .await?;
    // The consumer of the limit: the server refuses the third session of the role.
    let first = w.pg.connect(&db, &password, &db).await?;
    let second = w.pg.connect(&db, &password, &db).await?;
    let third = w.pg.connect(&db, &password, &db).await;
    let refused = third.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        refused.contains("too many connections"),
        "a third session: {refused:?}"
    );
    drop((first, second));

    // Drift: an admin lifts the limit and takes LOGIN away; the next pass puts both back.
    w.pg.connect_admin()
        .await?
        .batch_execute(&format!("ALTER ROLE \"{db}\" NOLOGIN CONNECTION LIMIT -1"))
        .await?;
    touch(&w, "shop", "2").await?;
    eventually("LOGIN and the limit put back", WAIT, || async {
        Ok((role_state(&w.pg, &db).await? == (true, 2)).then_some(()))
    })
    .await?;
    w.pg.connect(&db, &password, &db).await?;

    // The API server holds the bounds.
    let refused = classes
        .patch(
            &w.class,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"connectionLimit": 0}})),
        )
        .await;
    assert!(refused.is_err(), "connectionLimit 0 is refused");
    ctl.stop().await?;
    Ok(())
}

/// `deletionPolicy: Retain` keeps the database and its data, but the role can no longer
/// log in and its open sessions are ended.
#[tokio::test]
async fn retain_keeps_the_data_but_not_the_login() -> anyhow::Result<()> {
    let w = World::new("Retain", None).await?;
    let (ctl, _) = w.controller();
    let (_, db) = w.create_ready("kept").await?;
    let password = secret_value(&w.api::<Secret>().get("kept-database").await?, "PGPASSWORD");
    let held = w.pg.connect(&db, &password, &db).await?;
    held.batch_execute("CREATE TABLE orders (id bigint); INSERT INTO orders VALUES (1), (2)")
        .await?;

    w.apps.delete("kept", &DeleteParams::default()).await?;
    w.wait_gone("kept", WAIT).await?;
    assert!(!role_state(&w.pg, &db).await?.0, "NOLOGIN");
    let login = w.pg.connect(&db, &password, &db).await;
    assert!(
        login.is_err(),
        "the application's credentials no longer log in"
    );
    assert!(
        held.simple_query("SELECT 1").await.is_err(),
        "the open session was ended"
    );
    let admin_view =
        w.pg.connect(harness::postgres::SUPERUSER, w.pg.password(), &db)
            .await?;
    let rows: i64 = admin_view
        .query_one("SELECT count(*) FROM orders", &[])
        .await?
        .get(0);
    assert_eq!(rows, 2, "the data is kept");
    let events: Api<Event> = w.api();
    let retained = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some(reasons::RETAINED))
        .expect("a DatabaseRetained Event");
    let note = retained.note.unwrap_or_default();
    assert!(
        note.contains(&db) && note.contains("can no longer log in"),
        "{note}"
    );
    ctl.stop().await?;
    Ok(())
}

/// Events about the DatabaseClass `class` with `reason` (a cluster-scoped object's Events
/// are in `default`).
async fn class_events(w: &World, reason: &str) -> anyhow::Result<Vec<Event>> {
    let events: Api<Event> = Api::namespaced(w.client.clone(), "default");
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(w.class.as_str())
        })
        .collect())
}

/// Databases whose AppService went without its cleanup (the finalizer removed by hand)
/// are found by the orphan scan: counted and reported once on the class, left alone under
/// `orphanPolicy: Report`, dropped under `Drop` only when two scans in a row found them;
/// the database of a live AppService and a role kept by Retain are never touched.
#[tokio::test]
async fn orphaned_databases_are_reported_and_dropped_only_by_opt_in() -> anyhow::Result<()> {
    use controller::database::metrics::OrphanState;
    let w = World::new("Delete", None).await?;
    let (ctl, _) = w.controller();
    let (_, live) = w.create_ready("live").await?;
    let (_, lost) = w.create_ready("lost").await?;
    let (_, later) = w.create_ready("later").await?;
    ctl.stop().await?;
    // The finalizer removed by hand, then the object deleted: no cleanup runs.
    let without_finalizer = json!({"metadata": {"finalizers": null}});
    w.apps
        .patch(
            "lost",
            &PatchParams::default(),
            &Patch::Merge(&without_finalizer),
        )
        .await?;
    w.apps.delete("lost", &DeleteParams::default()).await?;
    w.wait_gone("lost", WAIT).await?;
    // A role that deletionPolicy Retain kept without a login, its AppService long gone.
    let retained = controller::database::sql::db_name("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
    w.pg.connect_admin()
        .await?
        .batch_execute(&format!("CREATE ROLE {retained} NOLOGIN"))
        .await?;

    // The shipped scan, run on demand (its period is an hour).
    let metrics = Arc::new(Metrics::default());
    let databases = support::databases(&w, metrics.clone());
    databases.scan_orphans().await;
    let gauges = |m: &Metrics| {
        (
            m.families::<DatabaseMetrics>()
                .orphans_of(&w.class, OrphanState::Orphaned),
            m.families::<DatabaseMetrics>()
                .orphans_of(&w.class, OrphanState::Retained),
        )
    };
    assert_eq!(gauges(&metrics), (1, 1));
    let reported = class_events(&w, "OrphanedDatabases").await?;
    assert_eq!(reported.len(), 1, "{reported:?}");
    let note = reported[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&lost) && note.contains("orphanPolicy Report"),
        "{note}"
    );
    assert!(!note.contains(&live) && !note.contains(&retained), "{note}");
    // Report touches nothing, and the same finding is not announced again.
    databases.scan_orphans().await;
    assert_eq!(class_events(&w, "OrphanedDatabases").await?.len(), 1);
    let (dbs, roles) = w.catalog().await?;
    assert!(dbs.contains(&lost) && roles.contains(&lost));

    // Another AppService loses its finalizer; then the admin opts in to dropping.
    w.apps
        .patch(
            "later",
            &PatchParams::default(),
            &Patch::Merge(&without_finalizer),
        )
        .await?;
    w.apps.delete("later", &DeleteParams::default()).await?;
    w.wait_gone("later", WAIT).await?;
    let classes: Api<DatabaseClass> = Api::all(w.client.clone());
    classes
        .patch(
            &w.class,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"orphanPolicy": "Drop"}})),
        )
        .await?;
    databases.scan_orphans().await;
    // `lost` was found twice and is dropped; `later` only once, and stays for now.
    let (dbs, roles) = w.catalog().await?;
    assert!(
        !dbs.contains(&lost) && !roles.contains(&lost),
        "{dbs:?} {roles:?}"
    );
    assert!(
        dbs.contains(&later) && roles.contains(&later),
        "{dbs:?} {roles:?}"
    );
    assert_eq!(
        metrics.families::<DatabaseMetrics>().dropped_of(&w.class),
        1
    );
    assert_eq!(gauges(&metrics), (1, 1));
    let dropped = class_events(&w, "OrphanDropped").await?;
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(
        dropped[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains(&lost)
    );
    databases.scan_orphans().await;
    let (dbs, roles) = w.catalog().await?;
    assert!(
        !dbs.contains(&later) && !roles.contains(&later),
        "{dbs:?} {roles:?}"
    );
    assert_eq!(
        metrics.families::<DatabaseMetrics>().dropped_of(&w.class),
        2
    );
    assert_eq!(gauges(&metrics), (0, 1));
    // What lives, and what Retain kept, is untouched.
    assert!(
        dbs.contains(&live) && roles.contains(&live),
        "{dbs:?} {roles:?}"
    );
    assert!(roles.contains(&retained), "{roles:?}");
    let login = secret_value(&w.api::<Secret>().get("live-database").await?, "PGPASSWORD");
    w.pg.connect(&live, &login, &live).await?;
    Ok(())
}

/// Another writer removes the finalizer of an AppService whose database is ready: it is
/// back before the delete that would skip the cleanup.
#[tokio::test]
async fn a_finalizer_removed_by_another_writer_comes_back() -> anyhow::Result<()> {
    support::init();
    let w = World::new("Delete", None).await?;
    let (_ctl, _) = w.controller();
    w.create_ready("shop").await?;
    w.apps
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    eventually("finalizer back", Duration::from_secs(20), || async {
        let app = w.apps.get("shop").await?;
        Ok(app
            .finalizers()
            .iter()
            .any(|f| f == FINALIZER)
            .then_some(()))
    })
    .await?;
    Ok(())
}
