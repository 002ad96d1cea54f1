# Takes the harness's real node down, and whatever a killed run left of it: idempotent,
# every step tolerates what is already gone. Run as root with the environment of
# RealNode (NODE_ROOT, NODE_RUN, NODE_CGROUP, NODE_BRIDGE, NODE_IP, SERVICE_CIDR,
# KUBE_PROXY). Only the node's own names and directories are touched, except for
# `kube-proxy --cleanup`, which removes every kube-proxy chain of the host (one node per
# machine: see REAL-NODE in the harness docs).
set -u

# 1. The node's daemons, the kubelet first so that it restarts nothing.
for pattern in "$NODE_RUN/kubelet-config.yaml" "$NODE_RUN/kube-proxy-config.yaml" \
  "$NODE_RUN/containerd.toml" "containerd-shim.*$NODE_RUN/containerd.sock"; do
  pkill -KILL -f -- "$pattern" 2>/dev/null
done

# 2. Every process of every Pod (they live in the node's own cgroup tree), then the tree.
for round in $(seq 50); do
  left=0
  for hierarchy in /sys/fs/cgroup/*/; do
    tree="$hierarchy$NODE_CGROUP"
    [ -d "$tree" ] || continue
    pids="$(find "$tree" -name cgroup.procs -exec cat {} + 2>/dev/null)"
    if [ -n "$pids" ]; then
      left=1
      kill -KILL $pids 2>/dev/null
    fi
    find "$tree" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$tree" ] && left=1
  done
  [ "$left" = 0 ] && break
  sleep 0.1
done

# 3. Mounts under the node's directories (root filesystems, volumes, network namespaces,
#    shm), deepest first.
for round in 1 2 3; do
  awk -v root="$NODE_ROOT" -v run="$NODE_RUN" \
    'index($5, root"/") == 1 || index($5, run"/") == 1 || $5 == root || $5 == run { print $5 }' \
    /proc/self/mountinfo | sort -r | while read -r mount; do umount -l "$mount" 2>/dev/null; done
done

# 4. Network: the bridge (its veths went with the Pods' namespaces), the routes, the
#    node's address, and the iptables rules of kube-proxy and the kubelet.
ip link del "$NODE_BRIDGE" 2>/dev/null
ip route del "$SERVICE_CIDR" 2>/dev/null
ip addr del "$NODE_IP/32" dev lo 2>/dev/null
if [ -x "${KUBE_PROXY:-}" ]; then
  "$KUBE_PROXY" --cleanup >/dev/null 2>&1
fi
for tables in iptables ip6tables; do
  command -v "$tables" >/dev/null || continue
  for chain in INPUT OUTPUT; do
    while "$tables" -w 5 -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
  done
  "$tables" -w 5 -F KUBE-FIREWALL 2>/dev/null
  "$tables" -w 5 -X KUBE-FIREWALL 2>/dev/null
  for table in mangle nat filter; do
    "$tables" -w 5 -t "$table" -F KUBE-KUBELET-CANARY 2>/dev/null
    "$tables" -w 5 -t "$table" -X KUBE-KUBELET-CANARY 2>/dev/null
  done
done

# 5. Files, and what containerd 1.6 and the kubelet keep at fixed host paths: the shims'
#    sockets that nothing listens on any more, the kubelet's device-plugin socket.
rm -rf -- "$NODE_ROOT" "$NODE_RUN"
rm -f /var/lib/cni/results/appservice-node-* 2>/dev/null
listening="$(ss -xlH 2>/dev/null)"
for socket in /run/containerd/s/*; do
  [ -S "$socket" ] || continue
  case "$listening" in *"$socket"*) ;; *) rm -f -- "$socket" ;; esac
done
rmdir /run/containerd/s /run/containerd 2>/dev/null
if ! pgrep -x kubelet >/dev/null; then
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null
fi
exit 0
