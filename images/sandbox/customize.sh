#!/bin/bash
# Finishes the sandbox rootfs after mmdebstrap installed the packages (a --customize-hook).
#
# Usage: bash customize.sh ROOTFS   (SANDBOXD_RECIPE_DIR must point at the recipe directory)
#
# Adds the unprivileged `sandbox` user the containers run as, the /workspace mount point, the
# in-container helpers, and removes host details that mmdebstrap copied in.
set -euo pipefail

root=${1:?usage: customize.sh ROOTFS}
recipe_dir=${SANDBOXD_RECIPE_DIR:?SANDBOXD_RECIPE_DIR is not set}

echo "I: sandboxd: creating user sandbox (1000:1000, home /workspace)" >&2
# Written directly rather than with useradd: the image has no passwd package, and uid/gid must be
# exactly 1000 because the session code and the tmpfs mount options name them numerically.
grep -q '^sandbox:' "$root/etc/group" || echo 'sandbox:x:1000:' >> "$root/etc/group"
grep -q '^sandbox:' "$root/etc/passwd" ||
    echo 'sandbox:x:1000:1000:sandboxd session user:/workspace:/bin/bash' >> "$root/etc/passwd"
if [ -f "$root/etc/shadow" ] && ! grep -q '^sandbox:' "$root/etc/shadow"; then
    echo 'sandbox:!:::::::' >> "$root/etc/shadow"
fi
install -d -o 1000 -g 1000 -m 0755 "$root/workspace"

echo "I: sandboxd: installing helpers into /usr/local/lib/sandboxd" >&2
install -d -o root -g root -m 0755 "$root/usr/local/lib/sandboxd"
(
    cd "$recipe_dir/helpers"
    find . -type f ! -name .keep -print0 | sort -z | while IFS= read -r -d '' f; do
        install -D -o root -g root -m 0755 "$f" "$root/usr/local/lib/sandboxd/${f#./}"
    done
)
# install -D creates intermediate directories with the umask; make them predictable too.
find "$root/usr/local/lib/sandboxd" -type d -exec chmod 0755 {} +

# mmdebstrap resolves the Essential set on its own, before packages.txt is read, and so takes
# init-system-helpers' first alternative "usrmerge", which drags in perl (~55 MB). The rootfs is
# merged-/usr already and packages.txt installs usr-is-merged, so it can go. dpkg refuses if
# anything still depends on one of these, which keeps this list honest.
echo "I: sandboxd: removing usrmerge and the perl it needed" >&2
chroot "$root" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl \
    libtext-glob-perl perl perl-modules-5.36 libperl5.36 >&2

# python3-scipy depends on python3-pythran (its build-time compiler: the compiled modules need
# nothing of it at run time), which pulls in g++, boost and the Python headers (~400 MB). Only
# pythran is removed against a dependency (--force-depends); the rest goes by a normal purge,
# which dpkg refuses if anything left still needs it, so this list stays honest.
echo "I: sandboxd: removing pythran and the C++ toolchain it pulled in" >&2
chroot "$root" dpkg --purge --force-depends python3-pythran >&2
chroot "$root" dpkg --purge python3-beniget python3-gast python3-ply libxsimd-dev \
    libboost-dev libboost1.74-dev python3-all-dev python3-all libpython3-all-dev python3-dev \
    libpython3-dev python3.11-dev libpython3.11-dev libpython3.11 libexpat1-dev zlib1g-dev \
    libopenblas-dev libopenblas-pthread-dev libopenblas0 libopenblas0-pthread \
    g++ g++-12 libstdc++-12-dev gcc gcc-12 libgcc-12-dev cpp cpp-12 libcc1-0 libisl23 libmpc3 \
    libmpfr6 libasan8 liblsan0 libtsan2 libubsan1 libitm1 libatomic1 binutils \
    binutils-x86-64-linux-gnu binutils-common libbinutils libctf0 libctf-nobfd0 libgprofng0 \
    libjansson4 libc6-dev libc-dev-bin libcrypt-dev libnsl-dev libtirpc-dev linux-libc-dev \
    rpcsvc-proto >&2

# The libraries' own test suites (~45 MB for pandas and matplotlib alone) are never imported by
# user code. They are deleted here rather than kept out with dpkg path-exclude, because the
# packages' postinst byte-compiles every listed .py file and fails on missing ones.
echo "I: sandboxd: removing the test suites of the python libraries" >&2
rm -rf "$root/usr/lib/python3/dist-packages/pandas/tests" \
    "$root/usr/lib/python3/dist-packages/matplotlib/tests" \
    "$root/usr/lib/python3/dist-packages/mpl_toolkits/tests"
for lib in scipy sklearn statsmodels seaborn plotly; do
    find "$root/usr/lib/python3/dist-packages/$lib" -depth -type d -name tests -exec rm -rf {} +
done

# matplotlib reads this file first (MATPLOTLIBRC in image.conf): Agg, and the CJK font.
install -D -o root -g root -m 0644 "$recipe_dir/matplotlibrc" \
    "$root/usr/local/share/sandboxd/matplotlibrc"

# plotly's templates (Debian keeps them in /usr/share/python3-plotly/templates, read when a figure
# is made) name no font, so a chart's text fell to whatever the viewer's browser picks for CJK.
# Every template now lists the installed CJK face after plotly's own Latin faces (a browser
# draws each glyph with the first face that has it), then the common CJK faces of the machines
# the HTML is opened on. An explicit font.family in a script still wins.
echo "I: sandboxd: naming the CJK font in plotly's templates" >&2
chroot "$root" python3 - >&2 <<'PY'
import glob, json
FAMILY = ('"Open Sans", verdana, arial, "WenQuanYi Micro Hei", "Noto Sans CJK SC", '
          '"Microsoft YaHei", "PingFang SC", sans-serif')
paths = sorted(glob.glob("/usr/share/python3-plotly/templates/*.json"))
assert paths, "no plotly templates where Debian keeps them"
for path in paths:
    with open(path, encoding="utf-8") as f:
        template = json.load(f)
    template.setdefault("layout", {}).setdefault("font", {})["family"] = FAMILY
    with open(path, "w", encoding="utf-8") as f:
        json.dump(template, f, separators=(",", ":"))
PY

# matplotlib scans the fonts on first use (~1 s); do it once here. Its cache must live in a
# writable MPLCONFIGDIR at run time (/tmp/matplotlib on tmpfs), so init.sh copies this one there
# when a container starts.
echo "I: sandboxd: building matplotlib's font cache" >&2
install -d -o root -g root -m 0755 "$root/usr/local/share/sandboxd/matplotlib"
chroot "$root" env MPLCONFIGDIR=/usr/local/share/sandboxd/matplotlib \
    MATPLOTLIBRC=/usr/local/share/sandboxd/matplotlibrc MPLBACKEND=Agg HOME=/tmp \
    python3 -c 'import matplotlib.pyplot' >&2
chmod -R a+rX "$root/usr/local/share/sandboxd"

# The host's apt sources (mirror URLs, possibly with credentials), hostname and resolver were
# needed during the build only. Docker supplies hostname/hosts/resolv.conf at run time.
rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
: > "$root/etc/hostname"
: > "$root/etc/resolv.conf"
rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
