//! One random namespace per test on a shared control plane, enforcing Pod Security
//! `restricted` unless the test asks for another level: the default of many platforms,
//! and what every Pod the operator's Deployments make must be admitted under.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};

use crate::ControlPlane;
use crate::error::{Result, kube as kube_err};

/// Label on every test namespace (value `"true"`), to select them all.
pub const TEST_NAMESPACE_LABEL: &str = "appservice-tests.example.com/test-namespace";
/// The label by which a namespace has Pod Security admission enforce a level.
pub const POD_SECURITY_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// A Pod Security Standard level a namespace enforces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PodSecurityLevel {
    /// Non-root, no privilege escalation, all capabilities dropped, a seccomp profile:
    /// every test namespace's level unless the test says otherwise.
    #[default]
    Restricted,
    /// Known privilege escalations refused; root and the runtime's capabilities allowed.
    Baseline,
    /// Nothing refused.
    Privileged,
}

impl PodSecurityLevel {
    /// The level as the namespace label spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            PodSecurityLevel::Restricted => "restricted",
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Privileged => "privileged",
        }
    }
}

/// A namespace created for one test. Dereferences to its name.
///
/// Dropping it deletes the namespace (best effort, from a helper thread with its own
/// runtime, so it also works after the test's runtime is gone). If the test is
/// panicking, the namespace is kept and its name and the log directory are printed.
/// Only full mode runs the namespace controller; in plain mode a deleted namespace
/// stays `Terminating` with its objects, which does not disturb other tests.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    level: PodSecurityLevel,
    config: kube::Config,
    log_dir: std::path::PathBuf,
    cleaned: bool,
}

impl TestNamespace {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Pod Security level the namespace enforces.
    pub fn pod_security(&self) -> PodSecurityLevel {
        self.level
    }

    /// Has the namespace enforce `level` from now on, as an admin relabelling it would
    /// (Pods that exist stay; Pods created later are admitted at the new level).
    pub async fn enforce(&mut self, level: PodSecurityLevel) -> Result<()> {
        let client = kube::Client::try_from(self.config.clone())
            .map_err(|e| crate::Error::Config(e.to_string()))?;
        let api: Api<Namespace> = Api::all(client);
        let patch = serde_json::json!({
            "metadata": {"labels": {POD_SECURITY_ENFORCE_LABEL: level.as_str()}}
        });
        api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "labelling namespace {} {POD_SECURITY_ENFORCE_LABEL}={}",
                self.name,
                level.as_str()
            )))?;
        self.level = level;
        Ok(())
    }

    /// Deletes the namespace now and waits for the API server to accept the deletion.
    pub async fn cleanup(mut self) -> Result<()> {
        self.cleaned = true;
        let client = kube::Client::try_from(self.config.clone())
            .map_err(|e| crate::Error::Config(e.to_string()))?;
        delete(client, &self.name).await
    }
}

impl std::ops::Deref for TestNamespace {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl AsRef<str> for TestNamespace {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        if std::thread::panicking() {
            eprintln!(
                "harness: test failed in namespace {}; component logs: {}",
                self.name,
                self.log_dir.display()
            );
            return;
        }
        let (config, name) = (self.config.clone(), self.name.clone());
        let worker = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(client) = kube::Client::try_from(config) {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(10), delete(client, &name)).await;
                }
            });
        });
        let _ = worker.join();
    }
}

async fn delete(client: kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(kube_err(format!("deleting namespace {name}"))(e)),
    }
}

/// A DNS-label-safe random suffix (hash of a randomly seeded hasher, time and a counter).
pub(crate) fn random_suffix(len: usize) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    let mut n = hasher.finish();
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..len)
        .map(|_| {
            let c = ALPHABET[(n % 36) as usize];
            n /= 36;
            char::from(c)
        })
        .collect()
}

impl ControlPlane {
    /// Creates a namespace `test-<random>` labelled [`TEST_NAMESPACE_LABEL`]`=true`,
    /// enforcing Pod Security `restricted`.
    pub async fn namespace(&self) -> Result<TestNamespace> {
        self.namespace_with("test", PodSecurityLevel::Restricted)
            .await
    }

    /// Creates a namespace `<prefix>-<random>` (prefix: a DNS label, ≤ 50 characters),
    /// enforcing Pod Security `restricted`.
    pub async fn namespace_with_prefix(&self, prefix: &str) -> Result<TestNamespace> {
        self.namespace_with(prefix, PodSecurityLevel::Restricted)
            .await
    }

    /// Creates a namespace `<prefix>-<random>` enforcing the Pod Security `level`: the
    /// opt-out for a test about another level (`restricted` is the default for all).
    pub async fn namespace_with(
        &self,
        prefix: &str,
        level: PodSecurityLevel,
    ) -> Result<TestNamespace> {
        let name = format!("{prefix}-{}", random_suffix(10));
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([
                    (TEST_NAMESPACE_LABEL.to_owned(), "true".to_owned()),
                    (
                        POD_SECURITY_ENFORCE_LABEL.to_owned(),
                        level.as_str().to_owned(),
                    ),
                ])),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        let api: Api<Namespace> = Api::all(self.try_client()?);
        api.create(&PostParams::default(), &ns)
            .await
            .map_err(kube_err(format!("creating namespace {name}")))?;
        // Captured by the test runner and shown only if the test fails, however it fails.
        eprintln!(
            "harness: test namespace {name} (Pod Security {}); component logs: {}",
            level.as_str(),
            self.log_dir().display()
        );
        Ok(TestNamespace {
            name,
            level,
            config: self.admin_config(),
            log_dir: self.log_dir().to_owned(),
            cleaned: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::random_suffix;

    #[test]
    fn suffixes_are_dns_safe_and_differ() {
        let a = random_suffix(10);
        let b = random_suffix(10);
        assert_eq!(a.len(), 10);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
        assert_ne!(a, b);
    }
}
