//! The `<name>-database` Secret as a pure function of the AppService, its class and
//! the password.

use std::collections::BTreeMap;

use common::names::{DATABASE_CA_PATH, child_labels, database_secret_name};
use common::{DatabaseClass, TlsMode};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use sha2::{Digest, Sha256};

use super::sql::{self, database_url};
use super::{CLASS_ANNOTATION, PASSWORD_PENDING_ANNOTATION};
use crate::pod::PodDatabase;
use controller_core::desired::{is_controlled_by, owner_reference};
use controller_core::subject::Subject;

pub use common::names::database_keys::*;

pub use common::names::PASSWORD_HASH_ANNOTATION;

/// Whether the Pods get the class's CA: mounted from [`CA_CRT`], named by
/// `sslrootcert=` in the URL and by [`PGSSLROOTCERT`]. Only `verify-full` verifies the
/// server; under `require` libpq would verify a root certificate it is given (as
/// `verify-ca`), which the class does not ask for, so none is given, and `disable`
/// needs none.
pub fn pods_get_ca(class: &DatabaseClass, ca_pem: Option<&str>) -> bool {
    ca_pem.is_some() && class.spec.tls.mode == TlsMode::VerifyFull
}

/// The Secret holding the credentials of `db` (role and database have the same name).
/// `pending` marks a password that may not be the role's yet.
pub fn desired(
    app: &Subject,
    class: &DatabaseClass,
    db: &str,
    password: &str,
    pending: bool,
    ca_pem: Option<&str>,
) -> Secret {
    let (name, namespace) = (app.name(), app.namespace());
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let host = &class.spec.host;
    let port = class.spec.port;
    let sslmode = class.spec.tls.mode.as_sslmode();
    let mut url = database_url(db, password, host, port, db, sslmode);
    let with_ca = pods_get_ca(class, ca_pem);
    if with_ca {
        // A fixed path of plain characters: nothing to escape in the query.
        url.push_str("&sslrootcert=");
        url.push_str(DATABASE_CA_PATH);
    }
    let mut data = BTreeMap::from([
        (DATABASE_URL.to_owned(), url),
        (PGHOST.to_owned(), host.clone()),
        (PGPORT.to_owned(), port.to_string()),
        (PGDATABASE.to_owned(), db.to_owned()),
        (PGUSER.to_owned(), db.to_owned()),
        (PGPASSWORD.to_owned(), password.to_owned()),
        (PGSSLMODE.to_owned(), sslmode.to_owned()),
    ]);
    if let Some(ca) = ca_pem {
        data.insert(CA_CRT.to_owned(), ca.to_owned());
    }
    if with_ca {
        data.insert(PGSSLROOTCERT.to_owned(), DATABASE_CA_PATH.to_owned());
    }
    let mut annotations = BTreeMap::from([
        (CLASS_ANNOTATION.to_owned(), class_name),
        (PASSWORD_HASH_ANNOTATION.to_owned(), password_hash(password)),
    ]);
    if pending {
        annotations.insert(PASSWORD_PENDING_ANNOTATION.to_owned(), "true".to_owned());
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(database_secret_name(name)),
            namespace: Some(namespace.to_owned()),
            labels: Some(child_labels(name)),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(app)]),
            ..ObjectMeta::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    }
}

/// What the Pods of the AppService get from `secret` (the Secret as the controller
/// writes it): whether the CA is mounted, and the revision of its data.
pub fn pod_database(secret: &Secret) -> PodDatabase {
    PodDatabase {
        ca: secret
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key(PGSSLROOTCERT) && d.contains_key(CA_CRT)),
        revision: revision(secret),
    }
}

/// A hash of the Secret's data (every key and value, in key order, each length-prefixed
/// so no two different maps hash alike): what the Pod template's
/// `platform.example.com/database-revision` annotation holds. The password is random
/// and long, so its hash tells nothing.
pub fn revision(secret: &Secret) -> String {
    let mut hasher = Sha256::new();
    for (key, ByteString(value)) in secret.data.iter().flatten() {
        hasher.update((key.len() as u64).to_be_bytes());
        hasher.update(key.as_bytes());
        hasher.update((value.len() as u64).to_be_bytes());
        hasher.update(value);
    }
    // 128 bits are plenty to tell two revisions apart.
    hasher.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A key of a Secret as UTF-8 (from `data`, or `stringData` of an object not yet stored).
pub fn value(secret: &Secret, key: &str) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return String::from_utf8(v.0.clone()).ok();
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .cloned()
}

/// The hex SHA-256 of a password, as [`PASSWORD_HASH_ANNOTATION`] holds it.
pub fn password_hash(password: &str) -> String {
    Sha256::digest(password.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The password in a `postgres://user:password@host...` URL as we write it (user and
/// password are alphanumeric or `_`, so nothing in them is escaped).
fn url_password(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let (userinfo, _) = rest.split_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    Some(password.to_owned())
}

/// The password the role has, as far as `live` can tell: of `PGPASSWORD` and the
/// password in `DATABASE_URL`, the one whose hash is [`PASSWORD_HASH_ANNOTATION`] (the
/// other may have been edited). A Secret of an earlier release, without that annotation,
/// is taken at its `PGPASSWORD`. Only a password of the generated shape
/// ([`sql::is_generated_shape`]) is ever taken: anything else a tenant wrote there
/// (with a matching hash, or into an old Secret) is not. `None` when nothing is known
/// good: both copies edited, the key removed, or only text of another shape; the caller
/// then generates a new password and sets it on the role.
pub fn trusted_password(live: &Secret) -> Option<String> {
    let pgpassword = value(live, PGPASSWORD).filter(|pw| sql::is_generated_shape(pw));
    let Some(hash) = live
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PASSWORD_HASH_ANNOTATION))
    else {
        return pgpassword;
    };
    let in_url = value(live, DATABASE_URL).and_then(|url| url_password(&url));
    [pgpassword, in_url]
        .into_iter()
        .flatten()
        .find(|pw| sql::is_generated_shape(pw) && password_hash(pw) == *hash)
}

/// Whether `live` is this AppService's Secret: controlled by it (whatever version of
/// the AppService its owner reference names), or, with no controller at all (its owner
/// reference removed, or the `controller` flag cleared), holding the credentials of
/// the AppService's own database `db`, which is named from its uid. Anything else is
/// someone else's and is never written.
pub fn is_ours(live: &Secret, uid: &str, db: &str) -> bool {
    let refs = live.metadata.owner_references.as_deref();
    if is_controlled_by(refs, uid) {
        return true;
    }
    let controlled = refs
        .unwrap_or_default()
        .iter()
        .any(|r| r.controller == Some(true));
    !controlled
        && value(live, PGUSER).as_deref() == Some(db)
        && value(live, PGDATABASE).as_deref() == Some(db)
}

/// Whether `live` carries `desired`'s labels and its owner reference exactly (the one
/// controller reference: re-pointed at the storage version, flags as we set them).
pub fn same_metadata(live: &Secret, desired: &Secret) -> bool {
    let labels_ok = desired
        .metadata
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| live.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v));
    let want = desired
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let have = live
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default();
    let controllers: Vec<_> = have.iter().filter(|r| r.controller == Some(true)).collect();
    let owner_ok = want
        .iter()
        .all(|w| controllers.len() == 1 && controllers[0] == w);
    labels_ok && owner_ok
}

/// Carries over into `desired` what others put on `live` that is not ours to remove:
/// their labels, annotations (but the pending mark, which only `desired` decides) and
/// non-controller owner references.
pub fn keep_others(live: &Secret, desired: &mut Secret) {
    let meta = &mut desired.metadata;
    for (k, v) in live.metadata.labels.iter().flatten() {
        meta.labels
            .get_or_insert_with(BTreeMap::new)
            .entry(k.clone())
            .or_insert_with(|| v.clone());
    }
    for (k, v) in live.metadata.annotations.iter().flatten() {
        if k != PASSWORD_PENDING_ANNOTATION {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
    }
    let others = live
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller != Some(true));
    meta.owner_references
        .get_or_insert_with(Vec::new)
        .extend(others.cloned());
}

/// Whether `live` already has `desired`'s data and annotations (ignoring other
/// annotations someone may have added).
pub fn same_data(live: &Secret, desired: &Secret) -> bool {
    let annotations_ok = desired
        .metadata
        .annotations
        .iter()
        .flatten()
        .all(|(k, v)| live.metadata.annotations.as_ref().and_then(|a| a.get(k)) == Some(v));
    live.data == desired.data && annotations_ok
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use common::testing::{UID, stored};
    use common::{AppService, AppServiceSpec};

    /// The [`Subject`] of a test's AppService, which has its identity.
    fn subject(app: &AppService) -> Subject<'_> {
        Subject::of(app).expect("a test AppService has a name, namespace and uid")
    }

    /// The AppService of these tests, as stored.
    fn app() -> AppService {
        stored("checkout", AppServiceSpec::default())
    }

    /// Our Secret for [`app`] on [`class`] without a CA: `database`, `password`, pending.
    fn secret(database: &str, password: &str, pending: bool) -> Secret {
        desired(
            &subject(&app()),
            &class(),
            database,
            password,
            pending,
            None,
        )
    }

    fn class() -> DatabaseClass {
        DatabaseClass::new(
            "prod",
            serde_json::from_value(serde_json::json!({
                "host": "db.example", "port": 6432, "tls": {"mode": "require"},
                "adminCredentials": {"secretName": "admin"}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn secret_has_every_key_and_is_owned() {
        let s = secret("appsvc_x", "pw", true);
        assert_eq!(s.metadata.name.as_deref(), Some("checkout-database"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, UID);
        assert_eq!(owner.controller, Some(true));
        assert_eq!(
            value(&s, DATABASE_URL).unwrap(),
            "postgres://appsvc_x:pw@db.example:6432/appsvc_x?sslmode=require"
        );
        for (k, v) in [
            (PGHOST, "db.example"),
            (PGPORT, "6432"),
            (PGDATABASE, "appsvc_x"),
            (PGUSER, "appsvc_x"),
            (PGPASSWORD, "pw"),
            (PGSSLMODE, "require"),
        ] {
            assert_eq!(value(&s, k).as_deref(), Some(v), "{k}");
        }
        let annotations = s.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[CLASS_ANNOTATION], "prod");
        assert_eq!(annotations[PASSWORD_PENDING_ANNOTATION], "true");
    }

    #[test]
    fn same_data_ignores_foreign_annotations_but_not_pending() {
        let settled = secret("d", "pw", false);
        let mut live = settled.clone();
        live.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("someone/else".into(), "x".into());
        assert!(same_data(&live, &settled));
        let other_pw = secret("d", "pw2", false);
        assert!(!same_data(&other_pw, &settled));
    }

    #[test]
    fn only_generated_shapes_are_trusted_whatever_the_hash_says() {
        let tenant_made = |pw: &str| {
            let mut s = secret("appsvc_x", pw, true);
            s.data
                .as_mut()
                .unwrap()
                .insert(PGPASSWORD.into(), ByteString(pw.as_bytes().to_vec()));
            s
        };
        for hostile in [
            "x'; ALTER ROLE postgres PASSWORD 'owned".to_owned(),
            "back\\slash\\' || 'x".to_owned(),
            "semi;colon".to_owned(),
            "nul\0byte".to_owned(),
            "k".repeat(10 * 1024),
            String::new(),
        ] {
            // The hash annotation matches (the tenant wrote it too): still not taken.
            assert_eq!(
                trusted_password(&tenant_made(&hostile)),
                None,
                "{hostile:?}"
            );
        }
        let mut non_utf8 = tenant_made(REAL);
        non_utf8
            .data
            .as_mut()
            .unwrap()
            .insert(PGPASSWORD.into(), ByteString(vec![0xff, 0xfe, b'a']));
        non_utf8.data.as_mut().unwrap().remove(DATABASE_URL);
        assert_eq!(trusted_password(&non_utf8), None);
        // A value of the generated shape with its hash is taken (the role is theirs).
        let chosen = "T".repeat(sql::PASSWORD_LEN);
        assert_eq!(trusted_password(&tenant_made(&chosen)), Some(chosen));
    }

    const REAL: &str = "pwreal0123456789abcdefghijklmnop";

    #[test]
    fn the_role_password_is_told_from_an_edited_one() {
        let settled = secret("appsvc_x", REAL, false);
        assert_eq!(trusted_password(&settled).as_deref(), Some(REAL));
        let edit = |key: &str, value: &str| {
            let mut s = settled.clone();
            s.data
                .as_mut()
                .unwrap()
                .insert(key.into(), ByteString(value.as_bytes().to_vec()));
            s
        };
        // PGPASSWORD edited: the URL still has the real one.
        assert_eq!(
            trusted_password(&edit(PGPASSWORD, "guess")).as_deref(),
            Some(REAL)
        );
        // The URL edited: PGPASSWORD is the real one.
        let url = "postgres://appsvc_x:guess@db.example:6432/appsvc_x?sslmode=require";
        assert_eq!(
            trusted_password(&edit(DATABASE_URL, url)).as_deref(),
            Some(REAL)
        );
        // Both edited: nothing is known good.
        let both = {
            let mut s = edit(PGPASSWORD, "guess");
            s.data
                .as_mut()
                .unwrap()
                .insert(DATABASE_URL.into(), ByteString(url.as_bytes().to_vec()));
            s
        };
        assert_eq!(trusted_password(&both), None);
        // An earlier release's Secret (no hash): its PGPASSWORD, as before.
        let mut legacy = settled.clone();
        legacy
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(PASSWORD_HASH_ANNOTATION);
        assert_eq!(trusted_password(&legacy).as_deref(), Some(REAL));
    }

    #[test]
    fn ours_without_an_owner_reference_but_never_anothers() {
        let ours = secret("appsvc_x", "pw", false);
        assert!(is_ours(&ours, UID, "appsvc_x"));
        assert!(!is_ours(&ours, "u-2", "appsvc_y"));
        let mut orphan = ours.clone();
        orphan.metadata.owner_references = None;
        assert!(is_ours(&orphan, UID, "appsvc_x"));
        assert!(!is_ours(&orphan, UID, "appsvc_other"));
        let mut anothers = ours.clone();
        anothers.metadata.owner_references.as_mut().unwrap()[0].uid = "u-9".into();
        assert!(!is_ours(&anothers, UID, "appsvc_x"));
        let mut foreign = Secret::default();
        foreign.metadata.name = Some("checkout-database".into());
        assert!(!is_ours(&foreign, UID, "appsvc_x"));
    }

    #[test]
    fn metadata_drift_is_seen_and_others_metadata_kept() {
        let want = secret("d", "pw", false);
        assert!(same_metadata(&want, &want));
        let mut old_version = want.clone();
        old_version.metadata.owner_references.as_mut().unwrap()[0].api_version =
            "platform.example.com/v1alpha1".into();
        assert!(!same_metadata(&old_version, &want));
        let mut unlabelled = want.clone();
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(common::names::LABEL_MANAGED_BY);
        assert!(!same_metadata(&unlabelled, &want));

        let mut live = old_version.clone();
        live.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("team".into(), "payments".into());
        live.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(PASSWORD_PENDING_ANNOTATION.into(), "true".into());
        let mut repaired = want.clone();
        keep_others(&live, &mut repaired);
        assert!(same_metadata(&repaired, &want));
        assert_eq!(
            repaired.metadata.labels.as_ref().unwrap()["team"],
            "payments"
        );
        assert!(
            !repaired
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(PASSWORD_PENDING_ANNOTATION)
        );
    }

    fn class_in(mode: &str) -> DatabaseClass {
        let mut c = class();
        c.spec.tls = serde_json::from_value(serde_json::json!({
            "mode": mode, "ca": {"secretRef": {"name": "ca"}}
        }))
        .unwrap();
        c
    }

    #[test]
    fn verify_full_names_the_mounted_ca_and_the_other_modes_do_not() {
        // A password of the shape the controller generates: only such a one is trusted.
        const PW: &str = "0123456789abcdefghijABCDEFGHIJkl";
        assert!(sql::is_generated_shape(PW));
        let s = desired(
            &subject(&app()),
            &class_in("verify-full"),
            "d",
            PW,
            false,
            Some("PEM"),
        );
        assert_eq!(
            value(&s, DATABASE_URL).unwrap(),
            format!(
                "postgres://d:{PW}@db.example:6432/d?sslmode=verify-full\
                 &sslrootcert=/var/run/secrets/platform.example.com/database/ca.crt"
            )
        );
        assert_eq!(
            value(&s, PGSSLROOTCERT).as_deref(),
            Some(common::names::DATABASE_CA_PATH)
        );
        assert_eq!(value(&s, CA_CRT).as_deref(), Some("PEM"));
        assert!(pod_database(&s).ca);
        // The password is still found in the URL.
        assert_eq!(trusted_password(&s).as_deref(), Some(PW));
        for mode in ["require", "disable"] {
            let s = desired(
                &subject(&app()),
                &class_in(mode),
                "d",
                PW,
                false,
                Some("PEM"),
            );
            let url = value(&s, DATABASE_URL).unwrap();
            assert!(!url.contains("sslrootcert"), "{mode}: {url}");
            assert!(url.ends_with(&format!("?sslmode={mode}")), "{url}");
            assert_eq!(value(&s, PGSSLROOTCERT), None, "{mode}");
            assert!(!pod_database(&s).ca, "{mode}");
        }
    }

    #[test]
    fn the_revision_follows_the_password_the_ca_and_the_server_only() {
        let rev = |class: &DatabaseClass, pw: &str, ca: &str, pending: bool| {
            revision(&desired(
                &subject(&app()),
                class,
                "d",
                pw,
                pending,
                Some(ca),
            ))
        };
        let vf = class_in("verify-full");
        let base = rev(&vf, "pw", "CA1", false);
        // Pods roll when the revision changes: the same inputs give the same revision in
        // every release (a golden value), not only twice in one process.
        assert_eq!(base, "1918ab39133316f1c63104095615612d");
        // Annotations (pending, foreign ones) are not what the Pods get.
        assert_eq!(base, rev(&vf, "pw", "CA1", true));
        assert_ne!(base, rev(&vf, "pw2", "CA1", false));
        assert_ne!(base, rev(&vf, "pw", "CA2", false));
        let mut moved = vf.clone();
        moved.spec.port = 5433;
        assert_ne!(base, rev(&moved, "pw", "CA1", false));
        assert_eq!(base.len(), 32);
        assert_eq!(
            pod_database(&desired(
                &subject(&app()),
                &vf,
                "d",
                "pw",
                false,
                Some("CA1")
            ))
            .revision,
            base
        );
    }
}
