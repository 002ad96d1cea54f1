//! The database from the Pod's side. kwok runs no container, so the pod view
//! (`harness::PodView`) stands in for the Pod: it resolves what a Pod of the
//! Deployment gets (its environment with the Secret references resolved, the mounted
//! CA) and runs the real `psql` with only that and an empty HOME, against the harness's
//! real PostgreSQL (TLS on, its own CA), with the real controller at its shipped
//! defaults on a full control plane (so the Pods themselves are admitted under Pod
//! Security `restricted`).
//!
//! * every TLS mode a DatabaseClass offers (`disable`, `require`, `verify-full`) logs
//!   in, through `DATABASE_URL` and through the libpq variables alone; only
//!   `verify-full` gets the CA, and without it (unmounted) the login fails;
//! * a rotated password and a rotated CA roll the Deployment (a new revision on its Pod
//!   template), the new Pods log in, and what the old Pods had is refused;
//! * the pod view itself resolves `envFrom`, `env` and Secret/ConfigMap volumes as a
//!   kubelet would, and fails on a missing key that is not optional.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use common::conditions::READY;
use common::names::{ANNOTATION_DATABASE_REVISION, DATABASE_CA_PATH, DATABASE_CA_VOLUME};
use common::{AppService, AppServiceSpec, DatabaseClass, DatabaseSpec};
use harness::poll::Failure;
use harness::{PodView, Postgres, TestNamespace, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

type Result<T = (), E = Failure> = std::result::Result<T, E>;

const WAIT: Duration = Duration::from_secs(90);
/// What each `psql` asks: who it is, and whether the session is encrypted.
const WHO: &str =
    "SELECT current_user::text || ' ' || ssl::text FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

/// A namespace, a PostgreSQL server, its admin and CA Secrets, and the real controller
/// with the real database step.
struct World {
    ns: TestNamespace,
    client: Client,
    pg: Postgres,
    classes: Vec<String>,
    psql: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    run: Option<JoinHandle<std::result::Result<(), controller::RunError>>>,
}

impl World {
    async fn new() -> Result<World> {
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let psql = harness::pod_view::client_program("psql")?;
        let cp = harness::shared_full().await?;
        let ns = cp.namespace_with_prefix("podview").await?;
        let client = cp.client();
        let pg = Postgres::start().await?;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns.name());
        for (name, data) in [
            (
                "pg-admin",
                json!({"username": harness::postgres::SUPERUSER, "password": pg.password()}),
            ),
            ("pg-ca", json!({"ca.crt": pg.ca_pem()})),
        ] {
            // The admin login opts in to being one (the CA Secret needs no label).
            let labels = if name == "pg-admin" {
                json!({common::database_class::ADMIN_SECRET_LABEL: "true"})
            } else {
                json!({})
            };
            let secret: Secret = serde_json::from_value(
                json!({"metadata": {"name": name, "labels": labels}, "stringData": data}),
            )?;
            secrets.create(&PostParams::default(), &secret).await?;
        }
        // The controller as shipped (resync 10 min, pool 4, timeouts 5 s / 15 s), with the
        // admin Secrets read from the test's namespace.
        let metrics = Arc::new(controller::metrics::Metrics::default());
        let databases = controller::database::Databases::new(
            client.clone(),
            &controller::database::DatabaseConfig {
                admin_namespace: Some(ns.name().to_owned()),
                pool_size: 4,
                connect_timeout: Duration::from_secs(5),
                statement_timeout: Duration::from_secs(15),
                orphan_scan_interval: Duration::from_secs(3600),
            },
            ns.name(),
            metrics.clone(),
        );
        let hooks = controller::Hooks {
            metrics,
            external: Arc::new(databases),
            ..controller::Hooks::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let run = tokio::spawn(controller::run_with(
            controller::Config::for_namespace(ns.name()),
            client.clone(),
            hooks,
            async move {
                let _ = stopped.await;
            },
        ));
        Ok(World {
            ns,
            client,
            pg,
            classes: Vec::new(),
            psql,
            stop: Some(stop),
            run: Some(run),
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), self.ns.name())
    }

    /// A class in TLS `mode` for the server, its CA given whatever the mode (only
    /// `verify-full` needs it: the others must not hand it to the Pods).
    async fn class(&mut self, mode: &str) -> Result<String> {
        let name = format!("{}-{mode}", self.ns.name());
        let class: DatabaseClass = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "DatabaseClass",
            "metadata": {"name": name},
            "spec": {
                // A name, not the address: verify-full checks it against the certificate.
                "host": "localhost",
                "port": self.pg.port(),
                // Plain TCP only with the admin's acknowledgement.
                "tls": {
                    "mode": mode,
                    "ca": {"secretRef": {"name": "pg-ca"}},
                    "insecureAcknowledged": mode == "disable",
                },
                "adminCredentials": {"secretName": "pg-admin"},
            }
        }))?;
        Api::<DatabaseClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await?;
        self.classes.push(name.clone());
        Ok(name)
    }

    async fn create_app(&self, name: &str, class: &str) -> Result {
        let app = AppService::new(
            name,
            AppServiceSpec {
                image: "registry.example.com/shop:v1".into(),
                replicas: Some(1),
                database: Some(DatabaseSpec {
                    class: class.to_owned(),
                }),
                ..AppServiceSpec::default()
            },
        );
        self.api::<AppService>()
            .create(&PostParams::default(), &app)
            .await?;
        Ok(())
    }

    /// Waits until `name` is Ready (its Pods admitted and running, under `restricted`)
    /// with a Deployment whose Pod template carries a database revision other than
    /// `not`, and its Secret settled; returns that Deployment.
    async fn rolled(&self, name: &str, not: Option<&str>) -> Result<Deployment> {
        let apps = self.api::<AppService>();
        let deployments = self.api::<Deployment>();
        let secrets = self.api::<Secret>();
        let what = format!("{name} Ready on a Deployment with a new database revision");
        let deployment = eventually(&what, WAIT, || async {
            let app = apps.get(name).await?;
            let ready = app.status.as_ref().is_some_and(|s| {
                s.observed_generation == app.metadata.generation
                    && common::conditions::is_true(&s.conditions, READY)
            });
            let secret = secrets.get(&format!("{name}-database")).await?;
            let settled = !secret
                .annotations()
                .contains_key(controller::database::PASSWORD_PENDING_ANNOTATION);
            let d = deployments.get(name).await?;
            let rolled = revision(&d).is_some_and(|r| Some(r.as_str()) != not);
            let current = d.status.as_ref().is_some_and(|s| {
                s.observed_generation == d.metadata.generation
                    && s.updated_replicas == Some(1)
                    && s.ready_replicas == Some(1)
            });
            Ok::<_, Failure>((ready && settled && rolled && current).then_some(d))
        })
        .await?;
        Ok(deployment)
    }

    /// `psql` with the pod view's environment only; `args` after the program.
    async fn psql(&self, view: &PodView, args: &[&str]) -> Result<Output> {
        let mut cmd = tokio::process::Command::from(view.command(&self.psql));
        cmd.args(args).kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
            .await
            .map_err(|_| "psql did not finish within 60 s")??;
        Ok(out)
    }

    /// `psql "$DATABASE_URL" -c WHO` as the Pod would run it; its output or its error.
    async fn login(&self, view: &PodView) -> Result<std::result::Result<String, String>> {
        let url = view
            .var("DATABASE_URL")
            .ok_or("the Pod has no DATABASE_URL")?;
        let out = self
            .psql(
                view,
                &[url, "-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", WHO],
            )
            .await?;
        Ok(outcome(&out))
    }

    /// `psql -c WHO` with no connection argument: the libpq variables alone.
    async fn login_by_env(&self, view: &PodView) -> Result<std::result::Result<String, String>> {
        let out = self
            .psql(view, &["-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", WHO])
            .await?;
        Ok(outcome(&out))
    }

    async fn stop(mut self) -> Result {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(run) = self.run.take() {
            tokio::time::timeout(Duration::from_secs(60), run).await???;
        }
        let classes: Api<DatabaseClass> = Api::all(self.client.clone());
        for class in &self.classes {
            let _ = classes.delete(class, &DeleteParams::default()).await;
        }
        Ok(())
    }
}

fn outcome(out: &Output) -> std::result::Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn revision(d: &Deployment) -> Option<String> {
    d.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(ANNOTATION_DATABASE_REVISION)
        .cloned()
}

fn role_of(app: &AppService) -> String {
    controller::database::sql::db_name(&app.uid().unwrap())
}

#[tokio::test]
async fn every_tls_mode_logs_in_with_only_what_the_pod_gets() -> Result {
    let mut w = World::new().await?;
    let modes = ["disable", "require", "verify-full"];
    for mode in modes {
        let class = w.class(mode).await?;
        w.create_app(mode, &class).await?;
    }
    for mode in modes {
        let deployment = w.rolled(mode, None).await?;
        let role = role_of(&w.api::<AppService>().get(mode).await?);
        let mut view = PodView::of(&w.client, &deployment).await?;
        let encrypted = if mode == "disable" { "false" } else { "true" };
        let expected = format!("{role} {encrypted}");
        assert_eq!(w.login(&view).await?, Ok(expected.clone()), "{mode}");
        assert_eq!(w.login_by_env(&view).await?, Ok(expected), "{mode}");
        println!(
            "{mode}: psql \"$DATABASE_URL\" and psql with the libpq variables logged in as {role}"
        );

        let url = view.var("DATABASE_URL").unwrap().to_owned();
        assert!(url.contains(&format!("sslmode={mode}")), "{url}");
        if mode == "verify-full" {
            // The CA the class names, at the path the URL and PGSSLROOTCERT name.
            let ca = view.path(DATABASE_CA_PATH);
            assert_eq!(std::fs::read_to_string(&ca)?, w.pg.ca_pem());
            let ca = ca.display().to_string();
            assert!(url.ends_with(&format!("&sslrootcert={ca}")), "{url}");
            assert_eq!(view.var("PGSSLROOTCERT"), Some(ca.as_str()));
            // The negative control: the same Pod without the mounted CA cannot verify the
            // server, so the login fails (this test can fail).
            view.unmount(DATABASE_CA_VOLUME)?;
            let refused = w.login(&view).await?.expect_err("a login without the CA");
            assert!(refused.contains("root certificate file"), "{refused}");
            println!("verify-full without the mounted CA: refused ({refused})");
        } else {
            // Nothing to verify with, and nothing mounted.
            assert!(!url.contains("sslrootcert"), "{url}");
            assert_eq!(view.var("PGSSLROOTCERT"), None, "{mode}");
            assert!(view.mounts().is_empty(), "{mode}: {:?}", view.mounts());
        }
    }
    w.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_rotated_password_or_ca_rolls_the_pods_onto_what_works() -> Result {
    let mut w = World::new().await?;
    let class = w.class("verify-full").await?;
    w.create_app("shop", &class).await?;
    let first = w.rolled("shop", None).await?;
    let first_revision = revision(&first).unwrap();
    let old = PodView::of(&w.client, &first).await?;
    let role = role_of(&w.api::<AppService>().get("shop").await?);
    assert_eq!(w.login(&old).await?, Ok(format!("{role} true")));

    // A password rotation, as docs/users/databases.md describes it: the Secret deleted, the
    // controller sets a new password on the role and writes it to a new Secret.
    w.api::<Secret>()
        .delete("shop-database", &DeleteParams::default())
        .await?;
    let second = w.rolled("shop", Some(&first_revision)).await?;
    let second_revision = revision(&second).unwrap();
    let new = PodView::of(&w.client, &second).await?;
    assert_ne!(new.var("PGPASSWORD"), old.var("PGPASSWORD"));
    assert_eq!(w.login(&new).await?, Ok(format!("{role} true")));
    let refused = w.login(&old).await?.expect_err("the old password");
    assert!(
        refused.contains("password authentication failed"),
        "{refused}"
    );
    println!(
        "password rotated: the Deployment rolled ({first_revision} -> {second_revision}); new Pods log in, the old password is refused"
    );

    // A CA rotation: the server serves a certificate of a new CA, and the admin puts the
    // new CA in the class's Secret. The CA Secret is not watched: the change reaches the
    // AppService at its next reconcile (the resync, or any event; here an annotation).
    w.pg.rotate_ca().await?;
    w.api::<Secret>()
        .patch(
            "pg-ca",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"ca.crt": w.pg.ca_pem()}})),
        )
        .await?;
    w.api::<AppService>()
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"pod-view-test/poke": "1"}}})),
        )
        .await?;
    let third = w.rolled("shop", Some(&second_revision)).await?;
    let rotated = PodView::of(&w.client, &third).await?;
    assert_eq!(
        std::fs::read_to_string(rotated.path(DATABASE_CA_PATH))?,
        w.pg.ca_pem()
    );
    assert_eq!(rotated.var("PGPASSWORD"), new.var("PGPASSWORD"));
    assert_eq!(w.login(&rotated).await?, Ok(format!("{role} true")));
    let refused = w
        .login(&new)
        .await?
        .expect_err("a login trusting the old CA");
    assert!(refused.contains("certificate verify failed"), "{refused}");
    println!(
        "CA rotated: the Deployment rolled again; new Pods verify the server, the old CA is refused"
    );

    w.stop().await?;
    Ok(())
}

/// The pod view itself, against objects on the API server: what a kubelet would give a
/// container from `envFrom`, `env` (`$(VAR)`, Secret and ConfigMap keys, optional ones
/// missing, `fieldRef`) and Secret and ConfigMap volumes (`items`, modes, `subPath`); a
/// missing key that is not optional fails naming it.
#[tokio::test]
async fn the_pod_view_resolves_env_and_files_as_a_kubelet_would() -> Result {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cp = harness::shared_full().await?;
    let ns = cp.namespace_with_prefix("podview").await?;
    let client = cp.client();
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns.name());
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "settings"},
                "data": {"LEVEL": "debug", "app.conf": "port=1\n"}
            }))?,
        )
        .await?;
    Api::<Secret>::namespaced(client.clone(), ns.name())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "creds"},
                "stringData": {"token": "s3cret", "ca.crt": "PEM"}
            }))?,
        )
        .await?;
    let deployment = |env: serde_json::Value| -> Result<Deployment> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": "viewed", "namespace": ns.name()},
            "spec": {
                "selector": {"matchLabels": {"app": "viewed"}},
                "template": {
                    "metadata": {"labels": {"app": "viewed"}},
                    "spec": {
                        "containers": [{
                            "name": "app", "image": "registry.example.com/x:1",
                            "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                            "env": env,
                            "volumeMounts": [
                                {"name": "certs", "mountPath": "/etc/certs", "readOnly": true},
                                {"name": "conf", "mountPath": "/etc/app/app.conf", "subPath": "app.conf"},
                            ],
                        }],
                        "volumes": [
                            {"name": "certs", "secret": {"secretName": "creds", "defaultMode": 0o440,
                                "items": [{"key": "ca.crt", "path": "root.crt"}]}},
                            {"name": "conf", "configMap": {"name": "settings"}},
                        ],
                    }
                }
            }
        }))?)
    };
    let good = deployment(json!([
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LEVEL"}}},
        {"name": "GREETING", "value": "level $(LEVEL), $$(LEVEL), $(UNSET)"},
        {"name": "ABSENT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "SSLROOTCERT", "value": "/etc/certs/root.crt"},
        {"name": "CFG_LEVEL", "value": "overridden"},
    ]))?;
    let created = Api::<Deployment>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &good)
        .await?;
    let view = PodView::of(&client, &created).await?;
    assert_eq!(view.var("TOKEN"), Some("s3cret"));
    assert_eq!(view.var("LEVEL"), Some("debug"));
    assert_eq!(
        view.var("GREETING"),
        Some("level debug, $(LEVEL), $(UNSET)")
    );
    assert_eq!(view.var("ABSENT"), None);
    assert_eq!(view.var("NS"), Some(ns.name()));
    // envFrom with its prefix (any printable name without `=`), and `env` wins over it.
    assert_eq!(view.var("CFG_app.conf"), Some("port=1\n"));
    assert_eq!(view.var("CFG_LEVEL"), Some("overridden"));
    // Files: only the items, with the volume's mode; a subPath mount is the one file.
    let root_crt = view.path("/etc/certs/root.crt");
    assert_eq!(std::fs::read_to_string(&root_crt)?, "PEM");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&root_crt)?.permissions().mode() & 0o777,
        0o440
    );
    assert!(!view.path("/etc/certs/token").exists());
    assert_eq!(
        std::fs::read_to_string(view.path("/etc/app/app.conf"))?,
        "port=1\n"
    );
    // A path under a mount, rewritten to where the file is; an empty HOME of its own.
    assert_eq!(
        view.var("SSLROOTCERT"),
        Some(root_crt.display().to_string().as_str())
    );
    let home = PathBuf::from(view.var("HOME").unwrap());
    assert!(home.starts_with(view.root()));
    assert_eq!(std::fs::read_dir(&home)?.count(), 0);

    // A key that is not optional and not there: the container could not start.
    let mut missing = good.clone();
    missing.metadata.name = Some("missing".into());
    missing.spec.template.spec.as_mut().unwrap().containers[0]
        .env
        .as_mut()
        .unwrap()
        .push(serde_json::from_value(
            json!({"name": "X", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}),
        )?);
    let err = PodView::of(&client, &missing)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"nope\"") && err.contains("creds") && err.contains("not optional"),
        "{err}"
    );
    ns.cleanup().await?;
    Ok(())
}
