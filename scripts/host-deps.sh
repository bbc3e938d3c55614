#!/usr/bin/env bash
# Installs what sandboxd needs on a Debian/Ubuntu host and makes sure a Docker engine answers:
# mmdebstrap (to build the sandbox image offline), Debian's chromium (the web UI's browser
# tests drive it) and Docker itself when it is missing.
# Idempotent: installs nothing that is already there. Needs root (or sudo).
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
command -v mmdebstrap >/dev/null 2>&1 || missing+=(mmdebstrap)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# stunnel4: the TLS front of tests/serve_docker_tls.rs (an engine reached as tcp:// over mutual TLS)
command -v stunnel4 >/dev/null 2>&1 || missing+=(stunnel4)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
    command -v docker >/dev/null 2>&1 || missing+=(docker-cli)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "sandboxd: installing ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

if ! docker info >/dev/null 2>&1; then
    echo "sandboxd: no Docker engine answers; starting dockerd" >&2
    if command -v systemctl >/dev/null 2>&1 && systemctl list-unit-files docker.service >/dev/null 2>&1 \
        && $SUDO systemctl start docker 2>/dev/null; then
        :
    else
        $SUDO sh -c 'nohup dockerd >/var/log/sandboxd-dockerd.log 2>&1 &'
    fi
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
fi
if ! docker info >/dev/null 2>&1; then
    echo "sandboxd: the Docker engine did not come up (see /var/log/sandboxd-dockerd.log)" >&2
    exit 1
fi
echo "sandboxd: Docker $(docker version --format '{{.Server.Version}}') answers; mmdebstrap $(mmdebstrap --version | cut -d' ' -f2)" >&2
