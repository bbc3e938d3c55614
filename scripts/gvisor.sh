#!/usr/bin/env bash
# Installs gVisor's runsc (a Debian package) and registers it with the running Docker engine
# as the runtime "runsc", for `[docker] runtime = "runsc"` and the tests under gVisor.
# Idempotent. Never restarts dockerd (other containers keep running): the runtime is written
# into /etc/docker/daemon.json and dockerd is sent SIGHUP, which reloads "runtimes".
#
# Which runsc: Debian 13 (trixie)'s 0.0~20240729, on this Debian 12 host too. It is one static
# binary with no dependencies, fetched by apt from the host's own Debian mirror and checked
# against the trixie keys bookworm's debian-archive-keyring already ships. Bookworm's own runsc
# (0.0~20221219) is too old for the sandbox image: its statx rejects AT_NO_AUTOMOUNT, so `ls`
# and `stat` fail, and its ptrace platform spends about eight host tasks per sandbox process.
#
# runtimeArgs: --network=none because runsc refuses to start any container on Linux >= 6.11
# otherwise ("cannot run with network enabled in root network namespace", gVisor issue 10704)
# and sessions have no network anyway; --oci-seccomp so that Docker's seccomp profile is
# loaded inside the sandbox as well (its first process only).
set -euo pipefail

# The oldest runsc that runs the sandbox image; trixie's current build of it (or a newer one an
# admin installed, e.g. from gVisor's own repository) is kept.
RUNSC_MIN="0.0~20240729"
RUNSC_SUITE="trixie"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
DAEMON_JSON=/etc/docker/daemon.json

status=$(dpkg-query -W -f '${db:Status-Abbrev}' runsc 2>/dev/null || true)
installed=$(dpkg-query -W -f '${Version}' runsc 2>/dev/null || true)
if [ "${status%% *}" != "ii" ] || ! dpkg --compare-versions "$installed" ge "$RUNSC_MIN"; then
    echo "sandboxd: installing runsc >= $RUNSC_MIN (gVisor, from Debian $RUNSC_SUITE)" >&2
    # The host's Debian mirror, as its own apt sources name it.
    mirror=$(apt-get indextargets --format '$(REPO_URI)' 'Origin: Debian' 'Component: main' 2>/dev/null | grep -v security | head -1 || true)
    mirror=${mirror:-http://deb.debian.org/debian/}
    # A private apt state, owned by root: the host's own sources, lists and pins stay as they
    # are, and only apt's download user (_apt) may write where it downloads.
    work=$($SUDO mktemp -d)
    trap '$SUDO rm -rf "$work"' EXIT
    $SUDO mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/get"
    $SUDO chmod 0755 "$work"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $RUNSC_SUITE main" |
        $SUDO tee "$work/sources.list" >/dev/null
    if id _apt >/dev/null 2>&1; then
        $SUDO chown -R _apt "$work/lists" "$work/archives" "$work/get"
    fi
    apt_private=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives" -qq)
    $SUDO apt-get "${apt_private[@]}" update
    # apt checked the package against the signed index; make it root's before dpkg reads it.
    $SUDO sh -c 'cd "$1/get" && shift && exec "$@"' sh "$work" apt-get "${apt_private[@]}" download runsc
    $SUDO chown -R root "$work/get"
    $SUDO sh -c 'exec dpkg -i "$1"/get/runsc_*.deb' sh "$work" >&2
    installed=$(dpkg-query -W -f '${Version}' runsc)
    if ! dpkg --compare-versions "$installed" ge "$RUNSC_MIN"; then
        echo "sandboxd: Debian $RUNSC_SUITE gave runsc $installed, older than $RUNSC_MIN" >&2
        exit 1
    fi
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
