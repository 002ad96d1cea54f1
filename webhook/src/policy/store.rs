//! The policy file: loaded at start, reloaded when it changes, and the set it holds
//! swapped in whole only when the new file compiles.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use super::{InvalidPolicy, PolicyError, PolicySet};

/// The active policy set plus where it comes from; swapped whole on reload.
#[derive(Debug)]
pub struct PolicyStore {
    path: Option<PathBuf>,
    // Whether `namespaceObject` is bound; a file using it is refused otherwise.
    namespace_labels: bool,
    active: RwLock<Arc<PolicySet>>,
    // Last file content seen, loaded or refused: an unchanged file is not recompiled
    // and a refused file is reported once, not on every periodic check.
    last_seen: Mutex<Option<Vec<u8>>>,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The file did not change.
    Unchanged,
    /// A new set with this many policies is active.
    Loaded(usize),
}

impl PolicyStore {
    /// A store without a file: no policies, ever.
    pub fn empty() -> Self {
        PolicyStore {
            path: None,
            namespace_labels: false,
            active: RwLock::new(Arc::new(PolicySet::default())),
            last_seen: Mutex::new(None),
        }
    }

    /// A store holding a fixed set, never reloaded.
    pub fn fixed(set: PolicySet) -> Self {
        PolicyStore {
            path: None,
            namespace_labels: true,
            active: RwLock::new(Arc::new(set)),
            last_seen: Mutex::new(None),
        }
    }

    /// Loads `path`; fails when the first load fails (a webhook must not start without
    /// the policies it was told to enforce).
    /// `namespace_labels`: whether `namespaceObject` is available to policies.
    pub fn load(path: PathBuf, namespace_labels: bool) -> Result<Self, PolicyError> {
        let store = PolicyStore {
            path: Some(path),
            namespace_labels,
            active: RwLock::new(Arc::new(PolicySet::default())),
            last_seen: Mutex::new(None),
        };
        store.reload()?;
        Ok(store)
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The active set; cheap (an `Arc` clone).
    pub fn current(&self) -> Arc<PolicySet> {
        self.active
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Re-reads the file; on success the new set replaces the active one, on failure the
    /// active set stays and the error is returned.
    pub fn reload(&self) -> Result<Reload, PolicyError> {
        let Some(path) = &self.path else {
            return Ok(Reload::Unchanged);
        };
        let bytes = std::fs::read(path).map_err(|error| PolicyError::Read {
            path: path.clone(),
            error,
        })?;
        {
            let mut last = self
                .last_seen
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.as_deref() == Some(bytes.as_slice()) {
                return Ok(Reload::Unchanged);
            }
            *last = Some(bytes.clone());
        }
        let text = String::from_utf8(bytes).map_err(|error| PolicyError::NotUtf8 {
            path: path.clone(),
            error,
        })?;
        // An empty file is what a torn or truncated write looks like: it must not switch
        // enforcement off. Clearing the policies is written `policies: []`.
        if text.trim().is_empty() && !self.current().is_empty() {
            return Err(PolicyError::Empty { path: path.clone() });
        }
        let set = PolicySet::from_yaml(path, &text)?;
        if !self.namespace_labels
            && let Some((index, name)) = set.first_using_namespace()
        {
            return Err(PolicyError::Invalid {
                path: path.clone(),
                index,
                name: name.to_owned(),
                reason: InvalidPolicy::NamespaceObject,
            });
        }
        let count = set.len();
        *self.active.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
        Ok(Reload::Loaded(count))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::REGISTRY;
    use super::*;

    #[test]
    fn reload_keeps_the_previous_set_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policies.yaml");
        std::fs::write(&path, REGISTRY).unwrap();
        let store = PolicyStore::load(path.clone(), false).unwrap();
        assert_eq!(store.current().len(), 2);
        assert_eq!(store.reload().unwrap(), Reload::Unchanged);

        std::fs::write(
            &path,
            "policies:\n  - {name: x, expression: '(', message: m}\n",
        )
        .unwrap();
        assert!(store.reload().is_err());
        assert_eq!(store.current().len(), 2, "previous set stays active");
        // The same broken content is not reported again.
        assert_eq!(store.reload().unwrap(), Reload::Unchanged);

        std::fs::write(
            &path,
            "policies:\n  - {name: x, expression: 'true', message: m}\n",
        )
        .unwrap();
        assert_eq!(store.reload().unwrap(), Reload::Loaded(1));
        assert_eq!(store.current().names().collect::<Vec<_>>(), ["x"]);
    }

    #[test]
    fn empty_or_torn_files_do_not_remove_policies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("policies.yaml");
        std::fs::write(&path, REGISTRY).unwrap();
        let store = PolicyStore::load(path.clone(), false).unwrap();
        // Empty, whitespace only, cut before the key, cut inside a policy, no key at all.
        for torn in [
            "",
            " \n\t\n",
            "poli",
            "policies:\n  - name: allowed-registry\n    expression: \"object.spec.image.sta",
            "policies:\n  - name: allowed-registry\n",
            "{}\n",
        ] {
            std::fs::write(&path, torn).unwrap();
            let err = store.reload().unwrap_err().to_string();
            assert_eq!(
                store.current().len(),
                2,
                "{torn:?} replaced the policies ({err})"
            );
        }
        std::fs::write(&path, "").unwrap();
        let err = store.reload();
        // The same content again is not re-reported; the previous one differed.
        assert!(matches!(err, Err(PolicyError::Empty { .. })), "{err:?}");
        // An explicit empty list clears them; then an empty file is harmless.
        std::fs::write(&path, "policies: []\n").unwrap();
        assert_eq!(store.reload().unwrap(), Reload::Loaded(0));
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(store.reload().unwrap(), Reload::Loaded(0));
    }
}
