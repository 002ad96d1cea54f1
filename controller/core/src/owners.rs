//! Which AppService an object belongs to, for the watches that wake it.
//!
//! kube-runtime's `owns_stream` maps a child to its owner with
//! `ObjectRef::from_owner_ref`, which matches the owner reference's `apiVersion`
//! exactly. Our children name their owner through whichever version was served when
//! they were written (`v1alpha1` before this release, the storage version since), so
//! matching one version string missed every child of the other: no child event woke its
//! AppService, and only the resync healed. Here an owner reference is matched by group
//! and kind, whatever version it names, and confirmed by the uid of the AppService in
//! the cache.

use common::AppService;
use common::names::{CANARY_SUFFIX, DATABASE_SECRET_SUFFIX};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};

/// Whether `owner` names an AppService, in any version of its group.
pub fn names_an_app(owner: &OwnerReference) -> bool {
    let group = owner
        .api_version
        .split_once('/')
        .map_or("", |(group, _)| group);
    owner.kind == AppService::kind(&()) && group == AppService::group(&())
}

/// The AppService an object of ours belongs to: the controller owner reference to an
/// AppService (any version) whose uid is the cached AppService's of that name. Failing
/// that, the AppService the object is named after (a child left by an earlier AppService
/// of the same name, or one whose owner reference someone changed, blocks that name: its
/// change or deletion must wake the AppService that waits for it).
pub fn owner_of(apps: &Store<AppService>, meta: &ObjectMeta) -> Option<ObjectRef<AppService>> {
    let namespace = meta.namespace.as_deref()?;
    let owned = meta
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true) && names_an_app(r))
        .find_map(|r| {
            let key = ObjectRef::new(&r.name).within(namespace);
            apps.get(&key)
                .is_some_and(|app| app.metadata.uid.as_deref() == Some(r.uid.as_str()))
                .then_some(key)
        });
    owned.or_else(|| same_named_app(apps, meta))
}

/// The AppService in the cache that an object in its namespace is named after: the
/// Deployment and the Service carry the AppService's name, the credentials Secret that
/// name followed by [`DATABASE_SECRET_SUFFIX`], the canary Deployment by
/// [`CANARY_SUFFIX`].
pub fn same_named_app(
    apps: &Store<AppService>,
    meta: &ObjectMeta,
) -> Option<ObjectRef<AppService>> {
    let name = meta.name.as_deref()?;
    let namespace = meta.namespace.as_deref()?;
    let candidates = [
        Some(name),
        name.strip_suffix(DATABASE_SECRET_SUFFIX),
        name.strip_suffix(CANARY_SUFFIX),
    ];
    candidates.into_iter().flatten().find_map(|name| {
        let key = ObjectRef::new(name).within(namespace);
        apps.get(&key).is_some().then_some(key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn app(name: &str, uid: &str) -> AppService {
        common::testing::app(name, "nginx:1.27")
            .namespace("shop")
            .uid(uid)
            .build()
    }

    fn store(apps: &[AppService]) -> Store<AppService> {
        let (store, mut writer) = reflector::store();
        for app in apps {
            writer.apply_watcher_event(&Event::Apply(app.clone()));
        }
        store
    }

    fn owned_by(name: &str, api_version: &str, owner: &str, uid: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: "AppService".into(),
                name: owner.into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn every_version_of_the_group_names_the_owner() {
        let apps = store(&[app("web", "u-1")]);
        let want = Some(ObjectRef::new("web").within("shop"));
        for version in [
            "platform.example.com/v1alpha1",
            "platform.example.com/v1beta1",
            "platform.example.com/v1",
        ] {
            // Named otherwise than the owner, so only the owner reference can map it.
            let meta = owned_by("other-name", version, "web", "u-1");
            assert_eq!(owner_of(&apps, &meta), want, "{version}");
        }
    }

    #[test]
    fn another_group_kind_or_uid_is_not_the_owner() {
        let apps = store(&[app("web", "u-1")]);
        for (version, uid) in [
            ("other.example.com/v1beta1", "u-1"),
            ("platform.example.com/v1beta1", "u-2"),
        ] {
            let meta = owned_by("other-name", version, "web", uid);
            assert_eq!(owner_of(&apps, &meta), None, "{version} {uid}");
        }
        let mut meta = owned_by("other-name", "platform.example.com/v1beta1", "web", "u-1");
        meta.owner_references.as_mut().unwrap()[0].kind = "Deployment".into();
        assert_eq!(owner_of(&apps, &meta), None);
        // Not the controller reference: the AppService does not control it.
        let mut meta = owned_by("other-name", "platform.example.com/v1beta1", "web", "u-1");
        meta.owner_references.as_mut().unwrap()[0].controller = None;
        assert_eq!(owner_of(&apps, &meta), None);
    }

    #[test]
    fn a_child_of_an_earlier_namesake_wakes_the_one_it_blocks() {
        let apps = store(&[app("web", "u-new")]);
        let want = Some(ObjectRef::new("web").within("shop"));
        let stale = owned_by("web", "platform.example.com/v1alpha1", "web", "u-old");
        assert_eq!(owner_of(&apps, &stale), want);
        let secret = owned_by(
            "web-database",
            "platform.example.com/v1alpha1",
            "web",
            "u-old",
        );
        assert_eq!(owner_of(&apps, &secret), want);
        // A foreign Deployment named like the canary (no owner reference at all) wakes
        // the AppService whose canary it blocks.
        let foreign = ObjectMeta {
            name: Some("web-canary".into()),
            namespace: Some("shop".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(owner_of(&apps, &foreign), want);
        // Ours, through the owner reference.
        let canary = owned_by("web-canary", "platform.example.com/v1beta1", "web", "u-new");
        assert_eq!(owner_of(&apps, &canary), want);
        let unrelated = owned_by("api", "platform.example.com/v1beta1", "api", "u-9");
        assert_eq!(owner_of(&apps, &unrelated), None);
    }

    #[test]
    fn group_is_matched_whole() {
        let mut owner = owned_by("x", "platform.example.com/v1beta1", "web", "u")
            .owner_references
            .unwrap()
            .remove(0);
        assert!(names_an_app(&owner));
        owner.api_version = "platform.example.com.evil/v1beta1".into();
        assert!(!names_an_app(&owner));
        owner.api_version = "v1".into();
        assert!(!names_an_app(&owner));
    }
}
