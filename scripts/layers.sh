#!/usr/bin/env bash
# The layering, checked from cargo's own dependency graph (ARCHITECTURE.md, "Layers"): fails
# when the core crate's tree (normal dependencies) holds bollard, rusqlite or axum, when the
# server crate depends on a backend or a store crate, or when a crate other than the Docker
# backend pulls bollard, one other than the SQLite store pulls rusqlite, or one other than the
# Postgres store pulls tokio-postgres or deadpool, or one other than the Kubernetes backend pulls
# kube or k8s-openapi (the binary links every backend and store, so it is exempt).
set -euo pipefail
cd "$(dirname "$0")/.."

fail=0
# LAYERS_CARGO_FLAGS: --locked in CI; empty to try a change to a manifest before the lock file.
flags=${LAYERS_CARGO_FLAGS---locked}
tree() { # the crate's normal dependencies, names only; a failing `cargo tree` fails the check
    local out
    # shellcheck disable=SC2086
    out=$(cargo tree $flags -e normal --prefix none --format '{p}' -p "$1") || {
        echo "layers: cargo tree failed for $1" >&2
        exit 2
    }
    awk '{print $1}' <<<"$out" | sort -u
}
refuse() { # crate, forbidden dependency, why
    local deps
    deps=$(tree "$1") || exit 2
    if grep -qx "$2" <<<"$deps"; then
        echo "layers: $1 depends on $2 ($3)" >&2
        fail=1
    fi
}

for dep in bollard rusqlite axum tokio-rusqlite tokio-postgres deadpool-postgres deadpool kube kube-client k8s-openapi; do
    refuse sandboxd-core "$dep" "the core names no backend, no store and no HTTP framework"
done
for dep in sandboxd-docker sandboxd-kubernetes sandboxd-sqlite sandboxd-postgres bollard rusqlite tokio-postgres deadpool-postgres kube k8s-openapi; do
    refuse sandboxd-server "$dep" "the server runs on any runtime and any store, chosen by the binary"
done
for crate in sandboxd-kubernetes sandboxd-sqlite sandboxd-postgres sandboxd-testkit; do
    refuse "$crate" bollard "only sandboxd-docker talks to the Docker engine"
done
for crate in sandboxd-docker sandboxd-kubernetes sandboxd-postgres sandboxd-testkit; do
    refuse "$crate" rusqlite "only sandboxd-sqlite opens SQLite"
done
for crate in sandboxd-docker sandboxd-kubernetes sandboxd-sqlite sandboxd-testkit; do
    for dep in tokio-postgres deadpool-postgres; do
        refuse "$crate" "$dep" "only sandboxd-postgres talks to PostgreSQL"
    done
done

for crate in sandboxd-docker sandboxd-sqlite sandboxd-postgres sandboxd-testkit; do
    for dep in kube kube-client k8s-openapi; do
        refuse "$crate" "$dep" "only sandboxd-kubernetes talks to a Kubernetes API server"
    done
done

if [ "$fail" = 0 ]; then echo "layers: ok"; fi
exit "$fail"
