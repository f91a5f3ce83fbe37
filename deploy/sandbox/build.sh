#!/usr/bin/env bash
# Build the sandbox image without any registry.
#
#   deploy/sandbox/build.sh            # builds deckhands/sandbox:latest if it is missing or
#                                      # was built from other sources (SOURCES below)
#   FORCE=1 deploy/sandbox/build.sh    # rebuilds it
#
# Environment:
#   SANDBOX_IMAGE  tag to build            (default deckhands/sandbox:latest;
#                                           DECKHANDS_SANDBOX_IMAGE is honoured too)
#   BASE_IMAGE     image to build FROM     (default deckhands/base:bookworm; where a registry
#                                           exists, python:3.12-slim works as well)
#   SUITE          Debian suite for the base rootfs (default bookworm)
#   FORCE=1        rebuild the sandbox image even if its tag exists
#   FORCE_BASE=1   also rebuild the default base image from a fresh rootfs
#
# When BASE_IMAGE is the default and missing (or built from another packages.txt), a minimal
# Debian root filesystem with the packages of packages.txt is made with mmdebstrap (from the
# host's apt mirror) and `docker import`ed as the base.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SANDBOX_IMAGE="${SANDBOX_IMAGE:-${DECKHANDS_SANDBOX_IMAGE:-deckhands/sandbox:latest}}"
DEFAULT_BASE="deckhands/base:bookworm"
BASE_IMAGE="${BASE_IMAGE:-$DEFAULT_BASE}"
SUITE="${SUITE:-bookworm}"
FORCE="${FORCE:-0}"
FORCE_BASE="${FORCE_BASE:-0}"


# Every file the image is built from, relative to the repository root, in an order that is the
# same everywhere: deploy/sandbox/'s go to the top of the build context, the sandbox contract
# (shared/sandbox_protocol/, which the executor imports) to its shared/.
mapfile -t SOURCES < <(cd "$ROOT" && printf '%s\n' \
    deploy/sandbox/{Dockerfile,packages.txt,noautomount.c,holder.py,egress_relay.py} deploy/sandbox/executor/*.py \
    shared/__init__.py shared/sandbox_protocol/*.py | LC_ALL=C sort)
# The image records which sources it was built from (their names and contents): an image of an
# older executor (whose protocol the runtime may have outgrown) is rebuilt, not reused.
SOURCE="$(cd "$ROOT" && for path in "${SOURCES[@]}"; do printf '%s\0' "$path"; cat "$path"; done \
    | sha256sum | cut -c1-16)"
# The Debian packages of the base (packages.txt, one a line, `#` comments): a base built from
# another list is rebuilt.
PACKAGES="$(sed -e 's/#.*//' "$HERE/packages.txt" | tr -s ' \n' '\n' | grep -v '^$' | sort -u | paste -sd, -)"
PACKAGES_HASH="$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-16)"
base_current() {
    [[ "$(docker image inspect -f '{{ index .Config.Labels "deckhands.base.packages" }}' \
        "$BASE_IMAGE" 2>/dev/null)" == "$PACKAGES_HASH" ]]
}
current() {
    [[ "$(docker image inspect -f '{{ index .Config.Labels "deckhands.sandbox.source" }}' \
        "$SANDBOX_IMAGE" 2>/dev/null)" == "$SOURCE" ]]
}

if [[ "$FORCE" != "1" ]] && current; then
    echo "sandbox image $SANDBOX_IMAGE is up to date (FORCE=1 rebuilds it)"
    exit 0
fi

# Serialise concurrent builds (tests and `make` may race): the second waits, then skips.
exec 9>"${TMPDIR:-/tmp}/deckhands-sandbox-build.lock"
flock 9
if [[ "$FORCE" != "1" ]] && current; then
    echo "sandbox image $SANDBOX_IMAGE is up to date (built concurrently)"
    exit 0
fi

build_base() {
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        echo "installing mmdebstrap"
        SUDO=""
        [[ "$(id -u)" != "0" ]] && SUDO="sudo"
        $SUDO apt-get install -y mmdebstrap || { $SUDO apt-get update && $SUDO apt-get install -y mmdebstrap; }
    fi
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    echo "building base rootfs ($SUITE) with mmdebstrap"
    mmdebstrap --variant=minbase \
        --include="$PACKAGES" \
        --aptopt='APT::Install-Recommends "false"' \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$tmp/rootfs.tar"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL deckhands.base.packages=$PACKAGES_HASH" \
        "$tmp/rootfs.tar" "$BASE_IMAGE"
}

if [[ "$BASE_IMAGE" == "$DEFAULT_BASE" ]] && { [[ "$FORCE_BASE" == "1" ]] || ! base_current; }; then
    build_base
fi

# The build context: the sources, and noautomount.so compiled here (the image has no compiler;
# the host's glibc is the image's, Debian bookworm's 2.36). See noautomount.c for why.
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
for path in "${SOURCES[@]}"; do
    target="$context/${path#deploy/sandbox/}"
    mkdir -p "$(dirname "$target")"
    cp "$ROOT/$path" "$target"
done
if ! command -v gcc >/dev/null 2>&1; then
    echo "gcc is needed to build the sandbox image (apt-get install gcc libc6-dev)" >&2
    exit 1
fi
gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o "$context/noautomount.so" "$HERE/noautomount.c"

echo "building $SANDBOX_IMAGE from $BASE_IMAGE"
docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" --label "deckhands.sandbox.source=$SOURCE" \
    -t "$SANDBOX_IMAGE" "$context"
echo "built $SANDBOX_IMAGE"
