//! Registering a locally running admission webhook server for one test namespace.
//!
//! # How "in effect" is detected
//! The API server learns about webhook configurations through an informer, so a
//! configuration is not used the instant it is created. Each configuration therefore
//! carries, first in its list, a *probe* webhook: it matches only objects labelled
//! [`PROBE_LABEL`] (the real webhooks exclude that label) and points at a closed port
//! with `failurePolicy: Fail`. The harness dry-run creates a labelled AppService until
//! the API server answers "failed calling webhook `<probe>`": from then on the
//! configuration, real webhooks included, is in effect. This neither needs the webhook
//! server to be running yet nor depends on what it answers, and dry-run persists nothing.
//!
//! # The same rules as the chart
//! The rules of both configurations come from the chart's `files/webhook-rules.yaml`,
//! the one definition the chart's template renders too ([`admission_rules`]), so a test
//! exercises exactly the write paths a cluster sends to the webhook (`/scale` included).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};

use crate::ControlPlane;
use crate::crds::FIELD_MANAGER;
use crate::error::{Result, kube as kube_err};

/// Objects with this label only reach the probe webhooks (value `mutating` or
/// `validating`); the real webhooks never see them.
pub const PROBE_LABEL: &str = "appservice-tests.example.com/webhook-probe";

const GROUP: &str = "platform.example.com";
/// The version the probe objects are written in.
const PROBE_VERSION: &str = "v1alpha1";
const RESOURCE: &str = "appservices";
/// The chart's rules of both webhook configurations (see the module docs).
const RULES_FILE: &str = "charts/appservice-operator/files/webhook-rules.yaml";
const RULES_YAML: &str = include_str!("../../charts/appservice-operator/files/webhook-rules.yaml");
/// Nothing listens on port 1 of the loopback address (binding it needs root and no
/// service uses it), so calls to the probe fail at once with "connection refused".
const PROBE_URL: &str = "https://127.0.0.1:1/probe";
const EFFECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The two configurations made by [`ControlPlane::register_webhooks`].
#[derive(Debug, Clone)]
pub struct Webhooks {
    /// Name of the MutatingWebhookConfiguration.
    pub mutating: String,
    /// Name of the ValidatingWebhookConfiguration.
    pub validating: String,
    /// The namespace they apply to.
    pub namespace: String,
}

impl Webhooks {
    /// Deletes both configurations (missing ones are fine).
    pub async fn remove(&self, client: kube::Client) -> Result<()> {
        let dp = DeleteParams::default();
        let m: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let v: Api<ValidatingWebhookConfiguration> = Api::all(client);
        for result in [
            m.delete(&self.mutating, &dp).await.map(|_| ()),
            v.delete(&self.validating, &dp).await.map(|_| ()),
        ] {
            match result {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(kube_err("deleting webhook configurations")(e)),
            }
        }
        Ok(())
    }
}

/// The rules of the chart's webhook configurations: (mutating, validating).
pub fn admission_rules() -> Result<(Vec<RuleWithOperations>, Vec<RuleWithOperations>)> {
    let invalid = |reason: String| crate::Error::WebhookRules {
        path: crate::assets::workspace_root().join(RULES_FILE),
        reason,
    };
    let mut rules: BTreeMap<String, Vec<RuleWithOperations>> =
        serde_saphyr::from_str(RULES_YAML).map_err(|e| invalid(e.to_string()))?;
    let mut take = |kind: &str| {
        rules
            .remove(kind)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| invalid(format!("no {kind} rules")))
    };
    Ok((take("mutating")?, take("validating")?))
}

fn namespace_selector(namespace: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_owned(),
            namespace.to_owned(),
        )])),
        ..LabelSelector::default()
    }
}

fn label_requirement(operator: &str, values: Option<&str>) -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: PROBE_LABEL.to_owned(),
            operator: operator.to_owned(),
            values: values.map(|v| vec![v.to_owned()]),
        }]),
        ..LabelSelector::default()
    }
}

fn client_config(url: String, ca_bundle_pem: &str) -> WebhookClientConfig {
    WebhookClientConfig {
        url: Some(url),
        ca_bundle: Some(ByteString(ca_bundle_pem.as_bytes().to_vec())),
        service: None,
    }
}

impl ControlPlane {
    /// Registers a MutatingWebhookConfiguration (`<base_url>/mutate`,
    /// `reinvocationPolicy: IfNeeded`) and a ValidatingWebhookConfiguration
    /// (`<base_url>/validate`) with the chart's rules ([`admission_rules`]: CREATE and
    /// UPDATE of `appservices.platform.example.com` in both versions, and `/scale` for
    /// validation), only in `namespace`, with `failurePolicy: Fail`, `sideEffects: None`,
    /// `admissionReviewVersions: [v1]` and `caBundle` = `ca_bundle_pem`; names are
    /// `appservice-tests-<namespace>`. Returns once both are in effect (see the module
    /// docs). `base_url` is like `https://127.0.0.1:8443`.
    pub async fn register_webhooks(
        &self,
        namespace: &str,
        base_url: &str,
        ca_bundle_pem: &str,
    ) -> Result<Webhooks> {
        let base = base_url.trim_end_matches('/');
        let (mutating_rules, validating_rules) = admission_rules()?;
        let name = format!("appservice-tests-{namespace}");
        let not_probe = label_requirement("DoesNotExist", None);
        let common_meta = ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(
                crate::namespace::TEST_NAMESPACE_LABEL.to_owned(),
                namespace.to_owned(),
            )])),
            ..ObjectMeta::default()
        };
        let mutating = MutatingWebhookConfiguration {
            metadata: common_meta.clone(),
            webhooks: Some(vec![
                MutatingWebhook {
                    name: "probe.mutating.appservice-tests.example.com".to_owned(),
                    client_config: client_config(PROBE_URL.to_owned(), ca_bundle_pem),
                    rules: Some(mutating_rules.clone()),
                    namespace_selector: Some(namespace_selector(namespace)),
                    object_selector: Some(label_requirement("In", Some("mutating"))),
                    failure_policy: Some("Fail".to_owned()),
                    side_effects: "None".to_owned(),
                    admission_review_versions: vec!["v1".to_owned()],
                    timeout_seconds: Some(1),
                    ..MutatingWebhook::default()
                },
                MutatingWebhook {
                    name: "mutate.appservices.platform.example.com".to_owned(),
                    client_config: client_config(format!("{base}/mutate"), ca_bundle_pem),
                    rules: Some(mutating_rules),
                    namespace_selector: Some(namespace_selector(namespace)),
                    object_selector: Some(not_probe.clone()),
                    failure_policy: Some("Fail".to_owned()),
                    side_effects: "None".to_owned(),
                    admission_review_versions: vec!["v1".to_owned()],
                    reinvocation_policy: Some("IfNeeded".to_owned()),
                    timeout_seconds: Some(10),
                    ..MutatingWebhook::default()
                },
            ]),
        };
        let validating = ValidatingWebhookConfiguration {
            metadata: common_meta,
            webhooks: Some(vec![
                ValidatingWebhook {
                    name: "probe.validating.appservice-tests.example.com".to_owned(),
                    client_config: client_config(PROBE_URL.to_owned(), ca_bundle_pem),
                    rules: Some(validating_rules.clone()),
                    namespace_selector: Some(namespace_selector(namespace)),
                    object_selector: Some(label_requirement("In", Some("validating"))),
                    failure_policy: Some("Fail".to_owned()),
                    side_effects: "None".to_owned(),
                    admission_review_versions: vec!["v1".to_owned()],
                    timeout_seconds: Some(1),
                    ..ValidatingWebhook::default()
                },
                ValidatingWebhook {
                    name: "validate.appservices.platform.example.com".to_owned(),
                    client_config: client_config(format!("{base}/validate"), ca_bundle_pem),
                    rules: Some(validating_rules),
                    namespace_selector: Some(namespace_selector(namespace)),
                    object_selector: Some(not_probe),
                    failure_policy: Some("Fail".to_owned()),
                    side_effects: "None".to_owned(),
                    admission_review_versions: vec!["v1".to_owned()],
                    timeout_seconds: Some(10),
                    ..ValidatingWebhook::default()
                },
            ]),
        };

        let client = self.try_client()?;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(&name, &params, &Patch::Apply(&mutating))
            .await
            .map_err(kube_err(format!(
                "applying MutatingWebhookConfiguration {name}"
            )))?;
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .patch(&name, &params, &Patch::Apply(&validating))
            .await
            .map_err(kube_err(format!(
                "applying ValidatingWebhookConfiguration {name}"
            )))?;

        for kind in ["mutating", "validating"] {
            self.wait_probe(&client, namespace, kind).await?;
        }
        Ok(Webhooks {
            mutating: name.clone(),
            validating: name,
            namespace: namespace.to_owned(),
        })
    }

    async fn wait_probe(&self, client: &kube::Client, namespace: &str, kind: &str) -> Result<()> {
        let gvk = GroupVersionKind::gvk(GROUP, PROBE_VERSION, "AppService");
        let resource = ApiResource::from_gvk_with_plural(&gvk, RESOURCE);
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
        let mut probe = DynamicObject::new("webhook-probe", &resource);
        probe.metadata.labels = Some(BTreeMap::from([(PROBE_LABEL.to_owned(), kind.to_owned())]));
        probe.data = serde_json::json!({ "spec": { "image": "example.com/probe:v1" } });
        let params = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        let probe_name = format!("probe.{kind}.appservice-tests.example.com");
        crate::eventually(
            &format!("the {kind} webhook configuration to take effect in {namespace}"),
            EFFECT_TIMEOUT,
            || async {
                match api.create(&params, &probe).await {
                    Err(kube::Error::Api(status)) if status.message.contains(&probe_name) => {
                        Ok(Some(()))
                    }
                    Err(e) => Err(e.into()),
                    Ok(_) => Err("the dry-run create was not intercepted yet".into()),
                }
            },
        )
        .await
    }
}
