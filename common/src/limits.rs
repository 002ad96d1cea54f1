//! The numbers of the `AppService` API: the bounds of every field and the default value
//! of every scalar one. Both versions, the CRD schema, defaulting ([`crate::defaults`]),
//! validation and the controller read them here.

/// Bounds of `spec.replicas`.
pub const MIN_REPLICAS: i32 = 0;
pub const MAX_REPLICAS: i32 = 1000;
/// The fewest Pods a canary (`spec.canary.replicas`) runs; the most is `spec.replicas`.
pub const MIN_CANARY_REPLICAS: i32 = 1;
/// Bounds of a port number (`spec.port`, `spec.ports[].port`).
pub const MIN_PORT: i32 = 1;
pub const MAX_PORT: i32 = 65535;
/// Longest accepted image reference; registries cap names well below this.
pub const MAX_IMAGE_LEN: usize = 512;
/// Most environment variables one AppService may declare.
pub const MAX_ENV: usize = 128;
/// Longest environment variable name.
pub const MAX_ENV_NAME_LEN: usize = 256;
/// Longest literal environment variable value (32 KiB).
pub const MAX_ENV_VALUE_LEN: usize = 32 * 1024;
/// Longest DNS label (RFC 1035, RFC 1123), as Kubernetes checks names.
pub const MAX_LABEL_LEN: usize = 63;
/// Longest AppService name: children include a Service, whose name is a DNS-1035 label.
pub const MAX_NAME_LEN: usize = MAX_LABEL_LEN;
/// Longest DNS-1123 subdomain: object names such as Secrets, and host names.
pub const MAX_SUBDOMAIN_LEN: usize = 253;
/// Longest database class name (a DNS-1123 subdomain).
pub const MAX_CLASS_LEN: usize = MAX_SUBDOMAIN_LEN;
/// Most ports one AppService (`v1beta1`) may declare.
pub const MAX_PORTS: usize = 16;
/// Most ConfigMaps and Secrets one AppService (`v1beta1`) may read through `spec.config`.
pub const MAX_CONFIG_SOURCES: usize = 16;
/// Longest mount path of a `spec.config` entry.
pub const MAX_MOUNT_PATH_LEN: usize = 512;
/// Most host names one AppService may be reached by (`spec.expose.hostnames`).
pub const MAX_EXPOSE_HOSTNAMES: usize = 16;
/// Most path prefixes of `spec.expose.paths`.
pub const MAX_EXPOSE_PATHS: usize = 16;
/// Longest path prefix of `spec.expose.paths` (the Gateway API's own bound on a path).
pub const MAX_EXPOSE_PATH_LEN: usize = 1024;
/// `spec.expose.paths` when omitted: everything under the host names.
pub const DEFAULT_EXPOSE_PATH: &str = "/";
/// Most entries of `spec.resources.limits` or `.requests` (Kubernetes knows a handful of
/// resource names; extended resources add a few more). Checked by `validate` and, before
/// decoding, by the webhook.
pub const MAX_RESOURCE_ENTRIES: usize = 32;
/// Every bounded list (or map) of the spec: its path and the most entries it may have.
/// One table for all who bound them: `validate` (and the CRD's `maxItems`, from the same
/// constants), the webhook's size check before decoding, the CEL cost estimate (a
/// comprehension over one of these runs at most this many times) and
/// `e2e/tests/rule_drift.rs`. A webhook test checks each entry against all three.
pub const LIST_BOUNDS: &[(&str, usize)] = &[
    ("spec.env", MAX_ENV),
    ("spec.ports", MAX_PORTS),
    ("spec.config", MAX_CONFIG_SOURCES),
    ("spec.expose.hostnames", MAX_EXPOSE_HOSTNAMES),
    ("spec.expose.paths", MAX_EXPOSE_PATHS),
    ("spec.resources.limits", MAX_RESOURCE_ENTRIES),
    ("spec.resources.requests", MAX_RESOURCE_ENTRIES),
    ("spec.resources.claims", MAX_RESOURCE_ENTRIES),
];

/// The bound of the list at `path` (dotted, from the object: `spec.env`), if it has one.
pub fn list_bound(path: &str) -> Option<usize> {
    LIST_BOUNDS
        .iter()
        .find_map(|(p, max)| (*p == path).then_some(*max))
}

/// Longest port name: Kubernetes port names are IANA service names of at most 15 characters.
pub const MAX_PORT_NAME_LEN: usize = 15;
/// Bounds of a user or group id (`spec.podSecurity.runAsUser`, `runAsGroup`, `fsGroup`):
/// what Kubernetes accepts in a Pod's security context.
pub const MIN_ID: i64 = 0;
pub const MAX_ID: i64 = 2_147_483_647;
/// The largest percentage a rollout setting (`spec.rollout.maxSurge`, `maxUnavailable`)
/// may be.
pub const MAX_ROLLOUT_PERCENT: u32 = 100;
/// The lowest `runAsUser` the `Restricted` profile allows: 0 is root.
pub const MIN_NON_ROOT_UID: i64 = 1;

/// Bounds of `spec.autoscaling.targetCPUUtilizationPercentage`: a percentage of the
/// container's CPU request, which the Pods may exceed up to their limit.
pub const MIN_TARGET_CPU_UTILIZATION: i32 = 1;
pub const MAX_TARGET_CPU_UTILIZATION: i32 = 1000;
/// The fewest replicas `spec.autoscaling.minReplicas` may say (an autoscaler's minimum;
/// 0 would need the alpha feature `HPAScaleToZero`).
pub const MIN_AUTOSCALING_REPLICAS: i32 = 1;

/// `spec.replicas` when omitted.
pub const DEFAULT_REPLICAS: i32 = 1;
/// The number of the default port (`v1beta1`), and `spec.port` when omitted (`v1alpha1`).
pub const DEFAULT_PORT: i32 = 8080;

/// `spec.autoscaling.minReplicas` when omitted (the HorizontalPodAutoscaler's own).
pub const DEFAULT_MIN_REPLICAS: i32 = 1;
/// `spec.autoscaling.targetCPUUtilizationPercentage` when omitted (the
/// HorizontalPodAutoscaler's own default target).
pub const DEFAULT_TARGET_CPU_UTILIZATION: i32 = 80;
/// `spec.canary.replicas` when omitted.
pub const DEFAULT_CANARY_REPLICAS: i32 = 1;
/// `spec.rollout.maxSurge` when omitted: the Deployment's own default.
pub const DEFAULT_MAX_SURGE: &str = "25%";
/// `spec.rollout.maxUnavailable` when omitted: the Deployment's own default.
pub const DEFAULT_MAX_UNAVAILABLE: &str = "25%";
