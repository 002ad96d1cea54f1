//! What the Pods of an AppService with a database get from its `<name>-database` Secret,
//! as [`PodAdditions`] the core puts in the Pod template: `DATABASE_URL`, the libpq
//! variables the user's `env` does not set, the CA mounted read-only when the class
//! verifies the server, and the Secret's revision on the template (a new password or CA
//! rolls the Pods). An AppService without a database gets none of it.

use std::collections::BTreeMap;

use common::names::database_keys as keys;
use common::names::{
    ANNOTATION_DATABASE_REVISION, DATABASE_CA_DIR, DATABASE_CA_VOLUME, DATABASE_URL_ENV,
    database_secret_name,
};
use controller_core::external::PodAdditions;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, KeyToPath, SecretKeySelector, SecretVolumeSource, Volume, VolumeMount,
};

/// What the Pods get from the Secret, as the database step last wrote it
/// ([`crate::secret::pod_database`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDatabase {
    /// The class verifies the server (`verify-full`): the Secret's `ca.crt` is mounted
    /// read-only at [`common::names::DATABASE_CA_PATH`], which `DATABASE_URL`
    /// (`sslrootcert=`) and `PGSSLROOTCERT` name.
    pub ca: bool,
    /// A hash of the Secret's data, stamped on the Pod template
    /// ([`ANNOTATION_DATABASE_REVISION`]): Pods read their environment when they start,
    /// so a new password or CA rolls the Deployment.
    pub revision: String,
}

/// The libpq variables a Pod gets from the Secret besides `DATABASE_URL` (which stays
/// the primary interface), for clients configured by environment.
const LIBPQ_ENV: [&str; 6] = [
    keys::PGHOST,
    keys::PGPORT,
    keys::PGDATABASE,
    keys::PGUSER,
    keys::PGPASSWORD,
    keys::PGSSLMODE,
];

/// Mode of the CA file: world-readable (a CA certificate is public), so any non-root
/// user the image runs as can read it, with or without `fsGroup`.
const CA_FILE_MODE: i32 = 0o444;

/// What the Pods of the AppService `app` get from its Secret, as `db` describes it. The
/// URL and every variable come from the Secret, never as a value in the Deployment;
/// the core leaves out a variable the user's `env` sets (`DATABASE_URL` is reserved by
/// validation).
pub fn additions(app: &str, db: &PodDatabase) -> PodAdditions {
    let secret = database_secret_name(app);
    let mut env = vec![from_secret(DATABASE_URL_ENV, &secret, DATABASE_URL_ENV)];
    let mut libpq: Vec<&str> = LIBPQ_ENV.to_vec();
    let (mut volumes, mut mounts) = (Vec::new(), Vec::new());
    if db.ca {
        libpq.push(keys::PGSSLROOTCERT);
        volumes.push(Volume {
            name: DATABASE_CA_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.clone()),
                items: Some(vec![KeyToPath {
                    key: keys::CA_CRT.to_owned(),
                    path: keys::CA_CRT.to_owned(),
                    ..KeyToPath::default()
                }]),
                default_mode: Some(CA_FILE_MODE),
                optional: Some(false),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        mounts.push(VolumeMount {
            name: DATABASE_CA_VOLUME.to_owned(),
            mount_path: DATABASE_CA_DIR.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    env.extend(libpq.into_iter().map(|key| from_secret(key, &secret, key)));
    PodAdditions {
        env,
        volumes,
        mounts,
        annotations: BTreeMap::from([(
            ANNOTATION_DATABASE_REVISION.to_owned(),
            db.revision.clone(),
        )]),
    }
}

/// An environment variable from `key` of the Secret `secret`, which must have it.
fn from_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_owned(),
                key: key.to_owned(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::testing::app;
    use controller_core::desired::desired_deployment;
    use controller_core::drift::desired_hash;
    use controller_core::subject::Subject;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Container;

    fn checkout() -> common::AppService {
        app("checkout", "nginx:1.27")
            .database("pg")
            .env("PGPORT", "6543")
            .stored()
            .build()
    }

    fn deployment(ca: bool) -> Deployment {
        let db = PodDatabase {
            ca,
            revision: "abc".into(),
        };
        let a = checkout();
        desired_deployment(&Subject::of(&a).unwrap(), &additions("checkout", &db))
    }

    fn container(d: &Deployment) -> &Container {
        &d.spec.template.spec.as_ref().unwrap().containers[0]
    }

    /// (name, literal value, Secret key) of each variable.
    fn env_of(d: &Deployment) -> Vec<(String, Option<String>, Option<String>)> {
        container(d)
            .env
            .iter()
            .flatten()
            .map(|e| {
                let key = e.value_from.as_ref().map(|f| {
                    let r = f.secret_key_ref.as_ref().unwrap();
                    assert_eq!(r.name, "checkout-database");
                    assert_eq!(r.optional, Some(false));
                    r.key.clone()
                });
                (e.name.clone(), e.value.clone(), key)
            })
            .collect()
    }

    #[test]
    fn a_verifying_database_gets_url_libpq_env_the_ca_and_a_revision() {
        let d = deployment(true);
        let from = |k: &str| (k.to_owned(), None, Some(k.to_owned()));
        assert_eq!(
            env_of(&d),
            vec![
                ("PGPORT".to_owned(), Some("6543".to_owned()), None),
                from("DATABASE_URL"),
                // The user's PGPORT wins; it is not repeated.
                from("PGHOST"),
                from("PGDATABASE"),
                from("PGUSER"),
                from("PGPASSWORD"),
                from("PGSSLMODE"),
                from("PGSSLROOTCERT"),
            ]
        );
        let pod = d.spec.template.spec.as_ref().unwrap();
        let volumes = pod.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        let secret = volumes[0].secret.as_ref().unwrap();
        assert_eq!(volumes[0].name, DATABASE_CA_VOLUME);
        assert_eq!(secret.secret_name.as_deref(), Some("checkout-database"));
        let items = secret.items.as_ref().unwrap();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("ca.crt", "ca.crt")
        );
        assert_eq!(secret.default_mode, Some(0o444));
        let mounts = container(&d).volume_mounts.as_ref().unwrap();
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].name, DATABASE_CA_VOLUME);
        assert_eq!(mounts[0].read_only, Some(true));
        // The file the URL and PGSSLROOTCERT name is the one mounted.
        assert_eq!(
            format!("{}/{}", mounts[0].mount_path, items[0].path),
            common::names::DATABASE_CA_PATH
        );
        let template = d.spec.template.metadata.as_ref().unwrap();
        let annotations = template.annotations.as_ref().unwrap();
        assert_eq!(annotations[ANNOTATION_DATABASE_REVISION], "abc");
    }

    #[test]
    fn without_a_ca_nothing_is_mounted() {
        let d = deployment(false);
        assert!(d.spec.template.spec.as_ref().unwrap().volumes.is_none());
        assert!(container(&d).volume_mounts.is_none());
        assert!(!env_of(&d).iter().any(|(n, _, _)| n == "PGSSLROOTCERT"));
        assert!(env_of(&d).iter().any(|(n, _, _)| n == "PGSSLMODE"));
    }

    /// The desired hashes of Deployments with a database, pinned, so that a change of what
    /// they cover is a decision: they stayed the same when what the database gives the
    /// Pods moved out of the core (`1b588ab`), and changed once when every Pod template
    /// gained the spread over nodes (`50491ce`: one rollout at that upgrade, announced in
    /// docs/operators/upgrading.md).
    #[test]
    fn the_hashes_are_what_earlier_releases_built() {
        assert_eq!(
            desired_hash(&deployment(true)).unwrap(),
            "95ca7019b7c0497fb941c20af3e7dc69"
        );
        assert_eq!(
            desired_hash(&deployment(false)).unwrap(),
            "a8eb561197df5bbfa095f43095aec28d"
        );
    }
}
