#!/bin/sh
# The session container's main process (under tini): primes per-session caches on the tmpfs
# /tmp, then idles. sandboxd reaches the container only through exec, never through this.
if [ -d /usr/local/share/sandboxd/matplotlib ] && [ ! -e /tmp/matplotlib ]; then
    cp -r /usr/local/share/sandboxd/matplotlib /tmp/matplotlib 2>/dev/null || true
fi
exec sleep infinity
