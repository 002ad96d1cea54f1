//! What `spec.config` puts in the Pod template: an `envFrom` entry for each ConfigMap or
//! Secret read as variables, and a read-only volume and its mount for each read as files.
//! The revision of their data (what rolls the Pods when it changes) is
//! [`crate::config_revision`]'s.

use common::ConfigSource;
use common::names::CONFIG_VOLUME_PREFIX;
use k8s_openapi::api::core::v1::{
    ConfigMapEnvSource, ConfigMapVolumeSource, EnvFromSource, SecretEnvSource, SecretVolumeSource,
    Volume, VolumeMount,
};

/// The mode of the files: the API server's default, said here so that the stored volume
/// is the one built (and readable by the application's non-root user, as by default).
const FILE_MODE: i32 = 0o644;

/// The Pod template's parts for `config`, in its order: the container's `envFrom`, the
/// Pod's volumes, and their mounts in the container.
pub struct ConfigParts {
    pub env_from: Vec<EnvFromSource>,
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
}

/// The parts of `config` (validated: an entry without exactly one object is skipped).
pub fn config_parts(config: &[ConfigSource]) -> ConfigParts {
    let mut parts = ConfigParts {
        env_from: Vec::new(),
        volumes: Vec::new(),
        mounts: Vec::new(),
    };
    for (i, entry) in config.iter().enumerate() {
        let (config_map, secret) = match (&entry.config_map, &entry.secret) {
            (Some(name), None) => (Some(name.clone()), None),
            (None, Some(name)) => (None, Some(name.clone())),
            _ => continue,
        };
        let Some(path) = &entry.mount_path else {
            parts.env_from.push(EnvFromSource {
                config_map_ref: config_map.map(|name| ConfigMapEnvSource {
                    name,
                    optional: None,
                }),
                secret_ref: secret.map(|name| SecretEnvSource {
                    name,
                    optional: None,
                }),
                ..EnvFromSource::default()
            });
            continue;
        };
        let name = format!("{CONFIG_VOLUME_PREFIX}{i}");
        parts.volumes.push(Volume {
            name: name.clone(),
            config_map: config_map.map(|name| ConfigMapVolumeSource {
                name,
                default_mode: Some(FILE_MODE),
                ..ConfigMapVolumeSource::default()
            }),
            secret: secret.map(|name| SecretVolumeSource {
                secret_name: Some(name),
                default_mode: Some(FILE_MODE),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
        parts.mounts.push(VolumeMount {
            name,
            mount_path: path.clone(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_and_files_in_the_order_of_the_spec() {
        let config = vec![
            ConfigSource {
                config_map: Some("settings".into()),
                ..ConfigSource::default()
            },
            ConfigSource {
                secret: Some("keys".into()),
                mount_path: Some("/etc/keys".into()),
                ..ConfigSource::default()
            },
            ConfigSource {
                secret: Some("tokens".into()),
                ..ConfigSource::default()
            },
            ConfigSource {
                config_map: Some("settings".into()),
                mount_path: Some("/etc/app".into()),
                ..ConfigSource::default()
            },
        ];
        let parts = config_parts(&config);
        let env: Vec<_> = parts
            .env_from
            .iter()
            .map(|e| {
                (
                    e.config_map_ref.as_ref().map(|r| r.name.as_str()),
                    e.secret_ref.as_ref().map(|r| r.name.as_str()),
                )
            })
            .collect();
        assert_eq!(env, [(Some("settings"), None), (None, Some("tokens"))]);
        let volumes: Vec<_> = parts.volumes.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["appsvc-config-1", "appsvc-config-3"]);
        assert_eq!(
            parts.volumes[0]
                .secret
                .as_ref()
                .and_then(|s| s.secret_name.as_deref()),
            Some("keys")
        );
        assert_eq!(
            parts.volumes[1]
                .config_map
                .as_ref()
                .map(|c| c.name.as_str()),
            Some("settings")
        );
        assert!(parts.mounts.iter().all(|m| m.read_only == Some(true)));
        assert_eq!(parts.mounts[0].mount_path, "/etc/keys");
        assert!(config_parts(&[]).volumes.is_empty());
    }
}
