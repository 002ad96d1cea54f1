//! Configuration from ConfigMaps and Secrets (`spec.config`, and the keys `env` takes from
//! them) on a full control plane, with the controller at its shipped defaults: the Pod
//! template reads them as variables and files, a change of their data rolls the Pods
//! once (a change of their metadata does not), a missing one holds the children and says
//! which, an optional one may be absent, and a burst of edits costs at most one rollout
//! each. That the application in the Pod reads them, and that a change reaches it with no
//! request failing, is in `real_pods.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use common::conditions::{READY, TRUE, reasons};
use common::names::ANNOTATION_CONFIG_REVISION;
use common::{AppServiceSpec, ConfigSource, EnvVar};
use harness::eventually;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapKeySelector, EnvVarSource, Secret, SecretKeySelector,
};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::world::World;
use support::{Fixture, condition};

const IMAGE: &str = "registry.example.com/web:v1";
/// Until Ready, which also waits for the Deployment controller and kwok's Pods.
const READY_BOUND: Duration = Duration::from_secs(60);

async fn world() -> anyhow::Result<World> {
    World::start(Fixture::setup().full()).await
}

fn map(name: &str, mount_path: Option<&str>) -> ConfigSource {
    ConfigSource {
        config_map: Some(name.into()),
        mount_path: mount_path.map(Into::into),
        ..ConfigSource::default()
    }
}

fn secret(name: &str, mount_path: Option<&str>) -> ConfigSource {
    ConfigSource {
        secret: Some(name.into()),
        mount_path: mount_path.map(Into::into),
        ..ConfigSource::default()
    }
}

fn spec(config: Vec<ConfigSource>) -> AppServiceSpec {
    AppServiceSpec {
        image: IMAGE.to_owned(),
        replicas: Some(2),
        config,
        ..AppServiceSpec::default()
    }
}

async fn put_map(w: &World, name: &str, data: &[(&str, &str)]) -> anyhow::Result<()> {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name},
        "data": data.iter().copied().collect::<BTreeMap<_, _>>(),
    }))?;
    w.api::<ConfigMap>()
        .patch(
            name,
            &PatchParams::apply("config-test").force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

async fn put_secret(w: &World, name: &str, data: &[(&str, &str)]) -> anyhow::Result<()> {
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    };
    let secrets: Api<Secret> = w.api();
    match secrets.get_opt(name).await? {
        None => {
            secrets.create(&PostParams::default(), &s).await?;
        }
        Some(_) => {
            secrets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"data": s.data})),
                )
                .await?;
        }
    }
    Ok(())
}

/// The Deployment's config revision and generation, once `name` is Ready for its
/// generation and the Deployment controller has seen the Deployment's.
async fn ready(w: &World, name: &str) -> anyhow::Result<(Option<String>, i64)> {
    Ok(eventually(&format!("{name} Ready"), READY_BOUND, || async {
        let a = w.apps.get(name).await?;
        let ok = a.status.as_ref().and_then(|s| s.observed_generation) == a.metadata.generation
            && condition(&a, READY).is_some_and(|(s, _, _)| s == TRUE);
        let d = w.deployments.get_opt(name).await?;
        let d = d.filter(|d| {
            d.status.as_ref().and_then(|s| s.observed_generation) == d.metadata.generation
        });
        Ok(d.filter(|_| ok)
            .map(|d| (revision(&d), d.metadata.generation.unwrap_or(0))))
    })
    .await?)
}

fn revision(d: &Deployment) -> Option<String> {
    d.spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(ANNOTATION_CONFIG_REVISION).cloned())
}

/// Waits until the Deployment's config revision is not `old`, and `name` is Ready again.
async fn rolled(
    w: &World,
    name: &str,
    old: &Option<String>,
) -> anyhow::Result<(Option<String>, i64)> {
    eventually("a new config revision", READY_BOUND, || async {
        let d = w.deployments.get(name).await?;
        Ok((revision(&d) != *old).then_some(()))
    })
    .await?;
    ready(w, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_the_data_rolls_the_pods_once_and_a_change_of_metadata_does_not()
-> anyhow::Result<()> {
    let w = world().await?;
    put_map(&w, "settings", &[("CFG_GREETING", "hello")]).await?;
    put_secret(&w, "keys", &[("token", "s1")]).await?;
    w.create(
        "web",
        spec(vec![
            map("settings", None),
            secret("keys", Some("/etc/keys")),
        ]),
    )
    .await?;
    let (first, generation) = ready(&w, "web").await?;
    assert!(first.is_some(), "the template carries the revision");

    // What the Pods get: the ConfigMap as variables, the Secret as read-only files.
    let d = w.deployments.get("web").await?;
    let pod = d.spec.template.spec.as_ref().unwrap();
    let container = &pod.containers[0];
    let env_from = container.env_from.clone().unwrap_or_default();
    assert_eq!(env_from.len(), 1);
    assert_eq!(
        env_from[0].config_map_ref.as_ref().unwrap().name,
        "settings"
    );
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "appsvc-config-1")
        .expect("the Secret's volume");
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some("keys")
    );
    let mount = container
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "appsvc-config-1")
        .expect("its mount");
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        ("/etc/keys", Some(true))
    );
    w.quiet(2).await?;

    // A label on the ConfigMap, then a change of its data: the label's event comes first
    // on the same watch, so when the data's rollout is seen the label's pass is done.
    // Exactly one rollout: the data's.
    let deployments_before = w
        .ctl
        .metrics
        .writes_to(controller::metrics::Written::Deployments);
    w.api::<ConfigMap>()
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"reviewed": "yes"}}})),
        )
        .await?;
    put_map(&w, "settings", &[("CFG_GREETING", "bonjour")]).await?;
    let (second, after) = rolled(&w, "web", &first).await?;
    assert_eq!(after, generation + 1, "one new generation: one rollout");
    assert_eq!(
        w.ctl
            .metrics
            .writes_to(controller::metrics::Written::Deployments),
        deployments_before + 1,
        "one Deployment write"
    );

    // The Secret's data: another revision.
    put_secret(&w, "keys", &[("token", "s2")]).await?;
    let (third, _) = rolled(&w, "web", &second).await?;
    assert_ne!(third, first);
    w.quiet(3).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_source_holds_the_children_and_status_names_it() -> anyhow::Result<()> {
    let w = world().await?;
    w.create(
        "web",
        spec(vec![
            map("settings", None),
            secret("keys", Some("/etc/keys")),
        ]),
    )
    .await?;
    let app = eventually("ConfigSourceMissing", READY_BOUND, || async {
        let a = w.apps.get("web").await?;
        let hit = condition(&a, READY)
            .is_some_and(|(s, r, _)| s != TRUE && r == reasons::CONFIG_SOURCE_MISSING);
        Ok(hit.then_some(a))
    })
    .await?;
    let (_, _, message) = condition(&app, READY).unwrap();
    assert!(
        message.contains("ConfigMap settings and Secret keys do not exist"),
        "{message}"
    );
    assert!(
        w.deployments.get_opt("web").await?.is_none(),
        "no Pods that could not start"
    );
    assert!(w.services.get_opt("web").await?.is_none());

    // Created: the AppService goes on by itself (their events wake it).
    put_map(&w, "settings", &[("CFG_GREETING", "hello")]).await?;
    put_secret(&w, "keys", &[("token", "s1")]).await?;
    let (revision, generation) = ready(&w, "web").await?;

    // Deleted while the Pods run: status says so, the Deployment stays as it is.
    w.api::<ConfigMap>()
        .delete("settings", &DeleteParams::default())
        .await?;
    eventually("ConfigSourceMissing again", READY_BOUND, || async {
        let a = w.apps.get("web").await?;
        let hit = condition(&a, READY).is_some_and(|(_, r, m)| {
            r == reasons::CONFIG_SOURCE_MISSING && m.contains("ConfigMap settings does not exist")
        });
        Ok(hit.then_some(()))
    })
    .await?;
    let d = w.deployments.get("web").await?;
    assert_eq!(d.metadata.generation, Some(generation));
    // Back with the same data: the same revision, no rollout.
    put_map(&w, "settings", &[("CFG_GREETING", "hello")]).await?;
    assert_eq!(ready(&w, "web").await?, (revision, generation));
    w.quiet(2).await?;
    Ok(())
}

fn from_secret(var: &str, name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: var.into(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: name.into(),
                key: key.into(),
                optional: None,
            }),
            ..EnvVarSource::default()
        }),
    }
}

fn from_optional_map(var: &str, name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: var.into(),
        value: None,
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: name.into(),
                key: key.into(),
                optional: Some(true),
            }),
            ..EnvVarSource::default()
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_env_takes_from_a_secret_roll_it_and_an_optional_source_may_be_absent()
-> anyhow::Result<()> {
    let w = world().await?;
    put_secret(&w, "db", &[("password", "p1")]).await?;
    let mut with_env = spec(vec![]);
    with_env.env = vec![
        from_secret("DB_PASSWORD", "db", "password"),
        from_optional_map("FEATURES", "features", "flags"),
    ];
    w.create("web", with_env).await?;
    // The optional ConfigMap is absent: no holding back.
    let (first, _) = ready(&w, "web").await?;
    assert!(first.is_some());

    put_secret(&w, "db", &[("password", "p2")]).await?;
    let (second, _) = rolled(&w, "web", &first).await?;
    // The optional one appears: the Pods must start again to read it.
    put_map(&w, "features", &[("flags", "fast")]).await?;
    let (third, _) = rolled(&w, "web", &second).await?;
    assert_ne!(third, first);
    w.quiet(2).await?;
    Ok(())
}

/// Twenty edits as fast as the API server takes them: the controller ends on the last
/// data, with at most one rollout per edit (the work queue merges the events of one
/// AppService, and each pass reads the data once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_edits_costs_at_most_one_rollout_each_and_ends_on_the_last() -> anyhow::Result<()>
{
    const EDITS: u64 = 20;
    let w = world().await?;
    put_map(&w, "settings", &[("CFG_N", "0")]).await?;
    w.create("web", spec(vec![map("settings", None)])).await?;
    let (first, generation) = ready(&w, "web").await?;
    w.quiet(1).await?;
    let before = w
        .ctl
        .metrics
        .writes_to(controller::metrics::Written::Deployments);
    for i in 1..=EDITS {
        put_map(&w, "settings", &[("CFG_N", &i.to_string())]).await?;
    }
    let (last, after) = rolled(&w, "web", &first).await?;
    w.quiet(2).await?;
    let writes = w
        .ctl
        .metrics
        .writes_to(controller::metrics::Written::Deployments)
        - before;
    let rollouts = u64::try_from(after - generation)?;
    println!("{EDITS} edits: {writes} Deployment writes, {rollouts} rollouts");
    assert!((1..=EDITS).contains(&writes), "{writes} writes");
    assert!((1..=EDITS).contains(&rollouts), "{rollouts} rollouts");
    // It ended on the last data: the ConfigMap deleted and made again with that data
    // (read afresh, no digest kept) is the same revision, and nothing rolls.
    w.api::<ConfigMap>()
        .delete("settings", &DeleteParams::default())
        .await?;
    eventually("ConfigSourceMissing", READY_BOUND, || async {
        let a = w.apps.get("web").await?;
        let hit = condition(&a, READY).is_some_and(|(_, r, _)| r == reasons::CONFIG_SOURCE_MISSING);
        Ok(hit.then_some(()))
    })
    .await?;
    put_map(&w, "settings", &[("CFG_N", &EDITS.to_string())]).await?;
    assert_eq!(ready(&w, "web").await?, (last, after));
    Ok(())
}
