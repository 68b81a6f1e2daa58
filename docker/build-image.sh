#!/usr/bin/env bash
# Builds the emx node image (tag emx-node:<content hash>, and emx-node:latest)
# FROM scratch: emxd and emxctl linked statically against DPDK, the
# entrypoint's few tools from this machine (sh, ip, sleep), and the shared
# libraries ldd lists for all of them (glibc, libnuma, libbpf, ...). No
# registry is needed. The image is cached: when the binaries and libraries hash the
# same as an existing image, nothing is rebuilt. Prints the content-hash tag
# (the one a run should use: another tree's build may move latest) on
# stdout, everything else on stderr.
#
# Takes about 2 minutes the first time on 2 cores (the static build compiles
# the workspace into target/static), seconds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the tag goes to stdout (fd 3 keeps it); whatever the steps print goes to stderr.
exec 3>&1 1>&2
start=$(date +%s)
command -v docker >/dev/null || { echo "build-image: docker is not installed" >&2; exit 1; }
# (fd 3, the tag's way out, is closed for everything the build runs, so that
# nothing that outlives it holds the caller's pipe open.)
bash scripts/setup.sh 3>&-
echo "build-image: building emxd and emxctl with DPDK linked statically (target/static)..." >&2
CARGO_TARGET_DIR=target/static EMX_DPDK_STATIC=1 \
    cargo build --release --quiet -p emx-daemon --bin emxd --bin emxctl 3>&-
# A context of this run's own: two builds at once in one tree must not share one.
mkdir -p target
ctx=$(mktemp -d target/docker.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/rootfs/usr/local/bin" "$ctx/rootfs/etc/emx" "$ctx/rootfs/run/emx" \
    "$ctx/rootfs/tmp" "$ctx/rootfs/var/run"
chmod 1777 "$ctx/rootfs/tmp"
cp target/static/release/emxd target/static/release/emxctl "$ctx/rootfs/usr/local/bin/"
cp docker/entrypoint.sh "$ctx/rootfs/usr/local/bin/emx-entrypoint"
# The entrypoint's tools, from this machine: a shell, ip (iproute2), sleep.
mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/sbin"
cp -L "$(command -v dash)" "$ctx/rootfs/bin/sh"
cp -L "$(command -v ip)" "$ctx/rootfs/sbin/ip"
cp -L "$(command -v sleep)" "$ctx/rootfs/bin/sleep"
# The libraries the binaries load, at the paths the loader looks for them.
# (A static binary among them makes ldd exit 1: its lines say so, and hold
# no library.)
libs=$(ldd "$ctx"/rootfs/usr/local/bin/emx[dc]* "$ctx"/rootfs/bin/* "$ctx"/rootfs/sbin/*) || true
if missing=$(grep 'not found' <<< "$libs"); then
    echo "build-image: a library the image needs is not on this machine (install its package):" >&2
    echo "$missing" >&2
    exit 1
fi
for lib in $(awk '/=>/ { print $3 } /^[[:space:]]*\// { print $1 }' <<< "$libs" | sort -u); do
    mkdir -p "$ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$ctx/rootfs$lib"
done
cp config/examples/docker.toml "$ctx/rootfs/etc/emx/cluster.toml"
cp docker/Dockerfile "$ctx/Dockerfile"
hash=$(cd "$ctx" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-12)
if docker image inspect "emx-node:$hash" >/dev/null 2>&1; then
    echo "build-image: emx-node:$hash is up to date (cached)" >&2
else
    DOCKER_BUILDKIT=0 docker build --quiet -t "emx-node:$hash" "$ctx" >/dev/null 2>&1 3>&- \
        || docker build -t "emx-node:$hash" "$ctx" 3>&-
    echo "build-image: built emx-node:$hash" >&2
fi
docker tag "emx-node:$hash" emx-node:latest
# Each change of the code makes an image (about 35 MB): earlier builds' go
# once they are EMX_IMAGE_KEEP_S old (a day by default) and no container
# uses them (docker rmi refuses those; a kept testbed's stay).
keep_s=${EMX_IMAGE_KEEP_S:-86400}
now=$(date +%s)
for img in $(docker image ls emx-node --format '{{.Repository}}:{{.Tag}}'); do
    if [ "$img" = "emx-node:$hash" ] || [ "$img" = emx-node:latest ]; then continue; fi
    created=$(docker image inspect -f '{{.Created}}' "$img" 2>/dev/null) || continue
    made=$(date -d "$created" +%s 2>/dev/null) || continue
    if [ $((now - made)) -ge "$keep_s" ] && docker rmi "$img" >/dev/null 2>&1; then
        echo "build-image: removed $img, an earlier build's" >&2
    fi
done
echo "build-image: done in $(( $(date +%s) - start )) s ($(du -sh "$ctx/rootfs" | cut -f1) image)" >&2
echo "emx-node:$hash" >&3
