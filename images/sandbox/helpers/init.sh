#!/bin/sh
# The session container's main process (under tini): primes per-session caches on the tmpfs
# /tmp, then idles. sandboxd reaches the container only through exec, never through this,
# but for one thing: a resumed session's container is made with `init.sh restore LEN`, and
# sandboxd's Docker backend writes the session's checked /workspace archive (LEN bytes) to
# this process's stdin as the container starts, while the session's shell is being started
# (core's shell_restore.rs). The archive is unpacked as the shell's own restore would, and
# head's and tar's statuses go to the shell through a FIFO both sides make (whoever is
# first; the other's mkfifo fails harmlessly), so the shell answers its first command only
# after the restore and says how it went. The statuses are written by this script whatever
# became of bash (killed, missing: "x <its status>"), so the shell never waits for nothing.
# Nothing else runs in the sandbox meanwhile.
if [ "${1:-}" = restore ]; then
    st=$(bash -c 'head -c "$1" | { tar -C /workspace -xf - --no-same-owner --no-same-permissions 2> /tmp/.sandboxd-restore.err; s=$?; cat > /dev/null; exit $s; }
printf "%s %s" "${PIPESTATUS[0]}" "${PIPESTATUS[1]}"' restore "${2:-0}") || st="x $?"
    mkfifo -m 600 /tmp/.sandboxd-restore 2> /dev/null
    printf '%s\n' "$st" > /tmp/.sandboxd-restore
fi
exec < /dev/null
if [ -d /usr/local/share/sandboxd/matplotlib ] && [ ! -e /tmp/matplotlib ]; then
    cp -r /usr/local/share/sandboxd/matplotlib /tmp/matplotlib 2>/dev/null || true
fi
exec sleep infinity
