#!/usr/bin/env bash
# A real single-node Kubernetes for the cluster tests, from official sources:
#   ./scripts/cluster.sh up      build (once) and start it; prints the env
#   ./scripts/cluster.sh env     the KUBECONFIG line to use
#   ./scripts/cluster.sh down    stop it and remove its state, interfaces and rules
#   ./scripts/cluster.sh build   only build the binaries (cached)
#   ./scripts/cluster.sh image   build the sless image from the Dockerfile and load it
#                                (SLESS_IMAGE_PROFILE=dev: of the debug build)
#
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy and kubectl are built from k8s.io/kubernetes (the release of
# scripts/cluster/kubernetes/go.mod, whose replace lines pin every staging
# module to it) and etcd from go.etcd.io/etcd/server, in one `go build`;
# CoreDNS from its Go module. They are cached under
# $SLESS_CACHE/kubernetes-$RELEASE (default ~/.cache/sless), keyed by the
# release: a second `up` builds nothing. containerd, runc, the CNI plugins
# and iptables are Debian's. NetworkPolicy is enforced by the controller of
# sigs.k8s.io/kube-network-policies (scripts/cluster/netpol) on the host.
# The pause image is built from the release's own
# pause.c (and tests' busybox image from Debian's). Everything listens on loopback or on the interface `sless0`
# (a bridge with no ports: this kernel has no dummy device; 10.250.0.0/24)
# the script makes; pods live on the bridge `slesscni0`
# (10.251.0.0/24) and Services in 10.252.0.0/16, which exist only here.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

RELEASE=v1.35.8
COREDNS=v1.14.7
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
BUSYBOX_IMAGE=sless.local/busybox:1
# Not :latest, whose pull policy is Always: the cluster reaches no registry.
SLESS_IMAGE=ghcr.io/kube5s/sless:test
CACHE=${SLESS_CACHE:-$HOME/.cache/sless}/kubernetes-$RELEASE
BIN=$CACHE/bin
# The release of scripts/cluster/cert-manager/go.mod.
CERT_MANAGER=v1.20.3
CERT_MANAGER_CACHE=${SLESS_CACHE:-$HOME/.cache/sless}/cert-manager-$CERT_MANAGER
# The release of scripts/cluster/netpol/go.mod (kube-network-policies).
NETPOL=v0.8.0
NETPOL_CACHE=${SLESS_CACHE:-$HOME/.cache/sless}/kube-network-policies-$NETPOL
NETPOL_CHAIN=SLESS-NETPOL
NETPOL_QUEUE=100
STATE=${SLESS_CLUSTER_STATE:-/var/lib/sless-cluster}
RUN=/run/sless-cluster
NODE=sless-node
NODE_IP=10.250.0.1
DNS_IP=10.250.0.10
POD_SUBNET=10.251.0.0/24
POD_GATEWAY=10.251.0.1
SERVICE_RANGE=10.252.0.0/16
API_SERVICE_IP=10.252.0.1
DEV=sless0
BRIDGE=slesscni0
KUBECONFIG_ADMIN=$STATE/pki/admin.kubeconfig

log() { printf '==> %s\n' "$*" >&2; }

packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  [ -x /bin/busybox ] || missing+=(busybox-static)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd coredns)
  local have=1
  for b in "${want[@]}"; do [ -x "$BIN/$b" ] || have=0; done
  [ $have = 1 ] && return 0
  mkdir -p "$BIN"
  local version="-X k8s.io/component-base/version.gitVersion=$RELEASE"
  version+=" -X k8s.io/client-go/pkg/version.gitVersion=$RELEASE"
  version+=" -X k8s.io/component-base/version.gitMajor=1"
  version+=" -X k8s.io/component-base/version.gitMinor=$(echo "$RELEASE" | cut -d. -f2)"
  version+=" -X k8s.io/component-base/version.gitTreeState=clean"
  log "building Kubernetes $RELEASE and etcd into $BIN (once; about 5 minutes on 2 cores)"
  local started=$SECONDS
  (cd scripts/cluster/kubernetes \
    && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "-s -w $version" -o "$BIN/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
      k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
      k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl go.etcd.io/etcd/server/v3)
  mv "$BIN/server" "$BIN/etcd"
  log "building CoreDNS $COREDNS"
  GOBIN=$BIN go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS"
  log "built in $((SECONDS - started)) s"
}

# cert-manager's controllers and CA injector (scripts/cluster/cert-manager:
# the module's own commands are not served by the Go module proxy) and the
# release's CRDs, cached under $CERT_MANAGER_CACHE.
build_cert_manager() {
  [ -x "$CERT_MANAGER_CACHE/cert-manager" ] && [ -d "$CERT_MANAGER_CACHE/crds" ] && return 0
  mkdir -p "$CERT_MANAGER_CACHE"
  log "building cert-manager $CERT_MANAGER into $CERT_MANAGER_CACHE (once)"
  local started=$SECONDS module
  (cd scripts/cluster/cert-manager \
    && go build -trimpath -tags=selinux,notest,grpcnotrace -ldflags "-s -w" \
      -o "$CERT_MANAGER_CACHE/cert-manager" .)
  module=$(cd scripts/cluster/cert-manager && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
  rm -rf "$CERT_MANAGER_CACHE/crds"
  cp -r "$module/deploy/crds" "$CERT_MANAGER_CACHE/crds"
  chmod -R u+w "$CERT_MANAGER_CACHE/crds"
  rm -f "$CERT_MANAGER_CACHE/crds/README.md"
  log "built cert-manager in $((SECONDS - started)) s"
}

# The NetworkPolicy enforcer (scripts/cluster/netpol: kube-network-policies'
# controller with a kubeconfig), cached under $NETPOL_CACHE.
build_netpol() {
  [ -x "$NETPOL_CACHE/netpol" ] && return 0
  mkdir -p "$NETPOL_CACHE"
  log "building kube-network-policies $NETPOL into $NETPOL_CACHE (once)"
  local started=$SECONDS
  (cd scripts/cluster/netpol && go build -trimpath -ldflags "-s -w" -o "$NETPOL_CACHE/netpol" .)
  log "built kube-network-policies in $((SECONDS - started)) s"
}

# On CI the Go build cache (about 5 GB) serves no one once the binaries are
# cached under $SLESS_CACHE, and the disk is shared with the Rust builds.
# (The module cache stays: images() reads pause.c from it.)
drop_go_caches() {
  [ -n "${CI:-}" ] || return 0
  go clean -cache
}

pki() {
  local dir=$STATE/pki
  mkdir -p "$dir"
  cd "$dir"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=sless-cluster-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  # name, subject, SANs (empty for a client certificate)
  cert() {
    local ext
    ext=$(mktemp)
    if [ -n "$3" ]; then
      printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$3" >"$ext"
    else
      printf 'extendedKeyUsage=clientAuth\n' >"$ext"
    fi
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
      -extfile "$ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$ext"
  }
  cert apiserver "/CN=kube-apiserver" \
    "IP:$NODE_IP,IP:$API_SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" ""
  cert admin "/O=system:masters/CN=sless-admin" ""
  cert controller-manager "/CN=system:kube-controller-manager" ""
  cert scheduler "/CN=system:kube-scheduler" ""
  cert kube-proxy "/CN=system:kube-proxy" ""
  cert kubelet "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
  for who in admin controller-manager scheduler kube-proxy kubelet; do
    cat >"$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: sless
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority: $dir/ca.crt
users:
- name: $who
  user:
    client-certificate: $dir/$who.crt
    client-key: $dir/$who.key
contexts:
- name: sless
  context: {cluster: sless, user: $who}
current-context: sless
EOF
  done
  chmod 600 ./*.key
  cd "$ROOT"
}

network() {
  sysctl -qw net.ipv4.ip_forward=1
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  ip link show "$DEV" >/dev/null 2>&1 || ip link add "$DEV" type bridge
  ip link set "$DEV" up
  ip addr replace "$NODE_IP/32" dev "$DEV"
  ip addr replace "$DNS_IP/32" dev "$DEV"
  # A pod's packet to a Service address no kube-proxy rule maps (those
  # are rewritten before routing) is dropped here, never routed off the
  # machine by the host's default route.
  iptables -C FORWARD -d "$SERVICE_RANGE" -j DROP 2>/dev/null || iptables -I FORWARD -d "$SERVICE_RANGE" -j DROP
  mkdir -p "$STATE/cni/net.d"
  cat >"$STATE/cni/net.d/10-sless.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "sless",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
              "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$POD_GATEWAY"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# Starts `name` with the rest as its command line, logging to its file.
start() {
  local name=$1
  shift
  mkdir -p "$STATE/log" "$RUN"
  setsid "$@" >>"$STATE/log/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN/$name.pid"
}

wait_for() {
  local what=$1 tries=$2
  shift 2
  for _ in $(seq "$tries"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  log "$what did not come up; its log:"
  tail -n 30 "$STATE/log/$what.log" >&2 || true
  return 1
}

# The images pods use, assembled here (no registry is reachable): the pause
# image from the release's own pause.c, and Debian's static busybox as
# sless.local/busybox:1 for tests and helpers.
images() {
  local pause=$CACHE/pause.tar busybox=$CACHE/busybox.tar
  if [ ! -f "$pause" ]; then
    local src
    src=$(cd scripts/cluster/kubernetes && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
    gcc -Os -static -Wall -Werror -DVERSION=3.10.1 -o "$CACHE/pause" "$src"
    python3 scripts/cluster/oci_image.py --name "$PAUSE_IMAGE" --out "$pause" \
      --add "$CACHE/pause:/pause" --entrypoint '["/pause"]' --user 65535:65535
  fi
  if [ ! -f "$busybox" ]; then
    python3 scripts/cluster/oci_image.py --name "$BUSYBOX_IMAGE" --out "$busybox" \
      --add /bin/busybox:/bin/busybox --entrypoint '["/bin/busybox"]'
  fi
  for image in "$pause" "$busybox"; do
    ctr --address "$RUN/containerd.sock" -n k8s.io images import "$image" >/dev/null
  done
}

containerd_up() {
  mkdir -p "$STATE/containerd" "$RUN"
  cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$RUN/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This sandbox drops CAP_SYS_RESOURCE: no process may lower its OOM
  # score below containerd's (the kubelet asks -998 for a pod sandbox).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
  start containerd containerd --config "$STATE/containerd.toml"
  wait_for containerd 60 ctr --address "$RUN/containerd.sock" version
}

control_plane_up() {
  local pki=$STATE/pki
  start etcd "$BIN/etcd" --name sless --data-dir "$STATE/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster sless=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
  wait_for etcd 60 curl -sf http://127.0.0.1:2381/health
  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
    --bind-address="$NODE_IP" --advertise-address="$NODE_IP" --secure-port=6443 \
    --service-cluster-ip-range="$SERVICE_RANGE" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-preferred-address-types=InternalIP \
    --allow-privileged=true --profiling=false
  wait_for kube-apiserver 120 "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" get --raw /readyz
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$pki/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$pki/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$pki/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false \
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
    --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
    --use-service-account-credentials=true --allocate-node-cidrs=false \
    --service-cluster-ip-range="$SERVICE_RANGE" --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$pki/scheduler.kubeconfig" \
    --authentication-kubeconfig="$pki/scheduler.kubeconfig" \
    --authorization-kubeconfig="$pki/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false
}

node_up() {
  local pki=$STATE/pki
  mkdir -p "$STATE/kubelet"
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This sandbox mounts cgroup v1; 1.35 runs there only when told to.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$RUN/containerd.sock
failSwapOn: false
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
serializeImagePulls: false
EOF
  start kubelet "$BIN/kubelet" --config="$STATE/kubelet.yaml" --kubeconfig="$pki/kubelet.kubeconfig" \
    --node-ip="$NODE_IP" --hostname-override="$NODE" --root-dir="$STATE/kubelet"
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_SUBNET
hostnameOverride: $NODE
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
clientConnection: {kubeconfig: $pki/kube-proxy.kubeconfig}
oomScoreAdj: 0
# Leave the host's conntrack sysctls as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
  cat >"$STATE/Corefile" <<EOF
.:53 {
    bind $DNS_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KUBECONFIG_ADMIN
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
}
EOF
  start coredns "$BIN/coredns" -conf "$STATE/Corefile"
  wait_for kubelet 120 "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" wait --for=condition=Ready \
    "node/$NODE" --timeout=1s
  # Pods can be made once the controllers gave the namespace its account.
  wait_for kube-controller-manager 120 "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" \
    get serviceaccount default --namespace default
}

# A default StorageClass of node-local volumes, and PersistentVolumes of
# it in $STATE/volumes for the PVCs the tests' pods claim. The kubelet sets a
# local volume's group to the pod's fsGroup (a hostPath it leaves as it is).
storage() {
  local manifest=$STATE/storage.yaml i
  cat >"$manifest" <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
EOF
  for i in $(seq 1 24); do
    mkdir -p "$STATE/volumes/pv$i"
    cat >>"$manifest" <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: local-pv$i}
spec:
  capacity: {storage: 4Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: $STATE/volumes/pv$i}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]
EOF
  done
  "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" apply -f "$manifest" >/dev/null
}

# cert-manager on the host, as the cluster's admin, for deploy/pki.
cert_manager_up() {
  local kubectl=("$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN")
  "${kubectl[@]}" apply --server-side -f "$CERT_MANAGER_CACHE/crds" >/dev/null
  "${kubectl[@]}" wait --for=condition=Established --timeout=60s -f "$CERT_MANAGER_CACHE/crds" >/dev/null
  "${kubectl[@]}" create namespace cert-manager >/dev/null
  start cert-manager "$CERT_MANAGER_CACHE/cert-manager" --kubeconfig "$KUBECONFIG_ADMIN"
  sleep 2
  wait_for cert-manager 1 kill -0 "$(cat "$RUN/cert-manager.pid")"
}

# NetworkPolicy enforced on the node (scripts/cluster/netpol). Its hook: the
# first packet of each connection from or to a pod, leaving through the host
# (routed or bridged), is queued to the enforcer, which accepts or drops it by
# the policies; with no enforcer listening the packet is dropped. The host's
# own root processes (the kubelet's probes) pass, as upstream's hook lets them.
# Made with the xtables NFQUEUE target: this kernel has no nftables `queue`.
netpol_up() {
  start netpol "$NETPOL_CACHE/netpol" --kubeconfig "$KUBECONFIG_ADMIN" --node "$NODE" \
    --nfqueue-id "$NETPOL_QUEUE"
  # The hook only once the enforcer listens on its queue.
  wait_for netpol 60 grep -q "^ *$NETPOL_QUEUE " /proc/net/netfilter/nfnetlink_queue
  local ipt=(iptables -w -t mangle)
  "${ipt[@]}" -N "$NETPOL_CHAIN"
  "${ipt[@]}" -A "$NETPOL_CHAIN" -m owner --uid-owner 0 -j RETURN
  "${ipt[@]}" -A "$NETPOL_CHAIN" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  "${ipt[@]}" -A "$NETPOL_CHAIN" -s "$POD_SUBNET" -j NFQUEUE --queue-num "$NETPOL_QUEUE"
  "${ipt[@]}" -A "$NETPOL_CHAIN" -d "$POD_SUBNET" -j NFQUEUE --queue-num "$NETPOL_QUEUE"
  "${ipt[@]}" -A POSTROUTING -j "$NETPOL_CHAIN"
}

# Whether a complete `up` left every process of the cluster running.
running() {
  [ -f "$RUN/up-done" ] || return 1
  local name
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns cert-manager netpol containerd; do
    [ -f "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null || return 1
  done
}

up() {
  if running; then
    log "the cluster is up already"
    env_line
    return
  fi
  packages
  build
  build_cert_manager
  build_netpol
  drop_go_caches
  local started=$SECONDS
  down quiet
  mkdir -p "$STATE" "$RUN"
  network
  pki
  containerd_up
  images
  control_plane_up
  netpol_up
  node_up
  storage
  cert_manager_up
  touch "$RUN/up-done"
  log "the cluster is up in $((SECONDS - started)) s"
  env_line
}

# The sless image, built from the Dockerfile (scripts/cluster/image.py) as
# $SLESS_IMAGE, and loaded into the cluster's containerd.
sless_image() {
  local out=$STATE/sless-image.tar
  python3 scripts/cluster/image.py --name "$SLESS_IMAGE" --out "$out" \
    --cache "${SLESS_CACHE:-$HOME/.cache/sless}/image" --profile "${SLESS_IMAGE_PROFILE:-release}"
  ctr --address "$RUN/containerd.sock" -n k8s.io images import "$out" >/dev/null
  rm -f "$out"
  log "$SLESS_IMAGE loaded"
}

env_line() {
  echo "export KUBECONFIG=$KUBECONFIG_ADMIN PATH=$BIN:\$PATH"
}

# Stops the process `name` started: SIGTERM, and SIGKILL if it is still
# there after 10 s.
stop() {
  local pidfile=$RUN/$1.pid pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

# Stops every process, removes pods' containers, mounts, interfaces, the
# iptables rules kube-proxy made, and the state.
down() {
  local quiet=${1:-}
  for name in cert-manager kube-proxy kubelet coredns netpol kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop "$name"
  done
  while iptables -w -t mangle -D POSTROUTING -j "$NETPOL_CHAIN" 2>/dev/null; do :; done
  iptables -w -t mangle -F "$NETPOL_CHAIN" 2>/dev/null || true
  iptables -w -t mangle -X "$NETPOL_CHAIN" 2>/dev/null || true
  if [ -S "$RUN/containerd.sock" ]; then
    for task in $(ctr --address "$RUN/containerd.sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$RUN/containerd.sock" -n k8s.io tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true
    done
  fi
  stop containerd
  # The shims of our containerd, and what they ran.
  pkill -9 -f "containerd-shim-runc-v2 .*-address $RUN/containerd.sock" 2>/dev/null || true
  sleep 1
  if [ -x "$BIN/kube-proxy" ]; then "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true; fi
  # The kubelet's own chains, which kube-proxy's cleanup leaves.
  for tables in iptables ip6tables; do
    command -v "$tables" >/dev/null || continue
    for table in filter nat mangle; do
      for chain in INPUT OUTPUT; do
        while "$tables" -t "$table" -D "$chain" -j KUBE-FIREWALL 2>/dev/null; do :; done
      done
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$tables" -t "$table" -F "$chain" 2>/dev/null || true
        "$tables" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  { grep -E " ($STATE|$RUN)" /proc/mounts || true; } | awk '{print $2}' | sort -r | while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/ {print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
  # The pods' cgroups, deepest first, once their processes are gone.
  find /sys/fs/cgroup/*/kubepods -depth -type d -exec rmdir {} \; 2>/dev/null || true
  ip link delete "$BRIDGE" 2>/dev/null || true
  ip link delete "$DEV" 2>/dev/null || true
  while iptables -D FORWARD -d "$SERVICE_RANGE" -j DROP 2>/dev/null; do :; done
  rm -rf "$STATE" "$RUN"
  [ -n "$quiet" ] || log "the cluster is down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) env_line ;;
  build) packages && build && build_cert_manager && build_netpol && drop_go_caches ;;
  image) sless_image ;;
  *) echo "usage: $0 up|down|env|build|image" >&2; exit 2 ;;
esac
