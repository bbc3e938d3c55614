#!/usr/bin/env python3
"""Function lengths of the production Rust code (issue 21: functions read top-down).

Scans every `.rs` file under `crates/*/src/`, skipping files named `*tests.rs`, `tests/`
directories and any item marked `#[cfg(test)]` (the `mod tests { ... }` blocks). Each `fn` item
(free functions, methods, nested functions on their own) is measured from the line of `fn` to the
line of its closing brace, both included.

Prints the functions of `--warn` lines or more, longest first, as `LINES path:line name`, and
exits 1 when one is longer than `--max` lines or more than `--allow` reach `--warn` lines.

    python3 scripts/fn-lengths.py [--max 100] [--warn 80] [--allow 10] [--root DIR]

The lexer is small on purpose: it knows Rust's comments (nested block comments too), strings
(escaped, raw `r#"..."#`, byte and C strings), char literals and lifetimes, which is all it needs
to match braces. Standard library only.
"""

import argparse
import sys
from pathlib import Path

IDENT_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
IDENT_CHARS = IDENT_START | set("0123456789")
# The punctuation the item scanner looks at; everything else is skipped.
PUNCT = set("{}()[];#")


def skip_quoted(src, i, quote):
    """Index just past the closing `quote` of a literal opened at src[i] (escapes honoured)."""
    i += 1
    while i < len(src):
        c = src[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return i + 1
        i += 1
    return i


def skip_raw_string(src, i):
    """src[i] is the `r` of r"..." or r#"..."#: index just past the end, or None if not one."""
    j = i + 1
    hashes = 0
    while j < len(src) and src[j] == "#":
        hashes += 1
        j += 1
    if j >= len(src) or src[j] != '"':
        return None  # a raw identifier (r#type) or a plain `r`
    end = src.find('"' + "#" * hashes, j + 1)
    return len(src) if end < 0 else end + 1 + hashes


def skip_block_comment(src, i):
    """src[i:i+2] is `/*`: index just past the matching `*/` (Rust block comments nest)."""
    depth = 0
    while i < len(src):
        if src.startswith("/*", i):
            depth += 1
            i += 2
        elif src.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return i


def skip_char_or_lifetime(src, i):
    """src[i] is `'`: index just past a char literal ('x', '\\n', '\\u{..}') or a lifetime."""
    if i + 1 < len(src) and src[i + 1] == "\\":
        return skip_quoted(src, i, "'")
    if i + 2 < len(src) and src[i + 2] == "'":
        return i + 3
    return i + 1  # a lifetime or label: its name lexes as an identifier


def tokens(src):
    """(kind, text, line) for identifiers and the punctuation in PUNCT, in order."""
    out = []
    line = 1
    i = 0
    n = len(src)
    while i < n:
        c = src[i]
        start = i
        if c == "\n":
            line += 1
            i += 1
            continue
        if src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
            continue
        if src.startswith("/*", i):
            i = skip_block_comment(src, i)
        elif c == '"':
            i = skip_quoted(src, i, '"')
        elif c == "'":
            i = skip_char_or_lifetime(src, i)
        elif c in IDENT_START:
            j = i
            while j < n and src[j] in IDENT_CHARS:
                j += 1
            word = src[i:j]
            nxt = src[j] if j < n else ""
            if word in ("r", "br", "cr") and nxt in ('"', "#"):
                end = skip_raw_string(src, j - 1)
                if end is not None:
                    i = end
                    line += src.count("\n", start, i)
                    continue
                if nxt == "#":
                    # r#ident: the raw identifier is the word after `r#`.
                    j += 1
                    k = j
                    while k < n and src[k] in IDENT_CHARS:
                        k += 1
                    out.append(("ident", src[j:k], line))
                    i = k
                    continue
            if word in ("b", "c") and nxt == '"':
                i = skip_quoted(src, j, '"')
            elif word == "b" and nxt == "'":
                i = skip_char_or_lifetime(src, j)
            else:
                out.append(("ident", word, line))
                i = j
                continue
        elif c in PUNCT:
            out.append(("punct", c, line))
            i += 1
            continue
        else:
            i += 1
            continue
        # Comments and literals may span lines.
        line += src.count("\n", start, i)
    return out


def matching_brace(toks, k):
    """toks[k] is `{`: the index of its closing `}` (or the last token if unbalanced)."""
    depth = 0
    for m in range(k, len(toks)):
        kind, text, _ = toks[m]
        if kind != "punct":
            continue
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
            if depth == 0:
                return m
    return len(toks) - 1


def item_body(toks, k):
    """The index of the `{` opening the item that starts at toks[k], or None if it ends with `;`.

    Parentheses and brackets are skipped so `[u8; 4]` or a default in an attribute does not end
    the item early."""
    depth = 0
    for m in range(k, len(toks)):
        kind, text, _ = toks[m]
        if kind != "punct":
            continue
        if text in "([":
            depth += 1
        elif text in ")]":
            depth -= 1
        elif depth == 0 and text == "{":
            return m
        elif depth == 0 and text == ";":
            return None
    return None


def is_cfg_test(toks, k):
    """toks[k] is `#`: whether it starts exactly `#[cfg(test)]`."""
    want = [("punct", "["), ("ident", "cfg"), ("punct", "("), ("ident", "test"), ("punct", ")")]
    got = [(kind, text) for kind, text, _ in toks[k + 1 : k + 6]]
    return got == want


def functions(src):
    """(name, first line, length in lines) of every fn item outside #[cfg(test)] items."""
    toks = tokens(src)
    found = []
    k = 0
    while k < len(toks):
        kind, text, line = toks[k]
        if kind == "punct" and text == "#" and is_cfg_test(toks, k):
            # The whole test item goes: skip past its body (or its `;` for `mod x;`).
            body = item_body(toks, k + 6)
            if body is None:
                k += 6
                while k < len(toks) and toks[k][1] != ";":
                    k += 1
            else:
                k = matching_brace(toks, body)
            k += 1
            continue
        if kind == "ident" and text == "fn" and k + 1 < len(toks) and toks[k + 1][0] == "ident":
            body = item_body(toks, k)
            if body is not None:
                close = matching_brace(toks, body)
                found.append((toks[k + 1][1], line, toks[close][2] - line + 1))
        k += 1
    return found


def source_files(root):
    """The production .rs files: crates/*/src/**, without test files, tests/ directories or
    the test-support crate (crates/testkit: the fakes and conformance suites are test code)."""
    for path in sorted(root.glob("crates/*/src/**/*.rs")):
        rel = path.relative_to(root)
        if rel.parts[1] == "testkit":
            continue
        if path.name.endswith("tests.rs") or "tests" in rel.parts[3:-1]:
            continue
        yield rel, path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--max", type=int, default=100, help="fail when a function is longer")
    ap.add_argument("--warn", type=int, default=80, help="list functions this long or longer")
    ap.add_argument("--allow", type=int, default=10, help="how many may reach --warn")
    default_root = Path(__file__).resolve().parent.parent
    ap.add_argument("--root", type=Path, default=default_root, help="the repository root")
    args = ap.parse_args()

    long_fns = []
    for rel, path in source_files(args.root):
        src = path.read_text(encoding="utf-8")
        for name, line, length in functions(src):
            if length >= args.warn:
                long_fns.append((length, f"{rel}:{line}", name))
    long_fns.sort(key=lambda f: (-f[0], f[1]))
    for length, where, name in long_fns:
        print(f"{length:4} {where} {name}")

    over_max = [f for f in long_fns if f[0] > args.max]
    print(
        f"{len(long_fns)} functions of {args.warn}+ lines (allowed {args.allow}), "
        f"{len(over_max)} over {args.max}"
    )
    if over_max or len(long_fns) > args.allow:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
