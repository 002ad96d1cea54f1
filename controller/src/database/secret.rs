//! The `<name>-database` Secret as a pure function of the AppService, its class and
//! the password.

use std::collections::BTreeMap;

use common::names::{child_labels, database_secret_name};
use common::{AppService, DatabaseClass};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::sql::database_url;
use super::{CLASS_ANNOTATION, PASSWORD_PENDING_ANNOTATION};
use crate::desired::{owner_reference, required};
use crate::error::Result;

pub const DATABASE_URL: &str = "DATABASE_URL";
pub const PGHOST: &str = "PGHOST";
pub const PGPORT: &str = "PGPORT";
pub const PGDATABASE: &str = "PGDATABASE";
pub const PGUSER: &str = "PGUSER";
pub const PGPASSWORD: &str = "PGPASSWORD";
pub const PGSSLMODE: &str = "PGSSLMODE";
/// The CA of the server, for clients that verify it (`verify-full`).
pub const CA_CRT: &str = "ca.crt";

/// The Secret holding the credentials of `db` (role and database have the same name).
/// `pending` marks a password that may not be the role's yet.
pub fn desired(
    app: &AppService,
    class: &DatabaseClass,
    db: &str,
    password: &str,
    pending: bool,
    ca_pem: Option<&str>,
) -> Result<Secret> {
    let name = required(&app.metadata.name, "metadata.name")?;
    let namespace = required(&app.metadata.namespace, "metadata.namespace")?;
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let host = &class.spec.host;
    let port = class.spec.port;
    let sslmode = class.spec.tls.mode.as_sslmode();
    let mut data = BTreeMap::from([
        (
            DATABASE_URL.to_owned(),
            database_url(db, password, host, port, db, sslmode),
        ),
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
    let mut annotations = BTreeMap::from([(CLASS_ANNOTATION.to_owned(), class_name)]);
    if pending {
        annotations.insert(PASSWORD_PENDING_ANNOTATION.to_owned(), "true".to_owned());
    }
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(database_secret_name(name)),
            namespace: Some(namespace.to_owned()),
            labels: Some(child_labels(name)),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(app)?]),
            ..ObjectMeta::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        type_: Some("Opaque".to_owned()),
        ..Secret::default()
    })
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
    use common::AppServiceSpec;

    fn app() -> AppService {
        let mut app = AppService::new("checkout", AppServiceSpec::default());
        app.metadata.namespace = Some("shop".into());
        app.metadata.uid = Some("u-1".into());
        app
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
        let s = desired(&app(), &class(), "appsvc_x", "pw", true, None).unwrap();
        assert_eq!(s.metadata.name.as_deref(), Some("checkout-database"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.uid, "u-1");
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
        let settled = desired(&app(), &class(), "d", "pw", false, None).unwrap();
        let mut live = settled.clone();
        live.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("someone/else".into(), "x".into());
        assert!(same_data(&live, &settled));
        let other_pw = desired(&app(), &class(), "d", "pw2", false, None).unwrap();
        assert!(!same_data(&other_pw, &settled));
    }
}
