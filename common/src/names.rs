//! Names, labels and markers shared by the webhook, the controller and the chart.

use std::collections::BTreeMap;

/// API group of the AppService resource.
pub const GROUP: &str = "platform.example.com";
/// Name of the CRD object.
pub const CRD_NAME: &str = "appservices.platform.example.com";
/// Finalizer that holds an AppService until external cleanup succeeded.
pub const FINALIZER: &str = "platform.example.com/cleanup";
/// Field manager of every server-side apply the controller makes.
pub const FIELD_MANAGER: &str = "appservice-controller";
/// Name of the coordination.k8s.io Lease the controller replicas elect a leader on.
pub const LEASE_NAME: &str = "appservice-controller";

/// The ring of shards when `--shard-ring` is not given (`--sharding`).
pub const DEFAULT_SHARD_RING: &str = "appservice-operator";
/// Label on each member Lease of a ring: `platform.example.com/shard-ring: <ring>`.
pub const LABEL_SHARD_RING: &str = "platform.example.com/shard-ring";
/// Prefix of the owner label `shard.platform.example.com/<ring>: <identity>`.
pub const SHARD_LABEL_PREFIX: &str = "shard.platform.example.com/";
/// Prefix of the drain label `drain.shard.platform.example.com/<ring>: "true"`.
pub const DRAIN_LABEL_PREFIX: &str = "drain.shard.platform.example.com/";

/// The label an older release's sharder put on an AppService and its children to say
/// which shard of `ring` owned them (read by nothing now; refused to tenants by the
/// chart's policy for one more release).
pub fn shard_label(ring: &str) -> String {
    format!("{SHARD_LABEL_PREFIX}{ring}")
}

/// The label an older release's sharder put on an AppService whose owner in `ring` had
/// to let it go (read by nothing now, like [`shard_label`]).
pub fn drain_label(ring: &str) -> String {
    format!("{DRAIN_LABEL_PREFIX}{ring}")
}

/// The membership Lease of shard `identity` in `ring`.
pub fn shard_lease_name(ring: &str, identity: &str) -> String {
    format!("{ring}-shard-{identity}")
}

/// `app.kubernetes.io/name`: the application's name.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance`: the AppService a child belongs to.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/managed-by`: who manages a child.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`] on every child.
pub const MANAGED_BY: &str = "appservice-operator";

/// Annotation on each child holding a hash of the object the controller last applied:
/// the controller compares it, and the few values it is responsible for, with the live
/// object instead of re-implementing the API server's merge rules.
pub const ANNOTATION_DESIRED_HASH: &str = "platform.example.com/desired-hash";

/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `ports` list when
/// `port` alone cannot express it (more ports, another name or protocol). Written and read
/// only by conversion ([`crate::conversion`]), so an object created in `v1beta1` survives a
/// read-edit-write by a `v1alpha1` client.
pub const ANNOTATION_V1BETA1_PORTS: &str = "platform.example.com/v1beta1-ports";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `podSecurity`,
/// which `v1alpha1` has no field for. Written and read only by conversion, so a
/// `v1alpha1` client's read-edit-write keeps the user and group ids a `v1beta1` client
/// set.
pub const ANNOTATION_V1BETA1_POD_SECURITY: &str = "platform.example.com/v1beta1-pod-security";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `rollout`
/// (`maxSurge`, `maxUnavailable`), which `v1alpha1` has no field for. Written and read
/// only by conversion, like [`ANNOTATION_V1BETA1_POD_SECURITY`].
pub const ANNOTATION_V1BETA1_ROLLOUT: &str = "platform.example.com/v1beta1-rollout";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `canary`
/// (`image`, `replicas`). Written and read only by conversion.
pub const ANNOTATION_V1BETA1_CANARY: &str = "platform.example.com/v1beta1-canary";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `config` (the
/// ConfigMaps and Secrets its Pods read). Written and read only by conversion.
pub const ANNOTATION_V1BETA1_CONFIG: &str = "platform.example.com/v1beta1-config";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `autoscaling`.
/// Written and read only by conversion.
pub const ANNOTATION_V1BETA1_AUTOSCALING: &str = "platform.example.com/v1beta1-autoscaling";
/// Annotation on a `v1alpha1` AppService holding, as JSON, the `v1beta1` `expose`.
/// Written and read only by conversion.
pub const ANNOTATION_V1BETA1_EXPOSE: &str = "platform.example.com/v1beta1-expose";
/// Annotation on a `v1beta1` AppService holding, as JSON, the `v1alpha1` `database` that
/// `v1beta1` cannot express (`enabled: false`, with or without a class). Written and read
/// only by conversion.
pub const ANNOTATION_V1ALPHA1_DATABASE: &str = "platform.example.com/v1alpha1-database";

/// Every annotation conversion writes and reads ([`crate::conversion`]): what a reader of
/// one version must take into account to see the object as the other version has it
/// (the webhook keeps exactly these when it judges a `v1alpha1` object in the hub form).
pub const CONVERSION_ANNOTATIONS: [&str; 8] = [
    ANNOTATION_V1BETA1_AUTOSCALING,
    ANNOTATION_V1BETA1_EXPOSE,
    ANNOTATION_V1BETA1_PORTS,
    ANNOTATION_V1BETA1_POD_SECURITY,
    ANNOTATION_V1BETA1_ROLLOUT,
    ANNOTATION_V1BETA1_CANARY,
    ANNOTATION_V1BETA1_CONFIG,
    ANNOTATION_V1ALPHA1_DATABASE,
];

/// Environment variable through which the application receives its database URL.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// Name of the Pod template's volume holding the database server's CA (the `ca.crt` of
/// the `<name>-database` Secret), present when the class verifies the server.
pub const DATABASE_CA_VOLUME: &str = "database-ca";
/// Where that volume is mounted in the application container (read-only).
pub const DATABASE_CA_DIR: &str = "/var/run/secrets/platform.example.com/database";
/// The CA file in the container: named by `sslrootcert=` in `DATABASE_URL` and by
/// `PGSSLROOTCERT`.
pub const DATABASE_CA_PATH: &str = "/var/run/secrets/platform.example.com/database/ca.crt";
/// Annotation on the Deployment's Pod template: a hash of the data of the
/// `<name>-database` Secret the Pods get. Environment variables from a Secret are read
/// when a container starts, so when the Secret's data changes (a new password, a new CA,
/// another host) this changes too and the Deployment rolls its Pods onto it.
pub const ANNOTATION_DATABASE_REVISION: &str = "platform.example.com/database-revision";

/// Annotation on the Pod template: a digest of the data of every ConfigMap and Secret the
/// Pods read (`spec.config`, and those `env` takes keys from). A change of their data
/// changes it, and so rolls the Pods; present only when the AppService reads any.
pub const ANNOTATION_CONFIG_REVISION: &str = "platform.example.com/config-revision";
/// What the names of the Pod volumes of `spec.config` start with: the `i`-th entry's
/// volume is `<prefix><i>`. The controller owns every volume so named.
pub const CONFIG_VOLUME_PREFIX: &str = "appsvc-config-";

/// Whether the Pod volume (or mount) `name` is the controller's: the database CA's, or
/// one of `spec.config`'s.
pub fn is_owned_pod_volume(name: &str) -> bool {
    OWNED_POD_VOLUMES.contains(&name) || name.starts_with(CONFIG_VOLUME_PREFIX)
}

/// The Pod volumes (and their mounts in the application container) the controller owns,
/// whichever provider adds them: put back when another writer changes or removes them,
/// and removed when none is wanted. Every other volume is someone else's to keep.
pub const OWNED_POD_VOLUMES: [&str; 1] = [DATABASE_CA_VOLUME];
/// The Pod template annotations the controller owns, whichever provider adds them (as
/// [`OWNED_POD_VOLUMES`]); every other annotation of the template is someone else's.
pub const OWNED_TEMPLATE_ANNOTATIONS: [&str; 2] =
    [ANNOTATION_DATABASE_REVISION, ANNOTATION_CONFIG_REVISION];

/// `platform.example.com/track`: which Deployment of an AppService a Pod belongs to, on
/// the canary Deployment, its selector and its Pods ([`TRACK_CANARY`]). The stable
/// Deployment's Pods do not carry it: its selector is immutable and predates it.
pub const LABEL_TRACK: &str = "platform.example.com/track";
/// Value of [`LABEL_TRACK`] on the canary's Pods.
pub const TRACK_CANARY: &str = "canary";
/// What follows the AppService's name in the name of its canary Deployment.
pub const CANARY_SUFFIX: &str = "-canary";

/// Labels that select the Pods of an AppService (the Deployment's and the Service's selector).
///
/// Deliberately small and immutable: a Deployment's selector cannot change after creation.
pub fn selector_labels(app: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_INSTANCE.to_owned(), app.to_owned()),
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
    ])
}

/// Labels carried by every child object and Pod: the selector plus `app.kubernetes.io/name`.
pub fn child_labels(app: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(app);
    labels.insert(LABEL_NAME.to_owned(), app.to_owned());
    labels
}

/// The selector in string form, as `status.selector` carries it for the scale subresource.
pub fn selector_string(app: &str) -> String {
    selector_labels(app)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Name of the Deployment of an AppService.
pub fn deployment_name(app: &str) -> String {
    app.to_owned()
}

/// Name of the canary Deployment of an AppService.
pub fn canary_deployment_name(app: &str) -> String {
    format!("{app}{CANARY_SUFFIX}")
}

/// Labels of the canary Deployment, its Pods and its selector: the child labels (so the
/// Service and `status.selector` select its Pods too) plus [`LABEL_TRACK`].
pub fn canary_labels(app: &str) -> BTreeMap<String, String> {
    let mut labels = child_labels(app);
    labels.insert(LABEL_TRACK.to_owned(), TRACK_CANARY.to_owned());
    labels
}

/// The canary Deployment's selector: the stable selector plus [`LABEL_TRACK`], so it
/// selects only the canary's Pods.
pub fn canary_selector_labels(app: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(app);
    labels.insert(LABEL_TRACK.to_owned(), TRACK_CANARY.to_owned());
    labels
}

/// Name of the Service of an AppService.
pub fn service_name(app: &str) -> String {
    app.to_owned()
}

/// Name of the PodDisruptionBudget of an AppService (while it runs two or more Pods).
pub fn budget_name(app: &str) -> String {
    app.to_owned()
}

/// Name of the HorizontalPodAutoscaler of an AppService (while `spec.autoscaling` asks for one).
pub fn autoscaler_name(app: &str) -> String {
    app.to_owned()
}

/// Name of the HTTPRoute of an AppService (while `spec.expose` asks for one).
pub fn route_name(app: &str) -> String {
    app.to_owned()
}

/// The fewest Pods an AppService runs for it to get a PodDisruptionBudget: with one Pod,
/// a budget that allows no eviction would block every node drain, and one that allows
/// one protects nothing.
pub const MIN_REPLICAS_FOR_BUDGET: i32 = 2;

/// The node label the Pods of an AppService are spread over by default.
pub const SPREAD_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// The entries of the Pod template's `topologySpreadConstraints` the controller owns,
/// by `topologyKey` (as [`OWNED_POD_VOLUMES`] by name); others' entries are theirs.
pub const OWNED_SPREAD_KEYS: [&str; 1] = [SPREAD_TOPOLOGY_KEY];

/// What follows the AppService's name in the name of its credentials Secret.
pub const DATABASE_SECRET_SUFFIX: &str = "-database";

/// Name of the Secret holding an AppService's database credentials.
pub fn database_secret_name(app: &str) -> String {
    format!("{app}{DATABASE_SECRET_SUFFIX}")
}

/// In-cluster URL of an AppService's Service.
pub fn endpoint(app: &str, namespace: &str, port: i32) -> String {
    format!("http://{app}.{namespace}.svc:{port}")
}

/// Annotation on the credentials Secret: the class the database lives on, so that
/// disabling the database later finds the server even when the spec no longer says.
pub const CLASS_ANNOTATION: &str = "platform.example.com/database-class";

/// Annotation on the credentials Secret while its password may not be the role's yet.
pub const PASSWORD_PENDING_ANNOTATION: &str = "platform.example.com/password-pending";

/// Annotation on the credentials Secret: the SHA-256 of the password the controller set
/// on the role. An edit of `PGPASSWORD` (or of the password in `DATABASE_URL`) is told
/// from the real one by it, so the Secret is put back with the role's password instead
/// of handing out one that does not work. (The password is random and long: its hash
/// tells nothing, and whoever may read the annotation may read the data anyway.)
pub const PASSWORD_HASH_ANNOTATION: &str = "platform.example.com/password-sha256";

/// `kubectl annotate secret <webhook>-ca platform.example.com/rotate-ca-before=$(date -u +%FT%TZ)`
/// rotates (with the usual overlap) a CA made before that time.
pub const ROTATE_ANNOTATION: &str = "platform.example.com/rotate-ca-before";

/// Annotation that marks the class used when an AppService asks for a database without
/// naming one (value `"true"`), as `storageclass.kubernetes.io/is-default-class` does.
pub const DEFAULT_CLASS_ANNOTATION: &str = "databaseclass.platform.example.com/is-default-class";

/// Label an admin Secret must carry (value `"true"`) before any DatabaseClass may use
/// it: naming a Secret in `adminCredentials` is not enough, so a class cannot borrow a
/// login (or any other Secret of the operator's namespace) nobody offered.
pub const ADMIN_SECRET_LABEL: &str = "platform.example.com/database-admin";

/// The keys of the `<name>-database` Secret: what the controller writes and what the
/// Deployment's Pods read (by these names, as libpq and most clients expect them).
pub mod database_keys {
    pub const DATABASE_URL: &str = "DATABASE_URL";
    pub const PGHOST: &str = "PGHOST";
    pub const PGPORT: &str = "PGPORT";
    pub const PGDATABASE: &str = "PGDATABASE";
    pub const PGUSER: &str = "PGUSER";
    pub const PGPASSWORD: &str = "PGPASSWORD";
    pub const PGSSLMODE: &str = "PGSSLMODE";
    /// Where the Pod finds the CA (`verify-full` only): the path the Deployment mounts
    /// [`CA_CRT`] at.
    pub const PGSSLROOTCERT: &str = "PGSSLROOTCERT";
    /// The CA of the server, for clients that verify it (`verify-full`).
    pub const CA_CRT: &str = "ca.crt";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selector_string_matches_architecture() {
        assert_eq!(
            selector_string("checkout"),
            "app.kubernetes.io/instance=checkout,app.kubernetes.io/managed-by=appservice-operator"
        );
    }

    #[test]
    fn child_labels_extend_selector() {
        let labels = child_labels("checkout");
        assert_eq!(labels.len(), 3);
        assert_eq!(labels[LABEL_NAME], "checkout");
        for (k, v) in selector_labels("checkout") {
            assert_eq!(labels[&k], v);
        }
    }

    #[test]
    fn endpoint_and_child_names() {
        assert_eq!(
            endpoint("checkout", "production", 8080),
            "http://checkout.production.svc:8080"
        );
        assert_eq!(deployment_name("a"), "a");
        assert_eq!(service_name("a"), "a");
        assert_eq!(database_secret_name("a"), "a-database");
        assert_eq!(canary_deployment_name("a"), "a-canary");
    }

    #[test]
    fn canary_labels_and_selector_extend_the_stable_ones() {
        let labels = canary_labels("checkout");
        let selector = canary_selector_labels("checkout");
        for (k, v) in child_labels("checkout") {
            assert_eq!(labels[&k], v);
        }
        for (k, v) in selector_labels("checkout") {
            assert_eq!(selector[&k], v);
        }
        assert_eq!(labels[LABEL_TRACK], TRACK_CANARY);
        assert_eq!(selector[LABEL_TRACK], TRACK_CANARY);
        // The Pods carry everything the canary selector asks for.
        for (k, v) in &selector {
            assert_eq!(&labels[k], v);
        }
    }
}
