//! The security contexts of the Pod template, from `spec.podSecurity`: what Pod Security
//! admission checks when the ReplicaSet controller creates each Pod.
//!
//! Under `Restricted` (the default) the template meets the Pod Security Standard of that
//! name, so its Pods are admitted in a namespace enforcing any level:
//!
//! | restricted control | where | value |
//! | --- | --- | --- |
//! | running as non-root | Pod | `runAsNonRoot: true` (and `runAsUser`, never 0, when given) |
//! | seccomp | Pod | `seccompProfile: {type: RuntimeDefault}` |
//! | privilege escalation | container | `allowPrivilegeEscalation: false` |
//! | capabilities | container | `capabilities: {drop: [ALL]}`, none added |
//! | volume types | Pod | only Secret volumes and the projected service-account token |
//!
//! and every baseline control holds because nothing here asks for it: no host
//! namespaces, ports or paths, no privileged container, no added capability, no
//! AppArmor, SELinux, `procMount` or sysctl setting, probes without `host`.
//!
//! Under `Baseline` the process runs as the image's user (root included) with the
//! container runtime's default capabilities; privilege escalation stays off and seccomp
//! stays `RuntimeDefault`, both of which `baseline` allows. Whether such Pods are admitted
//! is the namespace's Pod Security level's decision.
//!
//! Both contexts are set at the level Pod Security reads them from, the Pod's where the
//! API has one (so a container someone else adds to the Pod inherits the user and the
//! seccomp profile), the container's otherwise.

use common::{PodSecurity, SecurityProfile};
use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

/// The seccomp profile of every Pod: the container runtime's default.
const SECCOMP_RUNTIME_DEFAULT: &str = "RuntimeDefault";
/// What `capabilities.drop` lists under `Restricted`.
const DROP_ALL: &str = "ALL";

/// The Pod's security context: who the process runs as, and its seccomp profile.
pub(super) fn pod_security_context(security: &PodSecurity) -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: (security.profile() == SecurityProfile::Restricted).then_some(true),
        run_as_user: security.run_as_user,
        run_as_group: security.run_as_group,
        fs_group: security.fs_group,
        seccomp_profile: Some(SeccompProfile {
            type_: SECCOMP_RUNTIME_DEFAULT.to_owned(),
            localhost_profile: None,
        }),
        ..PodSecurityContext::default()
    }
}

/// The application container's security context: what only a container can say.
pub(super) fn container_security_context(security: &PodSecurity) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: (security.profile() == SecurityProfile::Restricted).then(|| Capabilities {
            add: None,
            drop: Some(vec![DROP_ALL.to_owned()]),
        }),
        // Only when asked: `false` is what an absent field means.
        read_only_root_filesystem: security.read_only_root_filesystem.filter(|ro| *ro),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn with(profile: Option<SecurityProfile>) -> PodSecurity {
        PodSecurity {
            profile,
            ..PodSecurity::default()
        }
    }

    #[test]
    fn restricted_by_default() {
        for security in [
            PodSecurity::default(),
            with(Some(SecurityProfile::Restricted)),
        ] {
            assert_eq!(
                serde_json::to_value(pod_security_context(&security)).unwrap(),
                json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}})
            );
            assert_eq!(
                serde_json::to_value(container_security_context(&security)).unwrap(),
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
            );
        }
    }

    #[test]
    fn ids_and_read_only_root_are_passed_on() {
        let security = PodSecurity {
            profile: None,
            run_as_user: Some(10001),
            run_as_group: Some(10002),
            fs_group: Some(2000),
            read_only_root_filesystem: Some(true),
        };
        assert_eq!(
            serde_json::to_value(pod_security_context(&security)).unwrap(),
            json!({"runAsNonRoot": true, "runAsUser": 10001, "runAsGroup": 10002,
                   "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        assert_eq!(
            serde_json::to_value(container_security_context(&security)).unwrap(),
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                   "readOnlyRootFilesystem": true})
        );
        let writable = PodSecurity {
            read_only_root_filesystem: Some(false),
            ..security
        };
        assert_eq!(
            container_security_context(&writable).read_only_root_filesystem,
            None
        );
    }

    #[test]
    fn baseline_runs_as_the_image_user_with_default_capabilities() {
        let security = PodSecurity {
            run_as_user: Some(0),
            ..with(Some(SecurityProfile::Baseline))
        };
        assert_eq!(
            serde_json::to_value(pod_security_context(&security)).unwrap(),
            json!({"runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}})
        );
        assert_eq!(
            serde_json::to_value(container_security_context(&security)).unwrap(),
            json!({"allowPrivilegeEscalation": false})
        );
    }
}
