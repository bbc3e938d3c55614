//! The prompts, kept as Markdown files beside this module so they can be read and edited
//! as text; `{placeholders}` are filled in here.

const SYSTEM: &str = include_str!("prompts/system.md");
const NUDGE: &str = include_str!("prompts/nudge.md");
const TRIMMED: &str = include_str!("prompts/trimmed.md");
const EMPTY_REPLY: &str = include_str!("prompts/empty_reply.md");
const NO_IMAGES: &str = include_str!("prompts/no_images.md");
const RESEARCH: &str = include_str!("prompts/research.md");

pub fn system(tool_names: &[String], max_steps: usize) -> String {
    // The research paragraph only when the research tools are there to back it.
    let research = if tool_names.iter().any(|t| t == "web_fetch") {
        format!("\n{}\n", RESEARCH.trim_end())
    } else {
        String::new()
    };
    SYSTEM
        .replace("{research}", &research)
        .replace("{tools}", &tool_names.join(", "))
        .replace("{max_steps}", &max_steps.to_string())
        .trim_end()
        .to_string()
}

pub fn nudge() -> String {
    NUDGE.trim_end().to_string()
}

pub fn trimmed(count: usize) -> String {
    TRIMMED
        .replace("{count}", &count.to_string())
        .trim_end()
        .to_string()
}

pub fn empty_reply() -> String {
    EMPTY_REPLY.trim_end().to_string()
}

pub fn no_images() -> String {
    NO_IMAGES.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn placeholders_are_filled() {
        let s = super::system(&["bash".into(), "terminate".into()], 7);
        assert!(
            s.contains("bash, terminate")
                && s.contains("at most 7 steps")
                && s.contains("NO network")
        );
        assert!(!s.contains('{'));
        assert!(super::trimmed(3).contains("3 earlier messages"));
        assert!(
            !s.contains("web_fetch"),
            "no research text without the tools"
        );
        let r = super::system(&["web_fetch".into()], 7);
        assert!(r.contains("/workspace/report/index.html") && r.contains("no network"));
        assert!(!r.contains('{'));
    }
}
