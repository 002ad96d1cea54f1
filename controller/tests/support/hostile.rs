//! A controller verifying images against a [`HostileRegistry`], as `images.rs` runs one
//! against a real registry: in process, at the shipped defaults (`ImageConfig::defaults()`:
//! registry timeout 10 s, resolve interval 1 min), trusting the hostile registry's CA,
//! with one `Enforce` policy (an inline key made for the run) over every image of that
//! registry, selecting only the test's namespace.

use std::time::Duration;

use common::conditions::IMAGE_VERIFIED;
use common::image_policy::ImagePolicy;
use controller::images::ImageConfig;
use harness::{HostileRegistry, KeyPair};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::{Fixture, Running, condition, create};

/// What a first verdict needs.
pub const FIRST: Duration = Duration::from_secs(60);

pub struct Hostile {
    pub f: Fixture,
    pub ctl: Running,
    pub registry: HostileRegistry,
    policies: Api<ImagePolicy>,
    policy: String,
}

impl Hostile {
    /// The registry, the namespace, the controller, and the policy in force (observed
    /// by the controller, so every AppService created after is judged by it and none
    /// runs unverified first).
    pub async fn start() -> anyhow::Result<Hostile> {
        let registry = HostileRegistry::start().await?;
        let f = Fixture::setup().without_controller().await?;
        let images = ImageConfig {
            registry_ca_file: Some(registry.ca_file()),
            ..ImageConfig::defaults()
        };
        let (ctl, _) = super::verifying(&f, images)?;

        let key = KeyPair::generate().await?;
        let policy = format!("{}-hostile", f.ns.name());
        let policies: Api<ImagePolicy> = Api::all(f.client.clone());
        let spec: ImagePolicy = serde_json::from_value(json!({
            "apiVersion": "platform.example.com/v1alpha1", "kind": "ImagePolicy",
            "metadata": {"name": policy},
            "spec": {
                "images": [{"glob": format!("{}/**", registry.host())}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.ns.name()}},
                "mode": "Enforce",
                "keys": [{"name": "release", "publicKey": key.public_pem()}],
            }
        }))?;
        policies.create(&PostParams::default(), &spec).await?;
        harness::eventually(
            &format!("{policy} observed by the controller"),
            FIRST,
            || async {
                let p = policies.get(&policy).await?;
                let observed = p.status.as_ref().and_then(|s| s.observed_generation);
                Ok((observed.is_some() && observed == p.metadata.generation).then_some(()))
            },
        )
        .await?;
        Ok(Hostile {
            f,
            ctl,
            registry,
            policies,
            policy,
        })
    }

    /// An AppService of one replica running `image`.
    pub async fn app(&self, name: &str, image: &str) -> anyhow::Result<()> {
        create(
            &self.f.apps,
            &common::testing::app(name, image).replicas(1).build(),
        )
        .await?;
        Ok(())
    }

    /// Waits for `ImageVerified` with `status` and `reason` and returns its message; a
    /// timeout says what the condition was at the last look.
    pub async fn verdict(
        &self,
        name: &str,
        status: &str,
        reason: &str,
        bound: Duration,
    ) -> anyhow::Result<String> {
        Ok(harness::eventually(
            &format!("{name}: ImageVerified={status} {reason}"),
            bound,
            || async {
                let app = self.f.apps.get(name).await?;
                match condition(&app, IMAGE_VERIFIED) {
                    Some((s, r, message)) if s == status && r == reason => Ok(Some(message)),
                    seen => Err(format!("ImageVerified is {seen:?}").into()),
                }
            },
        )
        .await?)
    }

    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self
            .policies
            .delete(&self.policy, &DeleteParams::default())
            .await;
        self.ctl.stop().await
    }
}
