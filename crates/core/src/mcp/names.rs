//! Tool names of remote MCP servers, made safe for the model: `mcp_{server}_{tool}` with
//! every character outside `[a-zA-Z0-9_-]` turned into `_`, runs of `_` collapsed, `_`
//! trimmed from both ends and the result cut to 64 characters (OpenAI's limit), as
//! OpenManus does. A server may keep the original names (`keep_names`), sanitized the same way.

/// The longest function name OpenAI accepts.
pub const MAX_NAME: usize = 64;

/// Sanitizes any string into a valid tool name; None when nothing usable is left.
pub fn sanitize(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    // Everything kept is ASCII, so byte indices are character indices.
    let trimmed = out.trim_matches('_');
    let cut = &trimmed[..trimmed.len().min(MAX_NAME)];
    let cut = cut.trim_end_matches('_');
    (!cut.is_empty()).then(|| cut.to_string())
}

/// The name a remote tool gets in the agent's registry.
pub fn tool_name(server: &str, tool: &str, keep_names: bool) -> Option<String> {
    if keep_names {
        sanitize(tool)
    } else {
        sanitize(&format!("mcp_{server}_{tool}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let long = "x".repeat(100);
        let cases: &[(&str, &str, bool, Option<&str>)] = &[
            ("fs", "read_file", false, Some("mcp_fs_read_file")),
            ("git.hub", "repo.list", false, Some("mcp_git_hub_repo_list")),
            ("my server", "do  it", false, Some("mcp_my_server_do_it")),
            ("srv", "天气", false, Some("mcp_srv")),
            ("srv", "café-au_lait", false, Some("mcp_srv_caf_-au_lait")),
            ("srv", "__a__b__", false, Some("mcp_srv_a_b")),
            ("srv", "a-b", true, Some("a-b")),
            ("srv", "天气", true, None),
            ("srv", "tool.v2", true, Some("tool_v2")),
        ];
        for (server, tool, keep, want) in cases {
            assert_eq!(
                tool_name(server, tool, *keep).as_deref(),
                *want,
                "{server}/{tool}"
            );
        }
        let n = tool_name("srv", &long, false).unwrap();
        assert_eq!(n.len(), MAX_NAME);
        assert!(n.starts_with("mcp_srv_xxx"));
        // A cut that lands after an underscore does not leave it dangling.
        let n = tool_name(
            "s",
            &format!("{}_{}", "a".repeat(57), "b".repeat(10)),
            false,
        )
        .unwrap();
        assert_eq!(n, format!("mcp_s_{}", "a".repeat(57)));
    }
}
