#!/usr/bin/env bash
# The layering, checked from cargo's own dependency graph (ARCHITECTURE.md, "Layers"): fails
# when the core crate's tree (normal dependencies) holds bollard, rusqlite or axum, when the
# server crate depends on a backend or a store crate, or when a crate other than the Docker
# backend pulls bollard or one other than the SQLite store pulls rusqlite.
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
tree() { cargo tree --locked --offline -e normal --prefix none --format '{p}' -p "$1" 2>/dev/null |
    awk '{print $1}' | sort -u; }
refuse() { # crate, forbidden dependency, why
    if tree "$1" | grep -qx "$2"; then
        echo "layers: $1 depends on $2 ($3)" >&2
        fail=1
    fi
}

for dep in bollard rusqlite axum tokio-rusqlite; do
    refuse sandboxd-core "$dep" "the core names no backend, no store and no HTTP framework"
done
for dep in sandboxd-docker sandboxd-sqlite bollard rusqlite; do
    refuse sandboxd-server "$dep" "the server runs on any runtime and any store, chosen by the binary"
done
for crate in sandboxd-sqlite sandboxd-testkit; do
    refuse "$crate" bollard "only sandboxd-docker talks to the Docker engine"
done
for crate in sandboxd-docker sandboxd-testkit; do
    refuse "$crate" rusqlite "only sandboxd-sqlite opens SQLite"
done

if [ "$fail" = 0 ]; then echo "layers: ok"; fi
exit "$fail"
