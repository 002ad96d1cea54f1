//! The configurations whose caBundle the runtime CA keeps current: the mutating and
//! validating webhook configurations and the CRD's conversion webhook, each named on the
//! command line (`mutating/NAME`, `validating/NAME`, `crd/NAME`).
//!
//! Only `caBundle` is ever written, by a patch that names each webhook entry and carries
//! the object's resourceVersion (a concurrent change makes it fail with 409 and the next
//! pass starts over); rules, selectors and everything else stay as the chart wrote them.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::CaError;

/// Field manager of the caBundle patches.
pub const FIELD_MANAGER: &str = "appservice-webhook";

/// Which kind of object a target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mutating,
    Validating,
    Crd,
}

/// One configuration to keep current.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    pub name: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::Mutating => "mutating",
            Kind::Validating => "validating",
            Kind::Crd => "crd",
        };
        write!(f, "{kind}/{}", self.name)
    }
}

impl std::str::FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| format!("{s:?}: expected mutating/NAME, validating/NAME or crd/NAME"))?;
        let kind = match kind {
            "mutating" => Kind::Mutating,
            "validating" => Kind::Validating,
            "crd" => Kind::Crd,
            other => {
                return Err(format!(
                    "{s:?}: unknown kind {other:?} (mutating, validating or crd)"
                ));
            }
        };
        if name.is_empty() || name.contains('/') {
            return Err(format!("{s:?}: invalid name"));
        }
        Ok(Target {
            kind,
            name: name.to_owned(),
        })
    }
}

/// A target as read: its resourceVersion and the caBundle of each webhook entry (by
/// entry name; the CRD has one unnamed entry when its conversion is a webhook).
#[derive(Clone, Debug, Default)]
pub struct Observed {
    pub resource_version: Option<String>,
    pub entries: Vec<(Option<String>, Vec<u8>)>,
}

fn bundle(config: &WebhookClientConfig) -> Vec<u8> {
    config
        .ca_bundle
        .as_ref()
        .map(|b| b.0.clone())
        .unwrap_or_default()
}

fn kube_error<'a>(
    target: &'a Target,
    what: &'static str,
) -> impl FnOnce(kube::Error) -> CaError + 'a {
    move |error| CaError::Kube {
        what: format!("{what} {target}"),
        error,
    }
}

/// Reads a target. `None`: it does not exist, or (a CRD) converts without a webhook:
/// nothing to keep current there.
pub async fn read(client: &kube::Client, target: &Target) -> Result<Option<Observed>, CaError> {
    match target.kind {
        Kind::Mutating => {
            let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
            let Some(obj) = api
                .get_opt(&target.name)
                .await
                .map_err(kube_error(target, "reading"))?
            else {
                return Ok(None);
            };
            Ok(Some(Observed {
                resource_version: obj.metadata.resource_version,
                entries: obj
                    .webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| (Some(w.name), bundle(&w.client_config)))
                    .collect(),
            }))
        }
        Kind::Validating => {
            let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
            let Some(obj) = api
                .get_opt(&target.name)
                .await
                .map_err(kube_error(target, "reading"))?
            else {
                return Ok(None);
            };
            Ok(Some(Observed {
                resource_version: obj.metadata.resource_version,
                entries: obj
                    .webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| (Some(w.name), bundle(&w.client_config)))
                    .collect(),
            }))
        }
        Kind::Crd => {
            let api: Api<CustomResourceDefinition> = Api::all(client.clone());
            let Some(obj) = api
                .get_opt(&target.name)
                .await
                .map_err(kube_error(target, "reading"))?
            else {
                return Ok(None);
            };
            let conversion = obj.spec.conversion.as_ref();
            let webhook = conversion
                .filter(|c| c.strategy == "Webhook")
                .and_then(|c| c.webhook.as_ref())
                .and_then(|w| w.client_config.as_ref());
            let Some(config) = webhook else {
                return Ok(None);
            };
            let bundle = config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.clone())
                .unwrap_or_default();
            Ok(Some(Observed {
                resource_version: obj.metadata.resource_version,
                entries: vec![(None, bundle)],
            }))
        }
    }
}

/// Writes `bundle` into every entry of `target` (as observed).
pub async fn write(
    client: &kube::Client,
    target: &Target,
    observed: &Observed,
    bundle_pem: &str,
) -> Result<(), CaError> {
    // ByteString serializes as base64, as the API expects caBundle.
    let encoded = serde_json::to_value(k8s_openapi::ByteString(bundle_pem.as_bytes().to_vec()))
        .map_err(|e| CaError::Encode(e.to_string()))?;
    let metadata = json!({"resourceVersion": observed.resource_version});
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match target.kind {
        Kind::Mutating | Kind::Validating => {
            // Strategic merge: `webhooks` merges by name, so only caBundle changes.
            let webhooks: Vec<_> = observed
                .entries
                .iter()
                .filter_map(|(name, _)| name.as_ref())
                .map(|name| json!({"name": name, "clientConfig": {"caBundle": encoded}}))
                .collect();
            let patch = json!({"metadata": metadata, "webhooks": webhooks});
            if target.kind == Kind::Mutating {
                let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
                api.patch(&target.name, &params, &Patch::Strategic(&patch))
                    .await
                    .map_err(kube_error(target, "writing the caBundle of"))?;
            } else {
                let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
                api.patch(&target.name, &params, &Patch::Strategic(&patch))
                    .await
                    .map_err(kube_error(target, "writing the caBundle of"))?;
            }
        }
        Kind::Crd => {
            let patch = json!({
                "metadata": metadata,
                "spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": encoded}}}},
            });
            let api: Api<CustomResourceDefinition> = Api::all(client.clone());
            api.patch(&target.name, &params, &Patch::Merge(&patch))
                .await
                .map_err(kube_error(target, "writing the caBundle of"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print() {
        for text in [
            "mutating/aso-webhook",
            "validating/aso-webhook",
            "crd/appservices.platform.example.com",
        ] {
            let target: Target = text.parse().unwrap();
            assert_eq!(target.to_string(), text);
        }
        for bad in ["aso-webhook", "pods/x", "crd/", "crd/a/b"] {
            assert!(bad.parse::<Target>().is_err(), "{bad}");
        }
    }
}
