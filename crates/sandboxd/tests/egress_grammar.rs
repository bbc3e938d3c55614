//! The egress policy's schema in docs/openapi.json against the server's parser: on every
//! string and array here the document's verdict (jsonschema_rs, the validator schemathesis
//! uses, with ECMA regex semantics) and `EgressPolicy`'s deserialization agree, and every
//! policy Hypothesis draws from the document's patterns is one the parser takes. A value
//! the document allows but the server refuses (or the reverse) fails here with the value.
#![allow(clippy::unwrap_used, clippy::expect_used, unreachable_pub)] // a test crate: panics are its failures

use std::path::Path;
use std::process::Command;

use sandboxd_core::config::egress::EgressPolicy;
use serde_json::{Value, json};

/// Policies at the edges of the grammar, good and bad (each also in an array when a string).
const EDGES: &[&str] = &[
    "off",
    " OFF ",
    "Off.",
    "off,a.org",
    "a.org,off",
    "!off,a.org",
    "any",
    "ANY.",
    "*.any",
    "a.org",
    "A.Org.",
    "a.org..",
    ".a.org",
    "a..org",
    "-a.org",
    "a-.org",
    "a-b.org",
    "xn--d1a.org",
    "a_b.org",
    "*.a.org",
    "*.",
    "*",
    "**.a.org",
    "*.*.a",
    "a.*.org",
    "!a.org",
    "!a.org,b.org",
    "b.org,!a.org",
    "! a.org,b.org",
    "!!a.org,b.org",
    "a.org,",
    ",a.org",
    "a.org,,b.org",
    " ",
    "",
    "a.org , b.org",
    "a.org\t",
    "\ta.org",
    "a.org\n",
    "1.2.3.4",
    "1.2.3.4.",
    "01.2.3.4",
    "1.2.3.256",
    "[1.2.3.4]",
    "::",
    "::1",
    "[::1]",
    "[[::1]]",
    "[::1",
    "::1]",
    "::1.",
    "[::1].",
    "2001:db8::1",
    "2001:DB8::A",
    "1:2:3:4:5:6:7:8",
    "1:2:3:4:5:6:7:8:9",
    "1:2:3:4:5:6:7::",
    "::1:2:3:4:5:6:7",
    "1::2:3:4:5:6:7",
    "1:2:3:4:5:6::7",
    "::ffff:1.2.3.4",
    "::1.2.3.4",
    "1:2:3:4:5:6:1.2.3.4",
    "1:2:3:4:5::1.2.3.4",
    "1:2:3:4:5:6::1.2.3.4",
    "1.2.3.4::",
    "::ffff:01.2.3.4",
    "::ffff:1.2.3",
    "12345::",
    "fe80::1%eth0",
    ":1::",
    "1:::2",
    "1::2::3",
    "a.org:443",
    "a/b",
    "http://a.org",
    "é.org",
    "any,!any",
    "a.org,!*.a.org,[2001:db8::2]",
];

/// A small deterministic generator (xorshift): the same strings on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Mutations of the edges: characters inserted, removed and replaced from the alphabet the
/// grammar cares about, and rules joined.
fn mutants() -> Vec<String> {
    const ALPHABET: &[char] = &[
        'a', 'O', 'f', 'F', 'z', '0', '9', '1', '2', '5', '-', '.', '*', '!', '[', ']', ':', ',',
        ' ', '\t', '_', 'é',
    ];
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let mut out = Vec::new();
    for _ in 0..4000 {
        let mut s: Vec<char> = EDGES[rng.next(EDGES.len())].chars().collect();
        for _ in 0..=rng.next(3) {
            let at = rng.next(s.len() + 1);
            let c = ALPHABET[rng.next(ALPHABET.len())];
            match rng.next(4) {
                0 => s.insert(at, c),
                1 if at < s.len() => {
                    s.remove(at);
                }
                2 if at < s.len() => s[at] = c,
                _ => s.extend(format!(",{}", EDGES[rng.next(EDGES.len())]).chars()),
            }
        }
        out.push(s.into_iter().collect());
    }
    out
}

/// Every candidate, as a string and (split at its commas) as an array, plus lengths at the
/// limits.
fn candidates() -> Vec<Value> {
    let mut out = Vec::new();
    let strings: Vec<String> = EDGES
        .iter()
        .map(|s| s.to_string())
        .chain(mutants())
        .collect();
    for s in &strings {
        out.push(json!(s));
        out.push(json!(s.split(',').collect::<Vec<_>>()));
    }
    let label = "a".repeat(63);
    let name = |chars: usize| {
        let mut n = std::iter::repeat_n(label.as_str(), 4)
            .collect::<Vec<_>>()
            .join(".");
        n.truncate(chars);
        n
    };
    for n in [252, 253, 254] {
        out.push(json!(name(n)));
        out.push(json!([name(n)]));
        out.push(json!(format!("*.{}", name(n - 2))));
        out.push(json!(format!("a.org,!{}", name(n - 1))));
        out.push(json!(format!("{} ", name(n - 1))));
    }
    for n in [255, 256, 257] {
        out.push(json!(vec!["a.org"; n]));
        out.push(json!(vec!["a.org"; n].join(",")));
        out.push(json!(vec!["a"; n].join(",")));
    }
    out.push(json!(format!("{},{}", name(253), name(253))));
    out.push(json!(format!("{},{},a", name(253), name(253))));
    out.push(json!([]));
    out.push(json!(["off", "off"]));
    out.push(json!([" off "]));
    out.push(json!(["!a.org", "!b.org"]));
    out.push(json!(["a.org", 1]));
    out.push(json!(42));
    out.push(json!(null));
    out
}

/// Validates `candidates` against the egress schema of the document and draws policies
/// from its patterns, in the schemathesis venv's Python.
const PY: &str = r#"
import json, sys
import jsonschema_rs
from hypothesis import HealthCheck, given, settings, strategies as st
doc = json.load(open(sys.argv[1]))
schema = doc["components"]["schemas"]["SetEgress"]["properties"]["egress"]
validator = jsonschema_rs.validator_for(schema)
cands = json.load(open(sys.argv[2]))
verdicts = [validator.is_valid(c) for c in cands]
drawn = []
def draw(strategy, n):
    @settings(max_examples=n, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(v):
        drawn.append(v)
    collect()
one = schema["oneOf"]
rules = one[2]["items"]["pattern"]
draw(st.from_regex(one[0]["pattern"], fullmatch=True), 400)
draw(st.lists(st.from_regex(rules, fullmatch=True), min_size=1, max_size=6), 200)
drawn = [v for v in drawn if validator.is_valid(v)]
json.dump({"verdicts": verdicts, "drawn": drawn}, sys.stdout)
"#;

#[test]
fn the_documented_policy_grammar_is_exactly_what_the_server_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv-st/bin/python");
    assert!(
        python.exists(),
        "the schemathesis venv is missing: .ci/run installs it (python3 -m venv .venv-st && .venv-st/bin/pip install schemathesis==4.32.5)"
    );
    let dir = tempfile::tempdir().unwrap();
    let cands = candidates();
    let file = dir.path().join("candidates.json");
    std::fs::write(&file, serde_json::to_vec(&cands).unwrap()).unwrap();
    let out = Command::new(&python)
        .args(["-c", PY])
        .arg(root.join("docs/openapi.json"))
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts = answer["verdicts"].as_array().unwrap();
    assert_eq!(verdicts.len(), cands.len());
    let parses = |v: &Value| serde_json::from_value::<EgressPolicy>(v.clone());
    let mut wrong = Vec::new();
    for (c, doc) in cands.iter().zip(verdicts) {
        let server = parses(c);
        if doc.as_bool() != Some(server.is_ok()) {
            wrong.push(format!("{c}: document {doc}, server {server:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} disagreements:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    // Both kinds were tried: the test would pass vacuously on all-valid or all-invalid.
    let valid = verdicts
        .iter()
        .filter(|v| v.as_bool() == Some(true))
        .count();
    assert!(
        valid > 500 && valid < cands.len() - 500,
        "{valid} of {}",
        cands.len()
    );
    let drawn = answer["drawn"].as_array().unwrap();
    assert!(drawn.len() > 300, "only {} drawn", drawn.len());
    for v in drawn {
        assert!(
            parses(v).is_ok(),
            "drawn from the document, refused: {v}: {:?}",
            parses(v)
        );
    }
}
