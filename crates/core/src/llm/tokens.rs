//! Token counts and context windows: what a request costs and how much the model can take.
//!
//! Counts use OpenAI's BPE encodings (tiktoken-rs, whose encoding files are compiled into
//! the binary: nothing is downloaded at run time). `o200k_base` for the models that use it
//! (gpt-4o, gpt-4.1, gpt-5, the o-series), `cl100k_base` for everything else: other
//! families (DeepSeek, Qwen, Llama) have their own vocabularies, and cl100k counts Chinese
//! at least as high as theirs, so a budget computed with it errs on the safe side. The old
//! estimate (bytes / 4) was off by a factor of two or more on Chinese text either way.
//!
//! The encodings load once per process on first use (a few tens of milliseconds) and are
//! shared by every thread without a lock (tiktoken-rs 0.5's own singletons sit behind a
//! mutex; its 0.5 line is used because newer ones change the workspace's regex features).

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

/// Tokens of a chat message's framing (role, separators), as OpenAI documents it.
pub const PER_MESSAGE: usize = 4;
/// What an image part is counted as (a detail "auto" image is 85..1105 tokens).
pub const PER_IMAGE: usize = 1000;
/// The window assumed for a model of no known family (local models, custom names): large
/// enough not to shrink `[agent] context_tokens`' default; a provider's context-length
/// error teaches the run a smaller one (react.rs).
pub const UNKNOWN_WINDOW: usize = 128_000;

/// The encoding a model's prompts are counted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    Cl100k,
    O200k,
}

impl Tokenizer {
    /// The encoding of `model` ("openai/gpt-4o" and "gpt-4o" alike).
    pub fn for_model(model: &str) -> Self {
        let bare = bare(model);
        let o200k = [
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "o1",
            "o3",
            "o4",
            "chatgpt-4o",
        ];
        if o200k.iter().any(|p| bare.starts_with(p)) {
            Tokenizer::O200k
        } else {
            Tokenizer::Cl100k
        }
    }

    /// The encoding, loaded on first use; `None` only if the embedded file failed to
    /// parse, which a test rules out (then counts fall back to an estimate).
    fn bpe(self) -> Option<&'static CoreBPE> {
        static CL100K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        static O200K: OnceLock<Option<CoreBPE>> = OnceLock::new();
        match self {
            Tokenizer::Cl100k => CL100K.get_or_init(|| tiktoken_rs::cl100k_base().ok()),
            Tokenizer::O200k => O200K.get_or_init(|| tiktoken_rs::o200k_base().ok()),
        }
        .as_ref()
    }

    /// Tokens of `text` as plain text (special-token spellings count as ordinary text,
    /// which is how the provider treats them inside a message).
    pub fn count(self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        let Some(bpe) = self.bpe() else {
            // Never below a Chinese character's cost (one token or more per character).
            return text.chars().count();
        };
        if !has_long_run(text) {
            return bpe.encode_ordinary(text).len();
        }
        // BPE is quadratic in the length of one word, and a sandbox can print a word of
        // 10,000 letters: such a text is counted in slices of `LONG_RUN` characters, which
        // costs a token or so more per slice (a merge across a cut is lost), never less.
        let mut total = 0;
        let mut start = 0;
        for (n, (at, _)) in text.char_indices().enumerate() {
            if n > 0 && n % LONG_RUN == 0 {
                total += bpe.encode_ordinary(&text[start..at]).len();
                start = at;
            }
        }
        total + bpe.encode_ordinary(&text[start..]).len()
    }
}

/// The longest run of letters and digits counted in one piece (see `Tokenizer::count`).
const LONG_RUN: usize = 400;

/// Whether `text` has a run of more than `LONG_RUN` letters or digits (one BPE word).
fn has_long_run(text: &str) -> bool {
    let mut run = 0;
    for c in text.chars() {
        if c.is_alphanumeric() {
            run += 1;
            if run > LONG_RUN {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// The context window of `model` in tokens: `configured` when it is set (not 0), else the
/// default of the model's family; `UNKNOWN_WINDOW` for a family sandboxd does not know.
pub fn context_window(model: &str, configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    let bare = bare(model);
    // Longest, most specific prefixes first: "gpt-4o" before "gpt-4".
    const FAMILIES: &[(&str, usize)] = &[
        ("gpt-4.1", 1_047_576),
        ("gpt-5", 400_000),
        ("gpt-4o", 128_000),
        ("chatgpt-4o", 128_000),
        ("gpt-4-turbo", 128_000),
        ("gpt-4.5", 128_000),
        ("gpt-4-32k", 32_768),
        ("gpt-4", 8_192),
        ("gpt-3.5", 16_385),
        ("o1-mini", 128_000),
        ("o1", 200_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("claude", 200_000),
        ("gemini", 1_048_576),
        ("deepseek", 65_536),
        ("qwen", 32_768),
        ("qwq", 32_768),
        ("llama-3.1", 131_072),
        ("llama3.1", 131_072),
        ("llama-3.2", 131_072),
        ("llama3.2", 131_072),
        ("llama-3.3", 131_072),
        ("llama3.3", 131_072),
        ("llama", 8_192),
        ("mistral-large", 131_072),
        ("mistral", 32_768),
        ("mixtral", 32_768),
        ("glm-4", 128_000),
        ("moonshot", 128_000),
        ("kimi", 128_000),
    ];
    FAMILIES
        .iter()
        .find(|(prefix, _)| bare.starts_with(prefix))
        .map_or(UNKNOWN_WINDOW, |(_, window)| *window)
}

/// "openai/GPT-4o" → "gpt-4o".
fn bare(model: &str) -> String {
    model
        .rsplit('/')
        .next()
        .unwrap_or(model)
        .trim()
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mixed Chinese/English text and its token counts. The expected numbers come from
    /// Python's tiktoken 0.14.0 (PyPI), run once with `scripts/tiktoken-counts.py`, which
    /// loads the same encoding files this crate embeds (tiktoken's own constructors and
    /// split patterns, the files read from disk instead of downloaded).
    const CASES: &[(&str, usize, usize)] = &[
        (
            "请用 pandas 读取 sales.xlsx，并计算每个月的 revenue 总和。Then plot it with seaborn.",
            26,
            23,
        ),
        (
            "上下文窗口是 16K tokens；the agent masks old tool outputs first, 然后再总结中间的历史。",
            34,
            27,
        ),
        ("Hello, world! 你好，世界！", 12, 9),
    ];

    #[test]
    fn counts_match_tiktoken_on_mixed_chinese_and_english() {
        for (text, cl100k, o200k) in CASES {
            assert_eq!(Tokenizer::Cl100k.count(text), *cl100k, "cl100k: {text}");
            assert_eq!(Tokenizer::O200k.count(text), *o200k, "o200k: {text}");
            // What the old bytes/4 estimate said, to keep its error on record: Chinese
            // characters are 3 bytes each, so it is far from either count.
            assert_ne!(text.len() / 4, *cl100k);
        }
        assert_eq!(Tokenizer::Cl100k.count(""), 0);
        assert!(Tokenizer::Cl100k.bpe().is_some() && Tokenizer::O200k.bpe().is_some());
    }

    /// A word of thousands of letters (a sandbox's output) is counted in slices: a little
    /// over the exact count, never under it. Ordinary text is counted exactly.
    #[test]
    fn a_giant_word_is_counted_in_slices_never_under() {
        for word in ["ab".repeat(3_000), "数据".repeat(1_500), "x7".repeat(2_000)] {
            let text = format!("start {word} end");
            let bpe = Tokenizer::Cl100k.bpe().unwrap();
            let exact = bpe.encode_ordinary(&text).len();
            let counted = Tokenizer::Cl100k.count(&text);
            let slices = text.chars().count().div_ceil(LONG_RUN);
            assert!(
                counted >= exact && counted <= exact + 2 * slices,
                "{counted} vs exact {exact}"
            );
        }
        let prose = "the quick brown fox jumps over the lazy dog. ".repeat(200);
        assert!(!has_long_run(&prose));
        let bpe = Tokenizer::O200k.bpe().unwrap();
        assert_eq!(
            Tokenizer::O200k.count(&prose),
            bpe.encode_ordinary(&prose).len()
        );
    }

    #[test]
    fn models_map_to_encodings_and_windows() {
        assert_eq!(Tokenizer::for_model("openai/gpt-4o-mini"), Tokenizer::O200k);
        assert_eq!(Tokenizer::for_model("o3-mini"), Tokenizer::O200k);
        assert_eq!(Tokenizer::for_model("gpt-4-turbo"), Tokenizer::Cl100k);
        assert_eq!(Tokenizer::for_model("deepseek-chat"), Tokenizer::Cl100k);
        assert_eq!(context_window("deepseek-chat", 0), 65_536);
        assert_eq!(context_window("gpt-4o", 0), 128_000);
        assert_eq!(context_window("gpt-4", 0), 8_192);
        assert_eq!(context_window("Qwen/Qwen2.5-7B-Instruct", 0), 32_768);
        assert_eq!(context_window("my-local-model", 0), UNKNOWN_WINDOW);
        assert_eq!(context_window("gpt-4o", 16_384), 16_384);
    }
}
