//! The grammar of an egress policy as regular expressions, for the API's schema: what
//! `EgressPolicy` parsing accepts, stated so that a client (or schemathesis) can tell a policy
//! the server will take from one it will refuse without asking.
//!
//! The patterns are ECMA-262 (JSON Schema's dialect) and use nothing beyond ASCII classes,
//! groups, bounded repetition and negative lookahead, so Python's `re` and Rust's
//! fancy-regex read them alike. They must say exactly what the parser does: a string the
//! pattern allows but the parser refuses (or the reverse) is a bug the tests look for
//! (`tests/serve_fuzz.rs` compares the two on thousands of strings).
//!
//! Two limits of the parser are not regular and are stated as lengths instead: at most
//! `MAX_RULES` rules (an array's `maxItems`; the string form's `MAX_POLICY_CHARS` admits no
//! more) and `MAX_RULE_CHARS` per rule (an array item's `maxLength`; in the string form a
//! lookahead).

use std::fmt::Write;

/// The longest policy written as one string (`"a.org,*.b.org"`); longer policies are arrays.
/// 512 characters hold at most 256 rules, so the string form needs no count of its own.
pub const MAX_POLICY_CHARS: usize = 512;

/// The longest rule, as written (spaces around it and a `!` included).
pub const MAX_RULE_CHARS: usize = 253;

/// Spaces (only U+0020) may surround a rule.
const SP: &str = "[ ]*";
const LABEL: &str = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
const OFF: &str = "[oO][fF][fF]";
const HEX: &str = "[0-9a-fA-F]{1,4}";
const OCTET: &str = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";

/// An IPv4 address as Rust's `Ipv4Addr` parses it (no leading zeros, octets to 255).
fn ipv4() -> String {
    format!("(?:{OCTET}\\.){{3}}{OCTET}")
}

/// An IPv6 address as Rust's `Ipv6Addr` parses it: eight groups, or `::` standing for at
/// least one, with an embedded IPv4 address only as the last 32 bits.
fn ipv6() -> String {
    let v4 = ipv4();
    let mut alts = vec![
        format!("(?:{HEX}:){{7}}{HEX}"),
        format!("(?:{HEX}:){{6}}{v4}"),
    ];
    for head in 0..=7usize {
        let mut alt = String::new();
        if head > 0 {
            let _ = write!(alt, "(?:{HEX}:){{{}}}{HEX}", head - 1);
        }
        alt.push_str("::");
        let room = 7 - head;
        let mut tails = Vec::new();
        if room >= 1 {
            tails.push(format!("(?:{HEX}:){{0,{}}}{HEX}", room - 1));
        }
        if room >= 2 {
            tails.push(format!("(?:{HEX}:){{0,{}}}{v4}", room - 2));
        }
        if !tails.is_empty() {
            let _ = write!(alt, "(?:{})?", tails.join("|"));
        }
        alts.push(alt);
    }
    format!("(?:{})", alts.join("|"))
}

/// One rule without its `!`: a host name or `*.domain` (one trailing dot allowed), `any`
/// (a name to the grammar), an IP address, or an IPv6 address in brackets.
fn rule() -> String {
    let v6 = ipv6();
    format!("(?:(?:\\*\\.)?{LABEL}(?:\\.{LABEL})*\\.?|{v6}|\\[{v6}\\])")
}

/// Not more than `MAX_RULE_CHARS` before the next comma or the end.
fn short() -> String {
    format!("(?![^,]{{{}}})", MAX_RULE_CHARS + 1)
}

/// An allowing rule as one item: anything but `off`, which stands alone.
fn allow() -> String {
    format!(
        "{short}{SP}(?!{OFF}{SP}(?:,|$)){rule}{SP}",
        short = short(),
        rule = rule()
    )
}

/// A denying rule as one item.
fn deny() -> String {
    format!("{short}{SP}!{rule}{SP}", short = short(), rule = rule())
}

fn anchored(body: &str) -> String {
    format!("^(?:{body})$")
}

/// The policy as one string: `off` alone, or comma-separated rules of which one at least
/// allows (denials alone allow nothing).
pub fn string_pattern() -> String {
    let (allow, deny) = (allow(), deny());
    anchored(&format!(
        "{short}{SP}{OFF}{SP}|(?:{deny},)*{allow}(?:,(?:{allow}|{deny}))*",
        short = short()
    ))
}

/// One item of the array form that is a rule (allowing or denying).
pub fn rule_pattern() -> String {
    anchored(&format!("{}|{}", allow(), deny()))
}

/// One item of the array form that allows (the array must contain one).
pub fn allow_pattern() -> String {
    anchored(&allow())
}

/// The one item of the array form `["off"]`.
pub fn off_pattern() -> String {
    anchored(&format!("{}{SP}{OFF}{SP}", short()))
}
