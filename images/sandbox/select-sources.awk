# Picks the Debian bookworm entries out of the host's apt sources so the image is built from the
# same mirrors (and keys) the host already trusts, without this recipe ever naming a mirror.
#
# Input: the host's sources files. Set -v mode=deb822 for *.sources files or -v mode=oneline for
# sources.list / *.list files, and -v lists=DIR to the host's apt lists directory
# (Dir::State::lists). Output: the kept entries in the same format, with only bookworm suites
# and Debian components left in them.
#
# An entry is Debian's when the host's downloaded Release file for it says Origin: Debian and
# Codename: bookworm[-updates|-security]; third-party repos (nodesource, google, docker, ...) fail
# that test even when they reuse the suite name "bookworm". When the host never ran apt-get update
# there is no Release file, and the suite name plus the component names decide instead.

function want_component(c) {
    return c == "main" || c == "contrib" || c == "non-free" || c == "non-free-firmware"
}

function want_codename(s) {
    return s == "bookworm" || s == "bookworm-updates" || s == "bookworm-security"
}

# apt names a list file after the URI without scheme and credentials, '/' turned into '_'.
function release_file(uri, suite,    base, f, line) {
    base = uri
    sub(/^[a-zA-Z0-9+.-]+:\/\//, "", base)
    sub(/^[^@\/]*@/, "", base)
    sub(/\/+$/, "", base)
    gsub(/\//, "_", base)
    gsub(/\//, "_", suite)
    f = lists "/" base "_dists_" suite "_InRelease"
    if ((getline line < f) > 0) { close(f); return f }
    f = lists "/" base "_dists_" suite "_Release"
    if ((getline line < f) > 0) { close(f); return f }
    return ""
}

function want_suite(uri, suite,    f, line, origin, codename, saved_rs) {
    f = release_file(uri, suite)
    if (f == "") return want_codename(suite)
    origin = ""; codename = ""
    # deb822 mode reads stanzas with RS = ""; a Release file must be read line by line
    saved_rs = RS; RS = "\n"
    while ((getline line < f) > 0) {
        if (line ~ /^Origin: /) origin = substr(line, 9)
        else if (line ~ /^Codename: /) codename = substr(line, 11)
        else if (line ~ /^(MD5Sum|SHA1|SHA256|SHA512):/) break
    }
    close(f)
    RS = saved_rs
    return origin == "Debian" && want_codename(codename)
}

function kept_components(list,    n, w, i, out) {
    n = split(list, w, /[ \t]+/)
    out = ""
    for (i = 1; i <= n; i++) if (want_component(w[i])) out = out (out == "" ? "" : " ") w[i]
    return out
}

function has_word(list, word,    n, w, i) {
    n = split(list, w, /[ \t]+/)
    for (i = 1; i <= n; i++) if (w[i] == word) return 1
    return 0
}

BEGIN {
    if (mode == "deb822") { RS = ""; FS = "\n" }
}

mode == "deb822" {
    split("", val); split("", name); nkeys = 0; key = ""
    for (i = 1; i <= NF; i++) {
        line = $i
        if (line ~ /^#/) continue
        # continuation lines (an inline Signed-By key block) belong to the previous field
        if (line ~ /^[ \t]/) { if (key != "") val[key] = val[key] "\n" line; continue }
        p = index(line, ":")
        if (p == 0) continue
        key = tolower(substr(line, 1, p - 1))
        v = substr(line, p + 1)
        sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v)
        if (!(key in val)) order[++nkeys] = key
        val[key] = v; name[key] = substr(line, 1, p - 1)
    }
    if (tolower(val["enabled"]) == "no" || !has_word(val["types"], "deb")) next
    comps = kept_components(val["components"])
    if (comps == "") next
    # a stanza may list several URIs; keep a suite only if every URI serves Debian bookworm
    nu = split(val["uris"], uris, /[ \t]+/)
    ns = split(val["suites"], suites, /[ \t]+/)
    kept = ""
    for (s = 1; s <= ns; s++) {
        ok = nu > 0
        for (u = 1; u <= nu; u++) if (!want_suite(uris[u], suites[s])) ok = 0
        if (ok) kept = kept (kept == "" ? "" : " ") suites[s]
    }
    if (kept == "") next
    val["types"] = "deb"; val["suites"] = kept; val["components"] = comps
    for (k = 1; k <= nkeys; k++) {
        key = order[k]
        printf "%s: %s\n", name[key], val[key]
    }
    printf "\n"
    split("", order)
    next
}

mode == "oneline" {
    line = $0
    sub(/#.*/, "", line)
    n = split(line, w, /[ \t]+/)
    i = 1
    if (w[i] == "") i++
    if (w[i] != "deb") next
    i++
    opts = ""
    if (substr(w[i], 1, 1) == "[") {
        while (i <= n) { opts = opts (opts == "" ? "" : " ") w[i]; if (w[i] ~ /\]$/) break; i++ }
        i++
    }
    uri = w[i]; suite = w[i + 1]
    comps = ""
    for (j = i + 2; j <= n; j++) if (want_component(w[j])) comps = comps " " w[j]
    if (uri == "" || comps == "" || !want_suite(uri, suite)) next
    print "deb " (opts == "" ? "" : opts " ") uri " " suite comps
}
