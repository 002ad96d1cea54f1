# Prepares the host for the harness's real node (after teardown.sh cleared what a
# previous run left): the node's address on lo, the Pods' bridge, the route that keeps
# every Service address on this machine, and the node's cgroup tree. Fails with a message
# naming what is missing.
set -euo pipefail

fail() { echo "real node: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || fail "must run as root (it adds an address, a bridge, routes and cgroups)"
for tool in ip iptables conntrack containerd runc ctr; do
  command -v "$tool" >/dev/null || fail "\`$tool\` is not on PATH: `cargo xtask test` installs it (apt-get install containerd runc containernetworking-plugins iptables conntrack)"
done
for plugin in bridge host-local loopback portmap; do
  [ -x "$CNI_BIN/$plugin" ] || fail "the CNI plugin $CNI_BIN/$plugin is missing: `cargo xtask test` installs it (apt-get install containernetworking-plugins)"
done
grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null || fail "the kernel has no overlay filesystem (containerd's overlayfs snapshotter needs it)"
[ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] || fail "no cgroup memory controller under /sys/fs/cgroup"

mkdir -p "$NODE_ROOT" "$NODE_RUN"
ip addr add "$NODE_IP/32" dev lo
ip link add "$NODE_BRIDGE" type bridge
ip addr add "$NODE_GATEWAY/24" dev "$NODE_BRIDGE"
ip link set "$NODE_BRIDGE" up
# A ClusterIP that kube-proxy has not programmed yet must not follow the default route
# off the machine: every Service address goes to the bridge, where nothing answers it
# but a Pod kube-proxy sent it to.
ip route add "$SERVICE_CIDR" dev "$NODE_BRIDGE"

# The kubelet's cgroupRoot must exist in every hierarchy it uses.
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p "/sys/fs/cgroup/$NODE_CGROUP"
else
  for hierarchy in /sys/fs/cgroup/*/; do
    mkdir -p "$hierarchy$NODE_CGROUP"
  done
fi
