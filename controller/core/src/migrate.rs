//! Storage migration: rewrites every AppService in the storage version (`v1beta1`), then
//! records in the CRD's `status.storedVersions` that nothing is stored in `v1alpha1` any
//! more, so a later release can stop serving it.
//!
//! Each object is read and written back unchanged (an update with its resourceVersion):
//! the API server re-encodes it in the storage version, and skips the write when the
//! stored bytes would not change, so a second run rewrites nothing that is migrated. A
//! conflict (the controller or a user wrote in between) is retried with a fresh read;
//! an object deleted meanwhile is done. `storedVersions` is narrowed only when every
//! object was rewritten, and only to the version the CRD stores.

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;

use common::crd::STORAGE_VERSION;
use common::names::{CRD_NAME, GROUP};

/// Field manager of the migration's writes.
pub const FIELD_MANAGER: &str = "appservice-storage-migration";
/// Attempts per object before a run gives up on it (each after a fresh read).
const ATTEMPTS: usize = 10;
/// Objects listed per page.
const PAGE: u32 = 200;

/// What a run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Objects written back in the storage version.
    pub rewritten: usize,
    /// Objects deleted between the list and their rewrite.
    pub gone: usize,
    /// Conflicts retried.
    pub conflicts: usize,
    /// `status.storedVersions` after the run.
    pub stored_versions: Vec<String>,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading the CRD {CRD_NAME}: {0}")]
    Crd(kube::Error),
    #[error(
        "the CRD {CRD_NAME} stores {found:?}, not {STORAGE_VERSION}: install the new CRD (and the webhook serving /convert) first"
    )]
    WrongStorageVersion { found: Option<String> },
    #[error("listing AppServices: {0}")]
    List(kube::Error),
    #[error("rewriting AppService {namespace}/{name}: {error}")]
    Rewrite {
        namespace: String,
        name: String,
        error: kube::Error,
    },
    #[error("updating status.storedVersions of {CRD_NAME}: {0}")]
    StoredVersions(kube::Error),
}

/// Migrates every AppService to the storage version, then narrows `storedVersions`.
pub async fn run(client: Client) -> Result<Report, Error> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds.get(CRD_NAME).await.map_err(Error::Crd)?;
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .map(|v| v.name.clone());
    if storage.as_deref() != Some(STORAGE_VERSION) {
        return Err(Error::WrongStorageVersion { found: storage });
    }

    let gvk = GroupVersionKind::gvk(GROUP, STORAGE_VERSION, "AppService");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "appservices");
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut report = Report::default();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = all.list(&params).await.map_err(Error::List)?;
        for object in page.items {
            let (Some(namespace), Some(name)) = (
                object.metadata.namespace.clone(),
                object.metadata.name.clone(),
            ) else {
                continue;
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &resource);
            rewrite(&api, object, &mut report)
                .await
                .map_err(|error| Error::Rewrite {
                    namespace,
                    name,
                    error,
                })?;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => break,
        }
    }

    // Every object that existed is now stored in STORAGE_VERSION, and every object
    // written since the CRD changed was stored in it directly.
    let patch = serde_json::json!({"status": {"storedVersions": [STORAGE_VERSION]}});
    let crd = crds
        .patch_status(CRD_NAME, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::StoredVersions)?;
    report.stored_versions = crd
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default();
    Ok(report)
}

/// Writes `object` back unchanged; on a conflict, reads it again and retries.
async fn rewrite(
    api: &Api<DynamicObject>,
    mut object: DynamicObject,
    report: &mut Report,
) -> Result<(), kube::Error> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    for attempt in 1..=ATTEMPTS {
        match api.replace(&name, &params, &object).await {
            Ok(_) => {
                report.rewritten += 1;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                report.gone += 1;
                return Ok(());
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => {
                report.conflicts += 1;
                tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
                match api.get_opt(&name).await? {
                    Some(fresh) => object = fresh,
                    None => {
                        report.gone += 1;
                        return Ok(());
                    }
                }
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
