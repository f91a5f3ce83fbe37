#!/usr/bin/env bash
# Install gVisor's runsc and register it with the local Docker engine as the runtime `runsc`
# (run by `make setup`). Idempotent: prints what it changed, or that nothing needed changing.
#
#   deploy/sandbox/gvisor.sh           # install + register (needs root, or sudo)
#   GVISOR=0 make setup                # skip it: sandboxes then run under runc, with a warning
#
# The registration, in /etc/docker/daemon.json (other keys are kept):
#   "runtimes": {"runsc": {"path": "/usr/bin/runsc",
#                          "runtimeArgs": ["--network=none", "--host-uds=open"]}}
# --network=none: sandboxes have no network (or Docker's bridge for a task with egress); without
# it runsc refuses to start in this setup ("cannot run with network enabled in root network
# namespace"). --host-uds=open: a sandbox may connect to the unix sockets of the host folders
# it mounts, which is its egress folder alone (the egress proxies' sockets; it cannot create
# one). The engine picks the change up on SIGHUP (no restart: running containers stay).
#
# Only Debian's runsc is used (0.0~20221219 on bookworm): no other repository is reachable here.
# It refuses statx/fstatat's AT_NO_AUTOMOUNT; the sandbox image carries a shim (noautomount.c).
set -euo pipefail

DAEMON_JSON="${DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"
RUNSC_PATH="${RUNSC_PATH:-/usr/bin/runsc}"

SUDO=""
if [[ "$(id -u)" != "0" ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO="sudo"
    else
        echo "gvisor: not root and no sudo: runsc not installed or registered (sandboxes run" \
            "under runc; see docs/runtime.md, 'gVisor')" >&2
        exit 0
    fi
fi

if ! command -v runsc >/dev/null 2>&1; then
    echo "gvisor: installing runsc (Debian package)"
    $SUDO apt-get install -y -qq runsc >/dev/null ||
        { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq runsc >/dev/null; }
    echo "gvisor: installed $(runsc --version | head -1)"
fi

# Merge the runtime into daemon.json; "changed" or "unchanged" on stdout.
change="$($SUDO python3 - "$DAEMON_JSON" "$RUNSC_PATH" <<'EOF'
import json, os, sys
path, runsc = sys.argv[1], sys.argv[2]
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {}
wanted = {"path": runsc, "runtimeArgs": ["--network=none", "--host-uds=open"]}
runtimes = config.setdefault("runtimes", {})
if runtimes.get("runsc") == wanted:
    print("unchanged")
    sys.exit(0)
runtimes["runsc"] = wanted
os.makedirs(os.path.dirname(path), exist_ok=True)
tmp = path + ".deckhands.tmp"
with open(tmp, "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
os.replace(tmp, path)
print("changed")
EOF
)"

registered() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'
}

if [[ "$change" == "changed" ]]; then
    echo "gvisor: registered runsc in $DAEMON_JSON (runtimeArgs --network=none --host-uds=open)"
fi
if [[ "$change" == "changed" ]] || ! registered; then
    pid="$(pidof dockerd || true)"
    if [[ -z "$pid" ]]; then
        echo "gvisor: dockerd is not running: start it to load $DAEMON_JSON" >&2
        exit 0
    fi
    # SIGHUP reloads daemon.json's runtimes without stopping any container.
    $SUDO kill -HUP "$pid"
    for _ in $(seq 20); do registered && break; sleep 0.5; done
    if registered; then
        echo "gvisor: dockerd (pid $pid) reloaded: runtime runsc available"
    else
        echo "gvisor: dockerd did not load runsc from $DAEMON_JSON (see its log)" >&2
        exit 1
    fi
else
    echo "gvisor: runsc $(runsc --version | head -1 | awk '{print $3}') installed and registered" \
        "(nothing changed)"
fi
