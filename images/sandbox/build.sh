#!/bin/bash
# Builds the sandbox image's root filesystem as an uncompressed tar with mmdebstrap.
#
# Usage: bash build.sh OUTPUT.tar
#
# Packages come from the host's own Debian bookworm apt sources (select-sources.awk picks them),
# so the build needs no container registry and this recipe names no mirror. sandboxd embeds this
# directory, writes it to a temp dir and runs this script; the directory's content hash is the
# image tag, so any edit here makes `sandboxd image build` rebuild. Needs root (or an unshare-
# capable user) because the rootfs holds root-owned files.
set -euo pipefail

recipe_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=${1:?usage: build.sh OUTPUT.tar}

command -v mmdebstrap >/dev/null || { echo "E: mmdebstrap is missing: apt-get install mmdebstrap" >&2; exit 127; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Ask apt where this host keeps its sources and downloaded Release files instead of assuming.
eval "$(apt-config shell sources_list Dir::Etc::sourcelist/f sources_parts Dir::Etc::sourceparts/d lists_dir Dir::State::lists/d)"
mirrors=()
select_sources() { # mode output files...
    local mode=$1 output=$2
    shift 2
    local files=()
    for f in "$@"; do [ -f "$f" ] && files+=("$f"); done
    [ ${#files[@]} -gt 0 ] || return 0
    for f in "${files[@]}"; do
        awk -v mode="$mode" -v lists="$lists_dir" -f "$recipe_dir/select-sources.awk" "$f"
    done > "$output"
    if [ -s "$output" ]; then mirrors+=("$output"); fi
}
select_sources deb822 "$work/debian.sources" "$sources_parts"/*.sources
select_sources oneline "$work/debian.list" "$sources_list" "$sources_parts"/*.list
if [ ${#mirrors[@]} -eq 0 ]; then
    echo "E: no Debian bookworm entry in this host's apt sources ($sources_list, $sources_parts);" \
        "add one (e.g. the stanza Debian 12 installs in debian.sources) and run apt-get update" >&2
    exit 1
fi
for m in "${mirrors[@]}"; do
    echo "I: using host apt source entries:" >&2
    sed 's/^/I:   /' "$m" >&2
done

packages=$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$recipe_dir/packages.txt" | paste -sd, -)

# customize.sh finds the helpers and the recipe through this variable (hooks inherit the env).
export SANDBOXD_RECIPE_DIR="$recipe_dir"

# --variant=essential: the Essential:yes set plus the packages listed, installed by the host's
# apt; the image gets no apt of its own, which it could not use anyway without a network.
# The dpkg path filters keep docs, man pages and translations out of the image (copyright files
# stay: the licenses require shipping them), and also what a headless, non-interactive sandbox
# never loads: Chromium's UI translations and GTK's icon theme (minus the two files its postinst
# registers with update-alternatives).
mmdebstrap \
    --verbose \
    --variant=essential \
    --format=tar \
    --aptopt='APT::Install-Recommends "false"' \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/lib/chromium/locales/*' \
    --dpkgopt='path-include=/usr/lib/chromium/locales/en-US.pak' \
    --dpkgopt='path-exclude=/usr/share/icons/Adwaita/*' \
    --dpkgopt='path-include=/usr/share/icons/Adwaita/index.theme' \
    --dpkgopt='path-include=/usr/share/icons/Adwaita/cursor.theme' \
    --include="$packages" \
    --customize-hook='bash "$SANDBOXD_RECIPE_DIR/customize.sh" "$1"' \
    bookworm "$out" "${mirrors[@]}"
