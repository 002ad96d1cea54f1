//! The revision of the configuration an AppService's Pods read: a digest of the data of
//! every ConfigMap and Secret of `spec.config`, and of those its `env` takes keys from.
//! It goes in the Pod template ([`ANNOTATION_CONFIG_REVISION`]), so a change of their
//! data rolls the Pods as a change of the spec does.
//!
//! The data is read only when it may have changed: the controller watches the metadata
//! of ConfigMaps and Secrets (never their data), and each event of one forgets its
//! digest ([`Digests::changed`]) and wakes the AppServices that read it. The next pass
//! reads it once and keeps only its digest. So a ConfigMap edited a hundred times is
//! read at most once per pass of each AppService that reads it, and the controller
//! holds 32 bytes per object, never its data.
//!
//! A digest is kept per object until an event of it; a pass that read an object while
//! an event of it arrived keeps nothing (the event's pass reads it again), so a digest
//! is never older than the last event. At most [`MAX_DIGESTS`] are kept; past that the
//! memory is cleared and refilled by the passes that need it.
//!
//! [`ANNOTATION_CONFIG_REVISION`]: common::names::ANNOTATION_CONFIG_REVISION

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use common::{AppServiceSpec, ConfigKind};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// The most digests kept: 16 sources for each of 4,096 AppServices.
pub const MAX_DIGESTS: usize = 65_536;

/// One object an AppService's Pods read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Source {
    pub kind: ConfigKind,
    pub name: String,
    /// Only `env` entries marked `optional` are: the Pods start without them.
    pub optional: bool,
}

/// Every reference of `spec` to an object it reads, as (kind, name, optional): the
/// entries of `config`, then the keys `env` takes (`optional` only for those marked so).
fn references(spec: &AppServiceSpec) -> impl Iterator<Item = (ConfigKind, &str, bool)> {
    let config = spec
        .config
        .iter()
        .filter_map(|entry| entry.source())
        .map(|(kind, name)| (kind, name, false));
    let env = spec
        .env
        .iter()
        .filter_map(|var| var.value_from.as_ref())
        .flat_map(|from| {
            let map = from.config_map_key_ref.as_ref().map(|key| {
                (
                    ConfigKind::ConfigMap,
                    key.name.as_str(),
                    key.optional == Some(true),
                )
            });
            let secret = from.secret_key_ref.as_ref().map(|key| {
                (
                    ConfigKind::Secret,
                    key.name.as_str(),
                    key.optional == Some(true),
                )
            });
            map.into_iter().chain(secret)
        });
    config.chain(env)
}

/// The objects `spec` reads, each once (required if any reference requires it), in a
/// stable order.
pub fn sources(spec: &AppServiceSpec) -> Vec<Source> {
    let mut found: Vec<Source> = references(spec)
        .map(|(kind, name, optional)| Source {
            kind,
            name: name.to_owned(),
            optional,
        })
        .collect();
    // Required first, so the dedup keeps the strictest reference of each object.
    found.sort_by(|a, b| (a.kind, &a.name, a.optional).cmp(&(b.kind, &b.name, b.optional)));
    found.dedup_by(|later, first| later.kind == first.kind && later.name == first.name);
    found
}

/// Whether `spec` reads the object `kind`/`name` (of its own namespace).
pub fn reads(spec: &AppServiceSpec, kind: ConfigKind, name: &str) -> bool {
    references(spec).any(|(k, n, _)| k == kind && n == name)
}

/// The AppServices in `apps` that read `kind`/`name` of `namespace`: those an event of
/// that object wakes.
pub fn readers(
    apps: &Store<common::AppService>,
    kind: ConfigKind,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<common::AppService>> {
    apps.state()
        .iter()
        .filter(|app| app.metadata.namespace.as_deref() == Some(namespace))
        .filter(|app| reads(&app.spec, kind, name))
        .map(|app| ObjectRef::from_obj(&**app))
        .collect()
}

/// What a pass found of the configuration its Pods read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revision {
    /// It reads none: no annotation (a plain AppService's Pod template as before).
    None,
    /// The digest of all of it.
    Of(String),
    /// These required objects do not exist (`ConfigMap settings`, ...).
    Missing(Vec<String>),
}

type Key = (ConfigKind, String, String);

#[derive(Default)]
struct Entry {
    /// Events of the object since the entry was made.
    epoch: u64,
    /// The digest of its data (`None` inside: it does not exist), while no event has
    /// come since it was read.
    digest: Option<Option<String>>,
}

/// The digests of the objects AppServices read, each forgotten on an event of its object.
#[derive(Default)]
pub struct Digests {
    entries: Mutex<HashMap<Key, Entry>>,
}

impl Digests {
    /// An event of `kind`/`name` in `namespace`: its digest is stale.
    pub fn changed(&self, kind: ConfigKind, namespace: &str, name: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.get_mut(&(kind, namespace.to_owned(), name.to_owned())) {
            entry.epoch += 1;
            entry.digest = None;
        }
    }

    /// The digest of the object if known, else the epoch a read of it starts at.
    fn lookup(&self, key: &Key) -> Result<Option<String>, u64> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= MAX_DIGESTS && !entries.contains_key(key) {
            entries.clear();
        }
        let entry = entries.entry(key.clone()).or_default();
        match &entry.digest {
            Some(digest) => Ok(digest.clone()),
            None => Err(entry.epoch),
        }
    }

    /// Keeps what a read that started at `epoch` found, unless an event came since.
    fn store(&self, key: &Key, epoch: u64, digest: Option<String>) {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = entries.get_mut(key)
            && entry.epoch == epoch
        {
            entry.digest = Some(digest);
        }
    }

    /// How many digests are kept.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|e| e.digest.is_some())
            .count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The revision of what `spec` reads in `namespace`: each object's digest from memory,
/// or read once from the API server.
pub async fn revision(
    client: &Client,
    digests: &Digests,
    namespace: &str,
    spec: &AppServiceSpec,
) -> Result<Revision, kube::Error> {
    let sources = sources(spec);
    if sources.is_empty() {
        return Ok(Revision::None);
    }
    let mut lines = BTreeSet::new();
    let mut missing = Vec::new();
    for source in &sources {
        let key = (source.kind, namespace.to_owned(), source.name.clone());
        let digest = match digests.lookup(&key) {
            Ok(digest) => digest,
            Err(epoch) => {
                let digest = read(client, namespace, source).await?;
                digests.store(&key, epoch, digest.clone());
                digest
            }
        };
        match digest {
            Some(digest) => {
                lines.insert(format!("{}/{}={digest}", source.kind.as_str(), source.name));
            }
            None if source.optional => {
                lines.insert(format!("{}/{}=absent", source.kind.as_str(), source.name));
            }
            None => missing.push(format!("{} {}", source.kind.as_str(), source.name)),
        }
    }
    if !missing.is_empty() {
        return Ok(Revision::Missing(missing));
    }
    let mut hasher = Sha256::new();
    for line in lines {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    Ok(Revision::Of(hex(&hasher.finalize()[..16])))
}

/// The digest of one object's data, `None` when it does not exist.
async fn read(
    client: &Client,
    namespace: &str,
    source: &Source,
) -> Result<Option<String>, kube::Error> {
    let digest = match source.kind {
        ConfigKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(&source.name)
            .await?
            .map(|c| digest_of(&(c.data, c.binary_data))),
        ConfigKind::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .get_opt(&source.name)
            .await?
            .map(|s| digest_of(&s.data)),
    };
    Ok(digest)
}

/// A digest of `data` (maps serialize in key order, so equal data has one digest).
fn digest_of(data: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(data).unwrap_or_default();
    hex(&Sha256::digest(&bytes)[..16])
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::{ConfigSource, EnvVar};
    use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVarSource, SecretKeySelector};

    fn spec() -> AppServiceSpec {
        AppServiceSpec {
            image: "registry.example.com/web:1".into(),
            config: vec![
                ConfigSource {
                    config_map: Some("settings".into()),
                    ..ConfigSource::default()
                },
                ConfigSource {
                    config_map: Some("settings".into()),
                    mount_path: Some("/etc/app".into()),
                    ..ConfigSource::default()
                },
            ],
            env: vec![
                EnvVar {
                    name: "TOKEN".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: "keys".into(),
                            key: "token".into(),
                            optional: Some(true),
                        }),
                        ..EnvVarSource::default()
                    }),
                },
                EnvVar {
                    name: "LEVEL".into(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(ConfigMapKeySelector {
                            name: "settings".into(),
                            key: "level".into(),
                            optional: Some(true),
                        }),
                        ..EnvVarSource::default()
                    }),
                },
            ],
            ..AppServiceSpec::default()
        }
    }

    #[test]
    fn each_object_once_required_if_any_reference_requires_it() {
        let found = sources(&spec());
        assert_eq!(
            found,
            [
                Source {
                    kind: ConfigKind::ConfigMap,
                    name: "settings".into(),
                    optional: false
                },
                Source {
                    kind: ConfigKind::Secret,
                    name: "keys".into(),
                    optional: true
                },
            ]
        );
        assert!(reads(&spec(), ConfigKind::Secret, "keys"));
        assert!(reads(&spec(), ConfigKind::ConfigMap, "settings"));
        assert!(!reads(&spec(), ConfigKind::Secret, "settings"));
        assert!(sources(&AppServiceSpec::default()).is_empty());
    }

    #[test]
    fn a_digest_read_while_an_event_came_is_not_kept() {
        let digests = Digests::default();
        let key = (
            ConfigKind::ConfigMap,
            "shop".to_owned(),
            "settings".to_owned(),
        );
        let epoch = digests.lookup(&key).expect_err("nothing known yet");
        // An event between the read's start and its end.
        digests.changed(ConfigKind::ConfigMap, "shop", "settings");
        digests.store(&key, epoch, Some("old".into()));
        let epoch = digests
            .lookup(&key)
            .expect_err("the stale read was not kept");
        digests.store(&key, epoch, Some("new".into()));
        assert_eq!(digests.lookup(&key), Ok(Some("new".into())));
        assert_eq!(digests.len(), 1);
        // The next event forgets it.
        digests.changed(ConfigKind::ConfigMap, "shop", "settings");
        assert!(digests.lookup(&key).is_err());
        // Events of objects nobody reads keep nothing.
        digests.changed(ConfigKind::Secret, "shop", "other");
        assert_eq!(digests.len(), 0);
    }

    #[test]
    fn equal_data_has_one_digest_and_any_change_another() {
        use std::collections::BTreeMap;
        let a = BTreeMap::from([("a", "1"), ("b", "2")]);
        let b = BTreeMap::from([("b", "2"), ("a", "1")]);
        assert_eq!(digest_of(&a), digest_of(&b));
        let c = BTreeMap::from([("a", "1"), ("b", "3")]);
        assert_ne!(digest_of(&a), digest_of(&c));
    }
}
