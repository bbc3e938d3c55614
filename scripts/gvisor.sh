#!/usr/bin/env bash
# Installs gVisor's runsc (the Debian package) and registers it with the running Docker engine
# as the runtime "runsc", for `[docker] runtime = "runsc"` and the tests under gVisor.
# Idempotent. Never restarts dockerd (other containers keep running): the runtime is written
# into /etc/docker/daemon.json and dockerd is sent SIGHUP, which reloads "runtimes".
#
# runtimeArgs: --network=none because Debian's runsc (0.0~20221219) refuses to start any
# container on Linux >= 6.11 otherwise ("cannot run with network enabled in root network
# namespace", gVisor issue 10704) and sessions have no network anyway; --oci-seccomp so that
# Docker's seccomp profile is loaded inside the sandbox as well (its first process only).
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
DAEMON_JSON=/etc/docker/daemon.json

if ! command -v runsc >/dev/null 2>&1; then
    echo "sandboxd: installing runsc (gVisor)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends runsc >&2
fi
RUNSC=$(command -v runsc)

want=$(python3 -c 'import json,sys; print(json.dumps({"path": sys.argv[1], "runtimeArgs": ["--network=none", "--oci-seccomp"]}, sort_keys=True))' "$RUNSC")
have=$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null || true)
norm() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read() or "null") or {}; print(json.dumps({"path": d.get("path"), "runtimeArgs": d.get("runtimeArgs") or []}, sort_keys=True))'; }
if [ "$(printf '%s' "$have" | norm)" != "$want" ]; then
    echo "sandboxd: registering runsc with Docker in $DAEMON_JSON (reload by SIGHUP, no restart)" >&2
    $SUDO python3 - "$DAEMON_JSON" "$want" <<'PY'
import json, os, sys
path, want = sys.argv[1], json.loads(sys.argv[2])
try:
    with open(path) as f:
        conf = json.load(f)
except FileNotFoundError:
    conf = {}
conf.setdefault("runtimes", {})["runsc"] = want
tmp = path + ".sandboxd-tmp"
with open(tmp, "w") as f:
    json.dump(conf, f, indent=1)
os.replace(tmp, path)
PY
    pid=$(pidof dockerd || true)
    if [ -z "$pid" ]; then
        echo "sandboxd: no dockerd process to reload" >&2
        exit 1
    fi
    $SUDO kill -HUP $pid
    for _ in $(seq 1 20); do
        [ "$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null | norm)" = "$want" ] && break
        sleep 0.5
    done
fi
if [ "$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null | norm)" != "$want" ]; then
    echo "sandboxd: dockerd did not pick up the runsc runtime (see its log)" >&2
    exit 1
fi
echo "sandboxd: runsc $(runsc --version | head -1 | awk '{print $3}') registered with Docker" >&2
