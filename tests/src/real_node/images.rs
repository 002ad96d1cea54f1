//! The images the real node runs, built here (nothing can be pulled from the internet):
//! a static program from the assets (`hello`, `pause`) and the `/etc/passwd` and
//! `/etc/group` of a distroless image as the one layer of an image with no base, its entrypoint, user, environment and platform set with `crane mutate`, pushed
//! to the harness's registry.

use crate::assets::tool;
use crate::error::{Result, io};
use crate::registry::{Registry, TarEntry, tar_of};

/// The non-root user of the images (distroless' `nonroot`).
pub const NONROOT: &str = "65532:65532";

/// The users and groups of every image, as distroless has them: the runtime resolves a
/// numeric user without a group (what the kubelet passes when the Pod does not set
/// `runAsGroup`) through them, as it would in a real image.
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnonroot:x:65532:\n";

/// An image in the node's registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `<registry>/<repo>:<tag>`.
    pub reference: String,
    /// `<registry>/<repo>`.
    pub repository: String,
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
}

impl Image {
    /// `<registry>/<repo>@<digest>`.
    pub fn pinned(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

/// The images every real node has in its registry.
#[derive(Debug, Clone)]
pub struct NodeImages {
    /// The Pod sandbox (containerd's `sandbox_image`).
    pub pause: Image,
    /// The application, answering `{"version": "v1", …}`.
    pub hello_v1: Image,
    /// The same program answering `{"version": "v2", …}`: another digest.
    pub hello_v2: Image,
    /// The application as an image whose user is root (uid 0): a Pod that must run as
    /// non-root cannot start it.
    pub hello_as_root: Image,
}

/// What one image holds besides its program.
#[derive(Debug, Clone, Copy)]
pub struct ImageSpec<'a> {
    pub repo: &'a str,
    pub tag: &'a str,
    /// The asset binary put at `/<program>` and run as the entrypoint.
    pub program: &'a str,
    /// `uid:gid`.
    pub user: &'a str,
    pub env: &'a [(&'a str, &'a str)],
}

impl NodeImages {
    /// Builds and pushes the node's images.
    pub async fn push(registry: &Registry) -> Result<Self> {
        let pause = push(
            registry,
            ImageSpec {
                repo: "pause",
                tag: "1",
                program: "pause",
                user: NONROOT,
                env: &[],
            },
        )
        .await?;
        let hello = |tag, user, version| ImageSpec {
            repo: "hello",
            tag,
            program: "hello",
            user,
            env: version,
        };
        let hello_v1 = push(registry, hello("v1", NONROOT, &[("APP_VERSION", "v1")])).await?;
        let hello_v2 = push(registry, hello("v2", NONROOT, &[("APP_VERSION", "v2")])).await?;
        let hello_as_root = push(
            registry,
            hello("as-root", "0:0", &[("APP_VERSION", "as-root")]),
        )
        .await?;
        Ok(Self {
            pause,
            hello_v1,
            hello_v2,
            hello_as_root,
        })
    }
}

/// Builds the image `spec` describes and pushes it to `registry`.
pub async fn push(registry: &Registry, spec: ImageSpec<'_>) -> Result<Image> {
    let program = tool(spec.program)?;
    let content = std::fs::read(&program).map_err(io(format!("reading {}", program.display())))?;
    let dir = tempfile::tempdir().map_err(io("creating a directory for an image layer"))?;
    let layer = dir.path().join("layer.tar");
    let tar = tar_of(&[
        TarEntry::File {
            name: spec.program,
            content: &content,
            mode: 0o755,
        },
        TarEntry::Dir {
            name: "etc",
            mode: 0o755,
        },
        TarEntry::File {
            name: "etc/passwd",
            content: PASSWD.as_bytes(),
            mode: 0o644,
        },
        TarEntry::File {
            name: "etc/group",
            content: GROUP.as_bytes(),
            mode: 0o644,
        },
    ]);
    std::fs::write(&layer, tar).map_err(io(format!("writing {}", layer.display())))?;
    let repository = format!("{}/{}", registry.host(), spec.repo);
    let reference = format!("{repository}:{}", spec.tag);
    registry.append(&layer, &reference).await?;
    let entrypoint = format!("/{}", spec.program);
    let mut args = vec![
        "mutate".to_owned(),
        reference.clone(),
        "--entrypoint".to_owned(),
        entrypoint,
        "--user".to_owned(),
        spec.user.to_owned(),
        "--set-platform".to_owned(),
        "linux/amd64".to_owned(),
        "--tag".to_owned(),
        reference.clone(),
    ];
    for (name, value) in spec.env {
        args.push("--env".to_owned());
        args.push(format!("{name}={value}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    registry.crane(&args).await?;
    let digest = registry.digest(&reference).await?;
    Ok(Image {
        reference,
        repository,
        digest,
    })
}
