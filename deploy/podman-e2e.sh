#!/usr/bin/env bash
# The container recipe end to end, on a machine with podman and no image registry (deploy/README.md):
#   1. a Debian base image from debootstrap (once: localhost/debian:bookworm),
#   2. the relocatable tarball (scripts/package.sh; COSY_BIN=FILE packages that binary, no build),
#   3. the image from deploy/Dockerfile on that base,
#   4. the image run alone: /ready and a speech request from the host,
#   5. deploy/k8s through `podman kube play`: /ready and a speech request from the host,
#   6. teardown (containers, pods, volumes; the images stay for the next run).
# The model is the bundled tiny one (tests/fixtures/tiny, mounted as an export would be).
# Needs root, podman, runc, debootstrap (apt-get install -y podman runc debootstrap). crun fails
# on some kernels' cgroup layout, and slirp/netavark networking may be missing: runc, cgroupfs and
# the host's network are used (CONTAINERS_CONF below; PORT for the server, default 8080).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
port="${PORT:-8080}"
started=$(date +%s)
work="$(mktemp -d)"
say() { echo "[$(( $(date +%s) - started ))s] $*"; }
cleanup() {
  podman rm -f -t 0 cosy-e2e >/dev/null 2>&1 || true
  [ -f "$work/kube.yaml" ] && podman kube down "$work/kube.yaml" >/dev/null 2>&1 || true
  podman volume rm -f cosy-e2e-voices cosy-models cosy-voices >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Settings podman kube play cannot take as flags: the runtime, cgroups, the host's network, ulimits.
export CONTAINERS_CONF="$work/containers.conf"
cat > "$CONTAINERS_CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
EOF
run_flags=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096 --network host)

if ! podman image exists localhost/debian:bookworm; then
  say "base image: debootstrap --variant=minbase --include=libasound2 bookworm"
  debootstrap --variant=minbase --include=libasound2 bookworm "$work/rootfs" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log"; exit 1; }
  tar -C "$work/rootfs" -c . | podman import --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' - localhost/debian:bookworm >/dev/null
  rm -rf "$work/rootfs"
fi

say "package: scripts/package.sh"
tarball="$(COSY_DIST="$work/dist" "$root/scripts/package.sh" | tail -n1)"
say "  $(basename "$tarball") ($(du -h "$tarball" | cut -f1))"

say "image: podman build -f deploy/Dockerfile --build-arg BASE=localhost/debian:bookworm"
# A context of only what the Dockerfile takes (the checkout's target/ is many GB).
mkdir -p "$work/ctx/dist" "$work/ctx/deploy"
cp "$tarball" "$work/ctx/dist/"
cp "$root/deploy/config.toml" "$work/ctx/deploy/"
podman build -q -f "$root/deploy/Dockerfile" --build-arg BASE=localhost/debian:bookworm \
  --build-arg TARBALL="dist/$(basename "$tarball")" -t localhost/cosy:latest "$work/ctx" >/dev/null
say "  localhost/cosy:latest $(podman image inspect localhost/cosy:latest --format '{{.Size}}' | numfmt --to=iec) bytes"

wait_ready() { # wait_ready WHAT: GET /ready until 200 (at most 180 s)
  for _ in $(seq 1 360); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port/ready")" = 200 ]; then
      say "  $1: GET /ready -> 200"; return 0
    fi
    sleep 0.5
  done
  say "  $1: not ready"; return 1
}
speak() { # speak WHAT: a cloned-voice speech request from the host, checked as a WAV
  local out="$work/$1.wav"
  curl -sS --fail-with-body --max-time 120 "http://127.0.0.1:$port/v1/audio/speech" \
    -F input="Hello from the container." -F ref_text="This recording is the voice prompt." \
    -F ref_audio=@"$root/tests/fixtures/prompt_24k.wav" -F response_format=wav -F stream=false -o "$out"
  local info
  info="$(ffprobe -v error -show_entries stream=codec_name,sample_rate,duration -of csv=p=0 "$out")"
  say "  $1: POST /v1/audio/speech -> $(stat -c %s "$out") bytes, $info"
}

say "run alone: podman run (model mounted read-only, voices in a volume)"
podman --runtime runc --cgroup-manager=cgroupfs run -d --name cosy-e2e "${run_flags[@]}" \
  -e COSY_BIND="127.0.0.1:$port" \
  -v "$root/tests/fixtures/tiny:/models/cosyvoice3:ro" -v cosy-e2e-voices:/voices \
  localhost/cosy:latest >/dev/null
wait_ready "alone" || { podman logs cosy-e2e; exit 1; }
speak "alone" || { podman logs cosy-e2e; exit 1; }
podman exec cosy-e2e cosy doctor --quick | grep -E '^  (config file|model folder|voices folder|library):' | sed 's/^/    /'
podman stop -t 40 cosy-e2e >/dev/null
say "  stopped (SIGTERM: drained, exit $(podman inspect cosy-e2e --format '{{.State.ExitCode}}'))"
podman rm cosy-e2e >/dev/null

say "kube play: deploy/k8s (configmap, pvc, deployment, service, hpa)"
# The claims first (podman makes a volume of each), then the model copied into its volume as
# `kubectl cp` would, and the voices volume given to UID 10001 (fsGroup's work on a cluster).
podman kube play "$root/deploy/k8s/pvc.yaml" 2>&1 | sed 's/^/    /'
cp -r "$root/tests/fixtures/tiny/." "$(podman volume inspect cosy-models --format '{{.Mountpoint}}')/"
chown 10001:10001 "$(podman volume inspect cosy-voices --format '{{.Mountpoint}}')"
# The other manifests as they are, but with the pod on the host's network (no CNI network here),
# so without the container's port list (podman refuses port mappings on the host's network), and
# the config's bind on PORT.
for f in configmap deployment service hpa; do echo "---"; cat "$root/deploy/k8s/$f.yaml"; done \
  | sed -e "s/^\(\s*\)enableServiceLinks: false/\1enableServiceLinks: false\n\1hostNetwork: true/" \
        -e '/^          ports:$/,/^              protocol: TCP$/d' \
        -e "s/bind = \"0.0.0.0:8080\"/bind = \"127.0.0.1:$port\"/" > "$work/kube.yaml"
podman kube play "$work/kube.yaml" 2>&1 | sed 's/^/    /'
wait_ready "kube play" || { podman pod logs "$(podman pod ls -q | head -n1)" 2>&1 | tail -20; exit 1; }
speak "kube play" || exit 1
ctr="$(podman ps --format '{{.Names}}' | grep -- '-cosy$' | head -n1)"
say "  $ctr: $(podman inspect "$ctr" --format 'user {{.Config.User}}, read-only root {{.HostConfig.ReadonlyRootfs}}, no new privileges: {{.HostConfig.SecurityOpt}}')"
podman kube down "$work/kube.yaml" >/dev/null
say "  podman kube down"
say "done: every check passed"
