#!/usr/bin/env bash
# Builds the control-plane binaries the integration tests run (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, helm, the Argo CD
# health-script evaluator argocd-health, the kstatus evaluator kstatus, and for the
# image tests the CNCF distribution registry, crane and cosign), the real node's kubelet
# and kube-proxy, metrics-server, Traefik (with the Gateway API CRDs), and the programs its images hold (hello, pause) from
# their published Go modules, pinned by the wrapper modules next to this script. The node's container
# runtime (containerd, runc, the CNI plugins, iptables, conntrack) comes from the
# distribution's packages: see node-packages.sh.
#
# Output: $APPSERVICE_ASSETS_DIR (default ~/.cache/appservice-operator/k8s-1.37.2)/bin.
# Idempotent: a binary is rebuilt only when its wrapper module (go.mod/go.sum, and its
# own Go sources) changed. Safe to run concurrently: an exclusive file lock serialises
# builders, and each binary is moved into place atomically.
#
# Usage: build.sh [--force] [--only NAME,NAME,...]
#   --only: build just these binaries (`cargo xtask demo` needs the control plane alone).
# Before each build it says how long the builds left will take: the time each took when
# last built here, else the time it took on the 2-core reference machine.
set -euo pipefail

K8S_VERSION=v1.37.2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${APPSERVICE_ASSETS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/appservice-operator/k8s-${K8S_VERSION#v}}"
bin="$cache/bin"
force=0
only=""
while (( $# )); do
  case "$1" in
    --force) force=1 ;;
    --only) only=",${2:?--only needs a comma-separated list},"; shift ;;
    *) echo "error: unknown argument $1 (usage: build.sh [--force] [--only NAME,...])" >&2; exit 2 ;;
  esac
  shift
done

log() { printf '[assets %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<'MSG'
error: `go` was not found on PATH.
The integration tests build kube-apiserver, etcd, kwok and helm from their Go modules.
Install Go 1.26 or newer (for example `apt-get install golang-go` if your distribution
ships 1.26+, or the official tarball) and make sure `go` is on PATH, then re-run.
MSG
  exit 127
fi

go_minor="$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')"
if [[ ! "$go_minor" =~ ^[0-9]+$ ]] || (( go_minor < 26 )); then
  echo "error: Go 1.26 or newer is required to build Kubernetes ${K8S_VERSION}; found $(go env GOVERSION)" >&2
  exit 1
fi

mkdir -p "$bin"
exec 9>"$cache/.lock"
if ! flock -n 9; then
  log "another build holds $cache/.lock; waiting for it"
  flock 9
fi

export CGO_ENABLED=0
# GOTOOLCHAIN=local: never try to download another toolchain (no internet here).
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -trimpath"

# Seconds each build took from a cold Go cache on the 2-core reference machine, in this
# order (the kubelet and kube-proxy after kube-apiserver, whose packages they share): the
# estimate until a build here measured its own (kept in $cache/.seconds-<name>).
declare -A reference=(
  [etcd]=75 [kube-apiserver]=420 [kube-controller-manager]=90 [kube-scheduler]=10
  [kubectl]=25 [kwok]=90 [helm]=115 [argocd-health]=5 [kstatus]=25 [registry]=75
  [crane]=5 [cosign]=160 [kubelet]=30 [kube-proxy]=15 [hello]=10 [pause]=2
  [metrics-server]=130 [traefik]=313
)
order=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm
  argocd-health kstatus registry crane cosign kubelet kube-proxy hello pause metrics-server traefik)

wanted() { [[ -z "$only" || "$only" == *",$1,"* ]]; }

if [[ -n "$only" ]]; then
  for name in ${only//,/ }; do
    [[ -n "${reference[$name]:-}" ]] || { echo "error: --only names an unknown binary: $name" >&2; exit 2; }
  done
fi

built() { [[ -x "$bin/$1" && -f "$cache/.stamp-$1" ]]; }

# The seconds the builds from `name` on (those wanted and not built yet) should take: an
# estimate (a binary built from an older wrapper module is counted as built).
left_from() {
  local from="$1" counting=0 total=0 name
  for name in "${order[@]}"; do
    [[ "$name" == "$from" ]] && counting=1
    (( counting )) || continue
    wanted "$name" || continue
    if (( !force )) && [[ "$name" != "$from" ]] && built "$name"; then continue; fi
    total=$(( total + $(cat "$cache/.seconds-$name" 2>/dev/null || echo "${reference[$name]}") ))
  done
  echo "$total"
}

stamp_of() { # module dir, package, ldflags -> hash of everything that determines the build
  # (the wrapper module, and the Go sources of a module that has its own: hello, kstatus)
  { cat "$here/$1/go.mod" "$here/$1/go.sum"
    find "$here/$1" -name '*.go' -print0 | sort -z | xargs -0 -r cat
    printf '%s\n' "$2" "$3" "$(go env GOVERSION)"; } | sha256sum | cut -d' ' -f1
}

# build <module dir> <binary name> <package> [ldflags]
build() {
  local mod="$1" name="$2" pkg="$3" ldflags="${4:-}"
  wanted "$name" || return 0
  local stamp; stamp="$(stamp_of "$mod" "$pkg" "$ldflags")"
  local stampfile="$cache/.stamp-$name"
  if (( !force )) && [[ -x "$bin/$name" && -f "$stampfile" && "$(cat "$stampfile")" == "$stamp" ]]; then
    log "$name is up to date"
    return
  fi
  local left; left="$(left_from "$name")"
  log "building $name from $pkg (about $(( (left + 59) / 60 )) min left for the Go binaries)"
  local start=$SECONDS tmp="$bin/.$name.tmp.$$"
  (cd "$here/$mod" && go build -tags selinux,notest -ldflags "-s -w $ldflags" -o "$tmp" "$pkg")
  mv -f "$tmp" "$bin/$name"
  echo "$stamp" >"$stampfile"
  echo $((SECONDS - start)) >"$cache/.seconds-$name"
  log "built $name in $((SECONDS - start))s"
}

# Version stamping as Kubernetes' hack/lib/version.sh does it, so that
# `kube-apiserver --version` and discovery report the real version.
k8s_ldflags=""
build_date="$(date -u -d "@${SOURCE_DATE_EPOCH:-0}" +%Y-%m-%dT%H:%M:%SZ)"
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
  k8s_ldflags+=" -X '$pkg.gitVersion=${K8S_VERSION}' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=${minor}'"
  k8s_ldflags+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=${build_date}'"
done

total=$SECONDS
build etcd etcd go.etcd.io/etcd/server/v3
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl "$k8s_ldflags"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
# Helm's Makefile stamps the Kubernetes version its client libraries speak; without it
# `helm template` assumes v1.20 and refuses charts that declare a newer kubeVersion.
if wanted helm; then
  helm_k8s_minor="$(cd "$here/helm" && go list -m -f '{{.Version}}' k8s.io/client-go | cut -d. -f2)"
  helm_ldflags="-X 'helm.sh/helm/v3/internal/version.version=v3.22.0'"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X '$pkg.k8sVersionMajor=1' -X '$pkg.k8sVersionMinor=${helm_k8s_minor}'"
  done
  build helm helm helm.sh/helm/v3/cmd/helm "$helm_ldflags"
fi
# The Argo CD health-script evaluator (gopher-lua, as Argo CD runs health scripts).
build argocd-health argocd-health appservice-operator/envtest/argocd-health
# The kstatus evaluator (sigs.k8s.io/cli-utils' status.Compute, as Flux and Helm --wait).
build kstatus kstatus appservice-operator/envtest/kstatus
# A real OCI registry (CNCF distribution), crane to push images to it and cosign to sign
# them and to give the reference verdict for signature verification.
build registry registry github.com/distribution/distribution/v3/cmd/registry
build crane crane github.com/google/go-containerregistry/cmd/crane
build cosign cosign github.com/sigstore/cosign/v2/cmd/cosign
# The real node: the kubelet and kube-proxy of the control plane's release, and the
# programs of the images it runs (static, for images with no base).
build kubernetes kubelet k8s.io/kubernetes/cmd/kubelet "$k8s_ldflags"
build kubernetes kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$k8s_ldflags"
build apps hello appservice-operator/envtest/apps/hello
build apps pause appservice-operator/envtest/apps/pause
# metrics-server: the resource metrics API (metrics.k8s.io) from the real node's kubelet,
# which the HorizontalPodAutoscaler of `spec.autoscaling` reads. Its Makefile stamps the
# version into client-go's version package.
ms_version=v0.8.0
build metrics-server metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server \
  "-X 'k8s.io/client-go/pkg/version.gitVersion=${ms_version}' -X 'k8s.io/client-go/pkg/version.gitMajor=0' -X 'k8s.io/client-go/pkg/version.gitMinor=8'"
# Traefik: the Gateway API implementation the exposure tests send HTTPS through, and the
# Gateway API CRDs it implements (v1.4.0, the standard channel), taken from the module's
# zip as the version its go.mod resolves.
if wanted traefik; then
  build traefik traefik github.com/traefik/traefik/v3/cmd/traefik \
    "-X 'github.com/traefik/traefik/v3/pkg/version.Version=v3.6.12'"
  gw_dir="$(cd "$here/traefik" && go mod download -json sigs.k8s.io/gateway-api | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$gw_dir/config/crd/standard" ]] || { echo "error: the Gateway API module has no config/crd/standard (at '$gw_dir')" >&2; exit 1; }
  mkdir -p "$cache/gateway-api"
  cp -f "$gw_dir"/config/crd/standard/gateway.networking.k8s.io_*.yaml "$cache/gateway-api/"
  chmod u+w "$cache"/gateway-api/*.yaml
  # cert-manager's CRDs (its controller cannot be built here: its cmd/ modules are not
  # served), for checking the Certificates of `spec.expose.tls.issuerRef` against them.
  cm_dir="$(cd "$here/cert-manager" && go mod download -json github.com/cert-manager/cert-manager | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -f "$cm_dir/deploy/crds/cert-manager.io_certificates.yaml" ]] || { echo "error: the cert-manager module has no deploy/crds (at '$cm_dir')" >&2; exit 1; }
  mkdir -p "$cache/cert-manager"
  cp -f "$cm_dir"/deploy/crds/cert-manager.io_*.yaml "$cache/cert-manager/"
  chmod u+w "$cache"/cert-manager/*.yaml
fi
log "${only:+the assets asked for (${only:1:-1}) }all ready in $bin ($((SECONDS - total))s)"
echo "$bin"
