//! The pod view: what a Pod of a Deployment would get, without running it.
//!
//! kwok marks Pods Ready without starting a container, so nothing in the tests reads
//! the environment and the files a Pod of our Deployments is given. [`PodView::of`]
//! stands in for the kubelet: from a Deployment as the API server has it, it resolves
//! the environment of one container and materialises its Secret and ConfigMap volumes,
//! and [`PodView::command`] runs a real client with exactly that and nothing of the
//! test process (`env_clear`, an empty `HOME`).
//!
//! What it resolves, as the kubelet does:
//! * `envFrom` (Secrets and ConfigMaps, with `prefix`; keys that cannot be variable
//!   names are skipped), then `env` in order, a later variable replacing an earlier one;
//!   `value` with `$(VAR)` references to earlier variables expanded (`$$` is `$`);
//!   `valueFrom.secretKeyRef` and `configMapKeyRef`; `fieldRef` for `metadata.name`
//!   (a made-up Pod name), `metadata.namespace`, `metadata.labels['…']`,
//!   `metadata.annotations['…']` (from the template) and `spec.serviceAccountName`;
//! * the container's `volumeMounts` of `secret`, `configMap` and `emptyDir` volumes,
//!   honouring `items` (key to path, per-item `mode`), `defaultMode` (0644 when unset)
//!   and `subPath`;
//! * a missing object or key that is not `optional` is an error naming it, as it would
//!   keep the container from starting; an optional one is skipped.
//!
//! **Paths.** The files cannot be written at their absolute mount paths, so each mount
//! `/p` is materialised at `<root>/p` ([`PodView::root`]), and every occurrence of a
//! mount path at the start of a path in a resolved variable (after `=`, `:`, a space,
//! ... or at the start of the value: `sslrootcert=/p/ca.crt`, `PGSSLROOTCERT=/p/ca.crt`)
//! is rewritten to `<root>/p`, longest mount first, in one pass. `HOME` is an empty
//! directory of its own unless the container sets it (then it is rewritten the same
//! way). Anything else of a real Pod (the image's files, its user, other volume types,
//! `resourceFieldRef`) is not simulated: those fail clearly rather than silently.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, KeyToPath, PodSpec, Secret, Volume};
use kube::{Api, Client};

use crate::error::{Error, Result, io};

/// The mode of a projected file when neither the item nor the volume says
/// (the API server's default `defaultMode`).
const DEFAULT_MODE: i32 = 0o644;

/// What one container of a Pod of a Deployment gets: its environment and its files.
#[derive(Debug)]
pub struct PodView {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    /// Mount paths in the Pod, each with the volume mounted there.
    mounts: Vec<(String, String)>,
}

fn fail(what: impl Into<String>) -> Error {
    Error::PodView(what.into())
}

/// Everything a Pod's volumes and variables read from, fetched once per object.
struct Sources<'a> {
    namespace: &'a str,
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    secret_cache: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
    config_map_cache: BTreeMap<String, Option<BTreeMap<String, Vec<u8>>>>,
}

impl<'a> Sources<'a> {
    fn new(client: &Client, namespace: &'a str) -> Self {
        Sources {
            namespace,
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            secret_cache: BTreeMap::new(),
            config_map_cache: BTreeMap::new(),
        }
    }

    /// The data of Secret `name` (`None` when it does not exist).
    async fn secret(&mut self, name: &str) -> Result<Option<&BTreeMap<String, Vec<u8>>>> {
        if !self.secret_cache.contains_key(name) {
            let data = self
                .secrets
                .get_opt(name)
                .await
                .map_err(crate::error::kube(format!(
                    "reading Secret {}/{name}",
                    self.namespace
                )))?
                .map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.0))
                        .collect()
                });
            self.secret_cache.insert(name.to_owned(), data);
        }
        Ok(self.secret_cache.get(name).and_then(Option::as_ref))
    }

    /// The data of ConfigMap `name` (`data` and `binaryData`; `None` when it does not
    /// exist).
    async fn config_map(&mut self, name: &str) -> Result<Option<&BTreeMap<String, Vec<u8>>>> {
        if !self.config_map_cache.contains_key(name) {
            let data = self
                .config_maps
                .get_opt(name)
                .await
                .map_err(crate::error::kube(format!(
                    "reading ConfigMap {}/{name}",
                    self.namespace
                )))?
                .map(|c| {
                    let mut all: BTreeMap<String, Vec<u8>> = c
                        .data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, v.into_bytes()))
                        .collect();
                    for (k, v) in c.binary_data.unwrap_or_default() {
                        all.insert(k, v.0);
                    }
                    all
                });
            self.config_map_cache.insert(name.to_owned(), data);
        }
        Ok(self.config_map_cache.get(name).and_then(Option::as_ref))
    }
}

/// A Secret's or ConfigMap's data as text (environment variables are strings).
fn text(bytes: &[u8], what: &str) -> Result<String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| fail(format!("{what} is not UTF-8")))
}

/// Whether the kubelet would take `key` as a variable name from `envFrom`.
fn is_env_name(key: &str) -> bool {
    !key.is_empty() && !key.contains('=') && key.chars().all(|c| c.is_ascii_graphic())
}

/// `value` with `$(NAME)` of already defined variables replaced, `$$` as `$`, and
/// anything else (an unknown name, an unclosed reference) kept as written.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(n, _)| n == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Sets `name` to `value`: a later definition replaces an earlier one, as in a Pod.
fn set(env: &mut Vec<(String, String)>, name: &str, value: String) {
    env.retain(|(n, _)| n != name);
    env.push((name.to_owned(), value));
}

/// `metadata.labels['key']` → `key`.
fn bracketed<'s>(path: &'s str, field: &str) -> Option<&'s str> {
    path.strip_prefix(field)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

impl PodView {
    /// The view of the Deployment's first container.
    pub async fn of(client: &Client, deployment: &Deployment) -> Result<PodView> {
        let first = deployment
            .spec
            .template
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .map(|c| c.name.clone())
            .ok_or_else(|| fail("the Deployment has no container"))?;
        PodView::of_container(client, deployment, &first).await
    }

    /// The view of the container `container` of a Pod of `deployment`.
    pub async fn of_container(
        client: &Client,
        deployment: &Deployment,
        container: &str,
    ) -> Result<PodView> {
        let namespace = deployment
            .metadata
            .namespace
            .as_deref()
            .ok_or_else(|| fail("the Deployment has no namespace"))?;
        let name = deployment.metadata.name.as_deref().unwrap_or("deployment");
        let template = &deployment.spec.template;
        let pod: &PodSpec = template
            .spec
            .as_ref()
            .ok_or_else(|| fail("the Deployment's Pod template has no spec"))?;
        let c: &Container = pod
            .containers
            .iter()
            .find(|c| c.name == container)
            .ok_or_else(|| fail(format!("no container {container:?} in the Pod template")))?;
        let dir = tempfile::Builder::new()
            .prefix("appservice-pod-view-")
            .tempdir()
            .map_err(io("creating the pod view's directory"))?;
        let mut sources = Sources::new(client, namespace);

        // Files first: the environment's paths are rewritten to where they are.
        let mut mounts = Vec::new();
        for mount in c.volume_mounts.iter().flatten() {
            let volume = pod
                .volumes
                .iter()
                .flatten()
                .find(|v| v.name == mount.name)
                .ok_or_else(|| {
                    fail(format!(
                        "volumeMount {:?} names no volume of the Pod",
                        mount.name
                    ))
                })?;
            let target = mapped(dir.path(), &mount.mount_path)?;
            materialise(&mut sources, volume, mount.sub_path.as_deref(), &target).await?;
            mounts.push((mount.mount_path.clone(), mount.name.clone()));
        }
        // Longest first: a mount inside another is rewritten as itself.
        mounts.sort_by_key(|m| std::cmp::Reverse(m.0.len()));

        let mut env: Vec<(String, String)> = Vec::new();
        for from in c.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            let (kind, object, optional, data): (_, _, _, Option<BTreeMap<String, Vec<u8>>>) =
                if let Some(r) = &from.secret_ref {
                    let data = sources.secret(&r.name).await?.cloned();
                    ("Secret", r.name.clone(), r.optional == Some(true), data)
                } else if let Some(r) = &from.config_map_ref {
                    let data = sources.config_map(&r.name).await?.cloned();
                    ("ConfigMap", r.name.clone(), r.optional == Some(true), data)
                } else {
                    return Err(fail(
                        "an envFrom entry names neither a Secret nor a ConfigMap",
                    ));
                };
            match data {
                Some(data) => {
                    for (k, v) in data {
                        let var = format!("{prefix}{k}");
                        if is_env_name(&var) {
                            let value = text(&v, &format!("key {k} of {kind} {object}"))?;
                            set(&mut env, &var, value);
                        }
                    }
                }
                None if optional => {}
                None => {
                    return Err(fail(format!(
                        "envFrom: {kind} {namespace}/{object} does not exist and is not optional"
                    )));
                }
            }
        }
        let template_meta = template.metadata.clone().unwrap_or_default();
        for var in c.env.iter().flatten() {
            let Some(from) = &var.value_from else {
                let value = expand(var.value.as_deref().unwrap_or_default(), &env);
                set(&mut env, &var.name, value);
                continue;
            };
            let value = if let Some(r) = &from.secret_key_ref {
                let what = format!(
                    "{}: key {:?} of Secret {namespace}/{}",
                    var.name, r.key, r.name
                );
                match sources.secret(&r.name).await?.and_then(|d| d.get(&r.key)) {
                    Some(v) => Some(text(v, &what)?),
                    None if r.optional == Some(true) => None,
                    None => return Err(fail(format!("{what} is missing and not optional"))),
                }
            } else if let Some(r) = &from.config_map_key_ref {
                let what = format!(
                    "{}: key {:?} of ConfigMap {namespace}/{}",
                    var.name, r.key, r.name
                );
                match sources
                    .config_map(&r.name)
                    .await?
                    .and_then(|d| d.get(&r.key))
                {
                    Some(v) => Some(text(v, &what)?),
                    None if r.optional == Some(true) => None,
                    None => return Err(fail(format!("{what} is missing and not optional"))),
                }
            } else if let Some(f) = &from.field_ref {
                let path = f.field_path.as_str();
                let label = bracketed(path, "metadata.labels");
                let annotation = bracketed(path, "metadata.annotations");
                Some(match path {
                    "metadata.name" => format!("{name}-pod-view"),
                    "metadata.namespace" => namespace.to_owned(),
                    "spec.serviceAccountName" => pod
                        .service_account_name
                        .clone()
                        .unwrap_or_else(|| "default".to_owned()),
                    _ if label.is_some() => template_meta
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(label.unwrap_or_default()))
                        .cloned()
                        .unwrap_or_default(),
                    _ if annotation.is_some() => template_meta
                        .annotations
                        .as_ref()
                        .and_then(|l| l.get(annotation.unwrap_or_default()))
                        .cloned()
                        .unwrap_or_default(),
                    other => {
                        return Err(fail(format!(
                            "{}: fieldRef {other:?} is not simulated by the pod view",
                            var.name
                        )));
                    }
                })
            } else {
                return Err(fail(format!(
                    "{}: this valueFrom (resourceFieldRef, fileKeyRef) is not simulated by the pod view",
                    var.name
                )));
            };
            if let Some(value) = value {
                set(&mut env, &var.name, value);
            }
        }
        let env = env
            .into_iter()
            .map(|(k, v)| {
                let v = rewrite(&v, &mounts, dir.path());
                (k, v)
            })
            .collect::<Vec<_>>();
        let mut view = PodView { dir, env, mounts };
        if view.var("HOME").is_none() {
            let home = view.dir.path().join("home");
            std::fs::create_dir(&home).map_err(io("creating the pod view's HOME"))?;
            view.env
                .push(("HOME".to_owned(), home.display().to_string()));
        }
        Ok(view)
    }

    /// The container's environment, resolved, paths rewritten under [`PodView::root`].
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    /// The value of `name` in the container's environment.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Where the Pod's `/` is: a mount `/p` is at `root()/p`.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Where the file the Pod sees at `path_in_pod` (absolute) is.
    pub fn path(&self, path_in_pod: &str) -> PathBuf {
        self.dir.path().join(path_in_pod.trim_start_matches('/'))
    }

    /// The mount paths of the container, each with its volume's name.
    pub fn mounts(&self) -> &[(String, String)] {
        &self.mounts
    }

    /// Removes what the volume `volume` put at its mount paths, as if the Pod had not
    /// mounted it (a negative control: a client must fail without it). The environment
    /// is unchanged.
    pub fn unmount(&mut self, volume: &str) -> Result<()> {
        let mut found = false;
        for (path, name) in &self.mounts {
            if name == volume {
                found = true;
                let at = self.path(path);
                let removed = if at.is_dir() {
                    std::fs::remove_dir_all(&at)
                } else {
                    std::fs::remove_file(&at)
                };
                removed.map_err(io(format!("removing {}", at.display())))?;
            }
        }
        if found {
            Ok(())
        } else {
            Err(fail(format!("the container mounts no volume {volume:?}")))
        }
    }

    /// `program` (a path; see [`client_program`]) with only the container's environment:
    /// `env_clear`, then the resolved variables, and the working directory the view's
    /// `HOME` when the container sets none of its own.
    pub fn command(&self, program: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(program.as_ref());
        cmd.env_clear();
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some(home) = self.var("HOME") {
            cmd.current_dir(home);
        }
        cmd
    }
}

/// The PostgreSQL client `name` (`psql`) of the installation the harness runs the
/// server from: the binary itself, not a wrapper script that needs more of the
/// environment than a Pod has.
pub fn client_program(name: &str) -> Result<PathBuf> {
    let path = crate::postgres::pg_bin_dir()?.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Assets(format!(
            "no {name} next to the PostgreSQL server in {}; install the PostgreSQL client (`apt-get install -y postgresql-client`)",
            path.parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        )))
    }
}

/// `mount_path` (absolute, without `..`) under `root`.
fn mapped(root: &Path, mount_path: &str) -> Result<PathBuf> {
    if !mount_path.starts_with('/') || mount_path.split('/').any(|c| c == "..") {
        return Err(fail(format!(
            "mountPath {mount_path:?} is not an absolute path without `..`"
        )));
    }
    Ok(root.join(mount_path.trim_start_matches('/')))
}

/// Whether `c` may be part of a path (so a mount path right after it is not the start
/// of one).
fn in_path(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | '-' | '~')
}

/// `value` with each mount path that starts a path rewritten to its place under `root`;
/// `mounts` longest first, one pass (a rewritten path is not looked at again).
fn rewrite(value: &str, mounts: &[(String, String)], root: &Path) -> String {
    let root = root.display().to_string();
    let mut out = String::with_capacity(value.len());
    let mut i = 0;
    let mut previous: Option<char> = None;
    'scan: while i < value.len() {
        let rest = &value[i..];
        if previous.is_none_or(|p| !in_path(p)) {
            for (path, _) in mounts {
                let trimmed = path.trim_end_matches('/');
                if let Some(after) = rest.strip_prefix(trimmed)
                    && after.chars().next().is_none_or(|c| c == '/' || !in_path(c))
                {
                    out.push_str(&root);
                    out.push_str(trimmed);
                    i += trimmed.len();
                    previous = trimmed.chars().last();
                    continue 'scan;
                }
            }
        }
        let Some(c) = rest.chars().next() else { break };
        out.push(c);
        previous = Some(c);
        i += c.len_utf8();
    }
    out
}

/// A file of a volume at `path` (relative, no `..`) with `mode`.
fn write_file(dir: &Path, path: &str, bytes: &[u8], mode: i32) -> Result<()> {
    if path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return Err(fail(format!("item path {path:?} leaves the volume")));
    }
    let file = dir.join(path);
    if let Some(parent) = file.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    std::fs::write(&file, bytes).map_err(io(format!("writing {}", file.display())))?;
    let mode = u32::try_from(mode).map_err(|_| fail(format!("file mode {mode} is negative")))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode & 0o777))
        .map_err(io(format!("chmod {}", file.display())))
}

/// The files of `data` as a Secret or ConfigMap volume projects them: every key, or
/// only `items` (a missing key is an error unless the volume is optional).
fn project(
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
    what: &str,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    match items {
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(bytes) => {
                        write_file(dir, &item.path, bytes, item.mode.unwrap_or(default_mode))?
                    }
                    None if optional => {}
                    None => {
                        return Err(fail(format!(
                            "{what} has no key {:?} and the volume is not optional",
                            item.key
                        )));
                    }
                }
            }
        }
        None => {
            for (key, bytes) in data {
                write_file(dir, key, bytes, default_mode)?;
            }
        }
    }
    Ok(())
}

/// Writes what `volume` holds at `target` (its mount path under the root), or the
/// `sub_path` of it.
async fn materialise(
    sources: &mut Sources<'_>,
    volume: &Volume,
    sub_path: Option<&str>,
    target: &Path,
) -> Result<()> {
    let staging = tempfile::tempdir().map_err(io("creating a staging directory"))?;
    let full = staging.path().join("volume");
    let namespace = sources.namespace.to_owned();
    // A Secret or a ConfigMap volume: which object, how it is projected, and its data.
    let object = if let Some(s) = &volume.secret {
        let name = s
            .secret_name
            .clone()
            .ok_or_else(|| fail(format!("volume {:?} names no Secret", volume.name)))?;
        let data = sources.secret(&name).await?;
        Some((
            "Secret",
            name,
            s.optional,
            s.items.as_deref(),
            s.default_mode,
            data,
        ))
    } else if let Some(c) = &volume.config_map {
        let data = sources.config_map(&c.name).await?;
        Some((
            "ConfigMap",
            c.name.clone(),
            c.optional,
            c.items.as_deref(),
            c.default_mode,
            data,
        ))
    } else {
        None
    };
    if let Some((kind, name, optional, items, mode, data)) = object {
        let optional = optional == Some(true);
        let what = format!("{kind} {namespace}/{name} (volume {:?})", volume.name);
        match data {
            Some(data) => project(
                data,
                items,
                mode.unwrap_or(DEFAULT_MODE),
                optional,
                &what,
                &full,
            )?,
            None if optional => {
                std::fs::create_dir_all(&full).map_err(io("creating an empty volume"))?
            }
            None => return Err(fail(format!("{what} does not exist and is not optional"))),
        }
    } else if volume.empty_dir.is_some() {
        std::fs::create_dir_all(&full).map_err(io("creating an emptyDir"))?;
    } else {
        return Err(fail(format!(
            "volume {:?}: only secret, configMap and emptyDir volumes are simulated by the pod view",
            volume.name
        )));
    }
    let source = match sub_path.filter(|p| !p.is_empty()) {
        Some(sub) if sub.starts_with('/') || sub.split('/').any(|c| c == "..") => {
            return Err(fail(format!("subPath {sub:?} leaves the volume")));
        }
        Some(sub) => full.join(sub),
        None => full,
    };
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io(format!("creating {}", parent.display())))?;
    }
    copy(&source, target)
}

/// Copies a file or a directory tree, keeping the files' modes.
fn copy(from: &Path, to: &Path) -> Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to).map_err(io(format!("creating {}", to.display())))?;
        for entry in std::fs::read_dir(from).map_err(io(format!("reading {}", from.display())))? {
            let entry = entry.map_err(io(format!("reading {}", from.display())))?;
            copy(&entry.path(), &to.join(entry.file_name()))?;
        }
        Ok(())
    } else if from.exists() {
        std::fs::copy(from, to).map(|_| ()).map_err(io(format!(
            "copying {} to {}",
            from.display(),
            to.display()
        )))
    } else {
        Err(fail(format!(
            "{} does not exist in its volume (subPath?)",
            from.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn references_expand_as_in_a_pod() {
        let env = vec![("A".to_owned(), "1".to_owned())];
        assert_eq!(expand("x$(A)y", &env), "x1y");
        assert_eq!(expand("$(B)", &env), "$(B)");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("cost: 5$", &env), "cost: 5$");
        assert_eq!(expand("$(A", &env), "$(A");
    }

    #[test]
    fn mount_paths_are_rewritten_where_a_path_starts_and_only_once() {
        let root = Path::new("/tmp/view");
        let mounts = vec![
            ("/etc/app/certs".to_owned(), "certs".to_owned()),
            ("/etc/app".to_owned(), "config".to_owned()),
        ];
        let r = |v: &str| rewrite(v, &mounts, root);
        assert_eq!(
            r("postgres://u@h/d?sslmode=verify-full&sslrootcert=/etc/app/certs/ca.crt"),
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=/tmp/view/etc/app/certs/ca.crt"
        );
        assert_eq!(r("/etc/app/x.conf"), "/tmp/view/etc/app/x.conf");
        assert_eq!(r("/etc/app"), "/tmp/view/etc/app");
        assert_eq!(
            r("a:/etc/app/1 /etc/app/2"),
            "a:/tmp/view/etc/app/1 /tmp/view/etc/app/2"
        );
        // Not the start of a path, or another directory of the same prefix.
        assert_eq!(r("/opt/etc/app/x"), "/opt/etc/app/x");
        assert_eq!(r("/etc/apple"), "/etc/apple");
        assert_eq!(r("no paths"), "no paths");
    }

    #[test]
    fn items_modes_and_missing_keys_project_as_the_kubelet_does() {
        let dir = tempfile::tempdir().unwrap();
        let data = BTreeMap::from([
            ("ca.crt".to_owned(), b"PEM".to_vec()),
            ("PGPASSWORD".to_owned(), b"pw".to_vec()),
        ]);
        let items = [KeyToPath {
            key: "ca.crt".into(),
            path: "certs/root.crt".into(),
            ..KeyToPath::default()
        }];
        let out = dir.path().join("a");
        project(&data, Some(&items), 0o444, false, "Secret s", &out).unwrap();
        let file = out.join("certs/root.crt");
        assert_eq!(std::fs::read(&file).unwrap(), b"PEM");
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o444
        );
        assert!(!out.join("PGPASSWORD").exists(), "only the items");

        let out = dir.path().join("b");
        project(&data, None, DEFAULT_MODE, false, "Secret s", &out).unwrap();
        assert!(out.join("PGPASSWORD").is_file() && out.join("ca.crt").is_file());

        let missing = [KeyToPath {
            key: "tls.key".into(),
            path: "k".into(),
            ..KeyToPath::default()
        }];
        let err = project(
            &data,
            Some(&missing),
            0o444,
            false,
            "Secret s",
            &dir.path().join("c"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tls.key") && err.contains("not optional"),
            "{err}"
        );
        project(
            &data,
            Some(&missing),
            0o444,
            true,
            "Secret s",
            &dir.path().join("d"),
        )
        .unwrap();

        let escape = [KeyToPath {
            key: "ca.crt".into(),
            path: "../x".into(),
            ..KeyToPath::default()
        }];
        assert!(
            project(
                &data,
                Some(&escape),
                0o444,
                false,
                "Secret s",
                &dir.path().join("e")
            )
            .is_err()
        );
    }
}
