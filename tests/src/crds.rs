//! Installing the project's CRDs from `charts/appservice-operator/crds/` and waiting
//! until the API server serves them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};

use crate::ControlPlane;
use crate::error::{Error, Result, kube as kube_err};

/// Field manager of the harness's server-side applies.
pub const FIELD_MANAGER: &str = "appservice-tests";

const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// `charts/appservice-operator/crds` in this workspace.
pub fn crd_dir() -> PathBuf {
    crate::assets::workspace_root().join("charts/appservice-operator/crds")
}

/// The generated AppService CRD (both versions), which the chart renders with its
/// conversion webhook; the harness installs it without one (see [`ControlPlane::use_conversion_webhook`]).
pub fn appservice_crd_path() -> PathBuf {
    crate::assets::workspace_root().join(common::crd::CRD_PATH)
}

/// Reads one CRD from a YAML file.
pub fn load_crd(path: &Path) -> Result<CustomResourceDefinition> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Crd {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    serde_saphyr::from_str(&text).map_err(|e| Error::Crd {
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

/// Reads every `*.yaml` CRD of [`crd_dir`], sorted by file name, and, when `dir` is
/// [`crd_dir`], the AppService CRD of [`appservice_crd_path`].
pub fn load_crds(dir: &Path) -> Result<Vec<CustomResourceDefinition>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Crd {
        path: dir.to_owned(),
        reason: e.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    if dir == crd_dir() {
        files.insert(0, appservice_crd_path());
    }
    if files.is_empty() {
        return Err(Error::Crd {
            path: dir.to_owned(),
            reason: "no *.yaml files (run `cargo xtask crd`)".to_owned(),
        });
    }
    files.iter().map(|path| load_crd(path)).collect()
}

impl ControlPlane {
    /// Server-side applies the CRDs of [`crd_dir`] (idempotent) and waits until each is
    /// `Established` and a list call on each served version succeeds.
    ///
    /// Without a conversion webhook the API server converts AppServices between versions
    /// by relabelling them: tests that read or write only one version are unaffected;
    /// tests that mix versions call [`ControlPlane::use_conversion_webhook`] first.
    pub async fn install_crds(&self) -> Result<()> {
        let crds = load_crds(&crd_dir())?;
        let client = self.try_client()?;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for crd in &crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(crd))
                .await
                .map_err(kube_err(format!(
                    "installing CRD {name} (if the API server rejected it, the message says why)"
                )))?;
        }
        for crd in &crds {
            wait_served(&api, crd).await?;
        }
        Ok(())
    }

    /// Server-side applies one CRD as the harness's field manager (an upgrade: fields
    /// the new one no longer names are removed) and waits until every served version
    /// is listed.
    pub async fn apply_crd(&self, crd: &CustomResourceDefinition) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.try_client()?);
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .map_err(kube_err(format!("applying CRD {name}")))?;
        wait_served(&api, crd).await
    }

    /// Deletes the CRD of the same name (and with it every object of it), waits until
    /// it is gone, then installs `crd`: a control plane that starts from an older
    /// release's CRD.
    pub async fn replace_crd(&self, crd: &CustomResourceDefinition) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.try_client()?);
        let name = crd.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(kube_err(format!("deleting CRD {name}"))(e)),
        }
        crate::eventually(
            &format!("CRD {name} to be deleted"),
            CRD_TIMEOUT,
            || async { Ok(api.get_opt(&name).await?.is_none().then_some(())) },
        )
        .await?;
        self.apply_crd(crd).await
    }

    /// Points the AppService CRD's conversion at a webhook server (`<base_url>/convert`,
    /// trusted through `ca_bundle_pem`), and returns once the API server uses it: a
    /// v1alpha1 dry-run create in `namespace` comes back with its `port`, which only a
    /// real conversion to the stored v1beta1 and back keeps.
    pub async fn use_conversion_webhook(
        &self,
        base_url: &str,
        ca_bundle_pem: &str,
        namespace: &str,
    ) -> Result<()> {
        let client = self.try_client()?;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        // A merge patch: an apply by the manager that installed the CRD would drop the
        // fields it no longer names.
        let patch = serde_json::json!({
            "spec": {"conversion": {
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {
                        "url": format!("{base_url}/convert"),
                        "caBundle": k8s_openapi::ByteString(ca_bundle_pem.as_bytes().to_vec()),
                    }
                }
            }}
        });
        api.patch(
            common::names::CRD_NAME,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(kube_err("setting the AppService conversion webhook"))?;
        let gvk = GroupVersionKind::gvk(common::names::GROUP, "v1alpha1", "AppService");
        let resource = ApiResource::from_gvk_with_plural(&gvk, "appservices");
        let objects: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource);
        let probe: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "platform.example.com/v1alpha1",
            "kind": "AppService",
            "metadata": {"name": "conversion-probe"},
            "spec": {"image": "registry.example.com/probe:v1", "port": 4321}
        }))
        .map_err(|e| Error::Crd {
            path: appservice_crd_path(),
            reason: e.to_string(),
        })?;
        let params = kube::api::PostParams {
            dry_run: true,
            ..Default::default()
        };
        crate::eventually(
            "the AppService conversion webhook to be in effect",
            CRD_TIMEOUT,
            || async {
                let created = objects.create(&params, &probe).await?;
                Ok(
                    (created.data.pointer("/spec/port") == Some(&serde_json::json!(4321)))
                        .then_some(()),
                )
            },
        )
        .await
    }
}

/// Waits until the CRD is `Established` and a list call on each of its served versions
/// succeeds.
pub(crate) async fn wait_served(
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
) -> Result<()> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let client = api.clone().into_client();
    crate::eventually(
        &format!("CRD {name} to be established and served"),
        CRD_TIMEOUT,
        || async {
            let established = api.get(&name).await?.status.and_then(|s| s.conditions);
            if !established.is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            }) {
                return Ok(None);
            }
            for version in crd.spec.versions.iter().filter(|v| v.served) {
                let gvk =
                    GroupVersionKind::gvk(&crd.spec.group, &version.name, &crd.spec.names.kind);
                let resource = ApiResource::from_gvk_with_plural(&gvk, &crd.spec.names.plural);
                let objects: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                objects.list(&ListParams::default().limit(1)).await?;
            }
            Ok(Some(()))
        },
    )
    .await
}
