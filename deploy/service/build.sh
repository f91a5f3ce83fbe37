#!/usr/bin/env bash
# Build the one image every deckhands service runs from (deckhands/service:latest).
#
#   deploy/service/build.sh                                # Debian base made here, no registry
#   BASE_IMAGE=python:3.12-slim deploy/service/build.sh    # where a registry can be pulled from
#
# Environment:
#   SERVICE_IMAGE  tag to build         (default deckhands/service:latest)
#   BASE_IMAGE     image to build FROM  (default deckhands/service-base:bookworm, made from a
#                                        Debian rootfs with mmdebstrap when missing)
#   SUITE          Debian suite of that base (default bookworm)
#   FORCE_BASE=1   rebuild the default base from a fresh rootfs
#   WHEELHOUSE     auto (default): when the base's Python X.Y equals the host's, the host
#                  downloads and builds every wheel (pip wheel, into .run/wheels, reused next
#                  time) and the image installs them with --no-index, so the Docker build itself
#                  needs no network; 1: always do that (fails on a version mismatch); 0: never,
#                  pip inside the build fetches from PyPI.
#
# Network: the Python dependencies come from PyPI (or your pip proxy/mirror: the host's pip
# configuration is used for the wheelhouse; PIP_INDEX_URL is passed to the build otherwise).
# Without any PyPI access, fill .run/wheels/ with the wheels beforehand (any way you like).
# The Debian base needs the host's apt mirror (mmdebstrap).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SERVICE_IMAGE="${SERVICE_IMAGE:-deckhands/service:latest}"
DEFAULT_BASE="deckhands/service-base:bookworm"
BASE_IMAGE="${BASE_IMAGE:-$DEFAULT_BASE}"
SUITE="${SUITE:-bookworm}"
FORCE_BASE="${FORCE_BASE:-0}"
WHEELHOUSE="${WHEELHOUSE:-auto}"
WHEEL_CACHE="${WHEEL_CACHE:-$ROOT/.run/wheels}"

if [[ -x "$ROOT/.venv/bin/python" ]]; then HOST_PY="$ROOT/.venv/bin/python"; else HOST_PY="python3"; fi

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# One scratch folder for the base rootfs and the build context; removed however we exit.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

build_base() {
    command -v mmdebstrap >/dev/null 2>&1 || {
        echo "mmdebstrap is missing: apt-get install mmdebstrap (or set BASE_IMAGE)" >&2
        exit 1
    }
    echo "building $BASE_IMAGE: Debian $SUITE rootfs with python3, venv, pip and git (mmdebstrap)"
    # git: the runtime fetches a task's repository (services/runtime/checkout.py).
    mmdebstrap --variant=minbase \
        --include=python3,python3-venv,python3-pip,ca-certificates,git \
        --aptopt='APT::Install-Recommends "false"' \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        "$SUITE" "$WORK/rootfs.tar"
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["/bin/bash"]' \
        "$WORK/rootfs.tar" "$BASE_IMAGE"
    rm -f "$WORK/rootfs.tar"
}

if [[ "$BASE_IMAGE" == "$DEFAULT_BASE" ]] && { [[ "$FORCE_BASE" == "1" ]] || ! have_image "$BASE_IMAGE"; }; then
    build_base
fi
have_image "$BASE_IMAGE" || docker pull "$BASE_IMAGE"

# The build context holds only what the image needs (never .venv, .run or secrets).
CONTEXT="$WORK/context"
mkdir -p "$CONTEXT"
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.pyc' \
    -cf - pyproject.toml shared services tools | tar -C "$CONTEXT" -xf -
cp "$HERE/Dockerfile" "$CONTEXT/Dockerfile"
mkdir -p "$CONTEXT/wheels"
"$HOST_PY" - "$ROOT/pyproject.toml" >"$CONTEXT/requirements.txt" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as fh:
    print("\n".join(tomllib.load(fh)["project"]["dependencies"]))
PY

python_xy() { "$@" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
BASE_PY="$(python_xy docker run --rm --entrypoint python3 "$BASE_IMAGE")"
HOST_PY_XY="$(python_xy "$HOST_PY")"

# The host resolved the wheelhouse with its own Python (say 3.11.7); the base's (Debian's 3.11.2)
# can need more (e.g. `async-timeout; python_full_version < "3.11.3"`). Resolve offline inside
# the base, fetch what it reports missing with the host's pip, until nothing is.
complete_wheelhouse() {
    local attempt missing output
    for attempt in $(seq 1 15); do
        if output="$(docker run --rm --network none \
                -v "$WHEEL_CACHE:/wheels:ro" -v "$CONTEXT/requirements.txt:/requirements.txt:ro" \
                --entrypoint sh "$BASE_IMAGE" -c \
                'python3 -m venv /tmp/v && /tmp/v/bin/pip install --quiet --dry-run \
                    --disable-pip-version-check --no-index --find-links /wheels \
                    -r /requirements.txt' 2>&1)"; then
            return 0
        fi
        missing="$(sed -n 's/.*No matching distribution found for \([^; ]*\).*/\1/p' <<<"$output" | head -n 1)"
        if [[ -z "$missing" ]]; then
            echo "$output" >&2
            echo "the wheelhouse does not resolve in $BASE_IMAGE (see above)" >&2
            exit 1
        fi
        echo "the base's Python also needs $missing (round $attempt): fetching it"
        "$HOST_PY" -m pip wheel --quiet --find-links "$WHEEL_CACHE" -w "$WHEEL_CACHE" "$missing"
    done
    echo "the wheelhouse still misses packages after 15 rounds" >&2
    exit 1
}

PIP_NO_INDEX=0
if [[ "$WHEELHOUSE" == "1" ]] || { [[ "$WHEELHOUSE" == "auto" ]] && [[ "$BASE_PY" == "$HOST_PY_XY" ]]; }; then
    if [[ "$BASE_PY" != "$HOST_PY_XY" ]]; then
        echo "WHEELHOUSE=1 needs the host's Python ($HOST_PY_XY) to match the base's ($BASE_PY)" >&2
        exit 1
    fi
    echo "building the wheelhouse in $WHEEL_CACHE with the host's pip (Python $HOST_PY_XY)"
    mkdir -p "$WHEEL_CACHE"
    "$HOST_PY" -m pip wheel --quiet --find-links "$WHEEL_CACHE" -w "$WHEEL_CACHE" \
        -r "$CONTEXT/requirements.txt"
    complete_wheelhouse
    cp "$WHEEL_CACHE"/*.whl "$CONTEXT/wheels/"
    PIP_NO_INDEX=1
else
    echo "base Python $BASE_PY, host $HOST_PY_XY: pip inside the build fetches from PyPI"
fi

echo "building $SERVICE_IMAGE from $BASE_IMAGE"
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "PIP_NO_INDEX=$PIP_NO_INDEX")
if [[ -n "${PIP_INDEX_URL:-}" ]]; then
    build_args+=(--build-arg "PYPI_INDEX_URL=$PIP_INDEX_URL")
fi
docker build "${build_args[@]}" -t "$SERVICE_IMAGE" "$CONTEXT"
echo "built $SERVICE_IMAGE"
