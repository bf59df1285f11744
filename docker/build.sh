#!/usr/bin/env bash
# Build counterfactory's CPU image the way CI does, and with --smoke run the demo inside it.
#
#   docker/build.sh cpu [--smoke [--data DIR]] [--base IMAGE] [--tag TAG]
#
# --base IMAGE   the image to build FROM (the Dockerfile's PYTHON_IMAGE build argument). Without it
#                the base is Debian bookworm bootstrapped here with debootstrap (Python 3.11, as
#                python:3.11-slim-bookworm) and imported as counterfactory-base:bookworm, once: a
#                later build reuses that image. No image registry is needed.
# --smoke        then run the demo in the image as its non-root user, offline (--network none), with a
#                host folder mounted on /data, and `counterfactory verify` on the release it wrote.
# --data DIR     the host folder for --smoke (kept afterwards; default: a temporary one, removed).
#                With COUNTERFACTORY_RERENDER_CACHE set to a folder here, the smoke run reads TAEF2
#                round trips from it, mounted read-only (keys are the graphs' bytes, onnxruntime's
#                version and the pixels: a hit is the byte-identical round trip; the models still load).
#
# pip inside the build is given this machine's CA bundle as a BuildKit secret (never a layer) and
# the same package index this machine's pip uses (http(s) indexes only: a file:// index on the host
# is not in the build). The `cuda` target is not built by this script: it needs an image registry
# (nvidia/cuda) and is built where one and a GPU exist (README "Docker").
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: docker/build.sh cpu [--smoke [--data DIR]] [--base IMAGE] [--tag TAG]" >&2; exit 2; }
[ $# -ge 1 ] || usage
target=$1
shift
smoke=0
base=""
tag="counterfactory:cpu"
data=""
while [ $# -gt 0 ]; do
    case $1 in
        --smoke) smoke=1 ;;
        --base) base=${2:?--base needs an image}; shift ;;
        --tag) tag=${2:?--tag needs a name}; shift ;;
        --data) data=${2:?--data needs a folder}; shift ;;
        *) usage ;;
    esac
    shift
done
if [ "$target" != cpu ]; then
    echo "docker/build.sh builds the cpu target only; build cuda with" \
        "'docker build --target cuda -t counterfactory:cuda .' where nvidia/cuda can be pulled" >&2
    exit 2
fi

# BuildKit (for the build secret) without buildx: Debian's docker.io client (20.10) builds with
# DOCKER_BUILDKIT=1 through the daemon; a newer client on PATH needs the buildx plugin instead.
if [ -z "${DOCKER:-}" ]; then
    DOCKER=docker
    if ! docker buildx version >/dev/null 2>&1 && [ -x /usr/bin/docker ]; then
        DOCKER=/usr/bin/docker
    fi
fi
export DOCKER_BUILDKIT=1
log() { echo "[build.sh $(date -u +%H:%M:%S)] $*"; }
started=$(date +%s)

if [ -z "$base" ]; then
    base=counterfactory-base:bookworm
    if "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
        log "base: $base (bootstrapped earlier)"
    else
        mirror=http://deb.debian.org/debian
        if [ -f /etc/apt/sources.list.d/debian.sources ]; then
            found=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
            mirror=${found:-$mirror}
        fi
        command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
        root=$(mktemp -d /tmp/counterfactory-base.XXXXXX)
        trap 'rm -rf "$root"' EXIT
        log "base: bootstrapping Debian bookworm from $mirror into $root"
        debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
            bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
        tar -C "$root" -c . | "$DOCKER" import -c 'ENV LANG=C.UTF-8' -c 'CMD ["bash"]' - "$base" >/dev/null
        rm -rf "$root" "$root.log"
        trap - EXIT
        log "base: imported $base ($("$DOCKER" image inspect -f '{{.Size}}' "$base" | awk '{printf "%.0f MB", $1/1e6}'))"
    fi
fi

# the host pip's index settings (PIP_* environment first, then pip's config files)
pip_setting() {
    local env=$1 key=$2 value
    value=${!env:-}
    if [ -z "$value" ] && command -v python3 >/dev/null; then
        value=$(python3 -m pip config get "global.$key" 2>/dev/null || true)
    fi
    # only what a build can reach: http(s) URLs (a file:// index lies on the host's disk)
    printf '%s\n' $value | grep -E '^https?://' | paste -sd' ' - || true
}
index_url=$(pip_setting PIP_INDEX_URL index-url)
extra_index_url=$(pip_setting PIP_EXTRA_INDEX_URL extra-index-url)
log "pip index: ${index_url:-https://pypi.org/simple, the default}${extra_index_url:+, extra: $extra_index_url}"

secret=()
cert=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
if [ -f "$cert" ]; then
    secret=(--secret "id=pip_cert,src=$cert")
fi

log "building $tag (target cpu, FROM $base)"
"$DOCKER" build --network host --target cpu -t "$tag" \
    --build-arg "PYTHON_IMAGE=$base" \
    --build-arg "PIP_INDEX_URL=$index_url" \
    --build-arg "PIP_EXTRA_INDEX_URL=$extra_index_url" \
    "${secret[@]}" .
size=$("$DOCKER" image inspect -f '{{.Size}}' "$tag")
log "built $tag: $(awk -v s="$size" 'BEGIN {printf "%.0f MB", s/1e6}') in $(($(date +%s) - started)) s"

[ "$smoke" = 1 ] || exit 0

# --smoke: the demo as the image's user (not root), offline, state on a host folder at /data
keep=1
if [ -z "$data" ]; then
    data=$(mktemp -d /tmp/counterfactory-smoke.XXXXXX)
    keep=0
fi
mkdir -p "$data"
data=$(cd "$data" && pwd)
uid=$("$DOCKER" run --rm --network none --entrypoint id "$tag" -u)
[ "$uid" != 0 ] || { echo "the image runs as root" >&2; exit 1; }
chown "$uid" "$data" 2>/dev/null || chmod 0777 "$data"
log "smoke: demo as uid $uid, /data = $data"
cache=()
if [ -n "${COUNTERFACTORY_RERENDER_CACHE:-}" ] && [ -d "$COUNTERFACTORY_RERENDER_CACHE" ]; then
    cache=(-v "$(cd "$COUNTERFACTORY_RERENDER_CACHE" && pwd):/rerender-cache:ro" -e COUNTERFACTORY_RERENDER_CACHE=/rerender-cache)
    log "smoke: TAEF2 round trips read from $COUNTERFACTORY_RERENDER_CACHE (read-only)"
fi
smoke_started=$(date +%s)
"$DOCKER" run --rm --network none -v "$data:/data" "${cache[@]}" "$tag" \
    run /opt/counterfactory/assets/specs/demo-face.yaml --out /data/demo-face --publish --allow-incomplete --no-progress
release=/data/demo-face/releases/demo-face/0.1.0
"$DOCKER" run --rm --network none -v "$data:/data" "$tag" verify "$release"
owner=$(stat -c %u "$data/demo-face/releases/demo-face/0.1.0/manifest.parquet" 2>/dev/null \
    || stat -c %u "$data/demo-face/ledger.sqlite")
[ "$owner" = "$uid" ] || { echo "the release on /data is owned by uid $owner, not the image's user $uid" >&2; exit 1; }
log "smoke: demo and verify passed in $(($(date +%s) - smoke_started)) s; the release on the host is owned by uid $owner"
[ "$keep" = 1 ] || rm -rf "$data"
log "done in $(($(date +%s) - started)) s"
