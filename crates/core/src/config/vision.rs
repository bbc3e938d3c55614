//! Whether the model sees images when `[llm] multimodal` is not set: on for the model
//! families known to take image input, off for the rest (a text-only model sent an image
//! answers 400, so guessing "on" would end runs). Always overridable with `multimodal`.

use super::LlmConfig;

/// Substrings of model names (lower-cased, provider prefix dropped) of vision models. Each
/// is narrow enough not to catch a text-only sibling ("gpt-4o" but not "gpt-4", "-vl" but
/// not "qwen-max").
const VISION_MARKERS: &[&str] = &[
    "gpt-4o",
    "gpt-4.1",
    "gpt-4-turbo",
    "gpt-4-vision",
    "gpt-5",
    "chatgpt-4o",
    "o3",
    "o4-mini",
    "claude-3",
    "claude-sonnet-4",
    "claude-opus-4",
    "claude-haiku-4",
    "gemini",
    "-vl",
    "vision",
    "llava",
    "pixtral",
    "glm-4v",
    "glm-4.5v",
    "qvq",
    "minicpm-v",
    "internvl",
];

/// Names that contain a marker but are text-only.
const TEXT_ONLY: &[&str] = &[
    "o3-mini",
    "gpt-4o-mini-tts",
    "gpt-4o-audio",
    "gpt-4o-transcribe",
];

/// Whether `model` is of a family known to take images.
pub fn known_vision_model(model: &str) -> bool {
    let lower = model.trim().to_ascii_lowercase();
    let bare = lower.rsplit('/').next().unwrap_or(&lower);
    if TEXT_ONLY.iter().any(|t| bare.starts_with(t)) {
        return false;
    }
    VISION_MARKERS.iter().any(|m| bare.contains(m))
}

impl LlmConfig {
    /// `multimodal` when set, else by the model's family.
    pub fn sees_images(&self) -> bool {
        self.multimodal
            .unwrap_or_else(|| known_vision_model(&self.model))
    }

    /// Whether images may go into the conversation at all: the model sees them, or a
    /// separate `[llm.vision]` model is configured (as `LlmClient::takes_images`).
    pub fn takes_images(&self) -> bool {
        self.sees_images() || self.vision.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::known_vision_model;

    #[test]
    fn families() {
        for m in [
            "gpt-4o",
            "openai/gpt-4o-mini",
            "gpt-4.1",
            "claude-3-5-sonnet-20241022",
            "claude-sonnet-4-20250514",
            "gemini-2.0-flash",
            "qwen2.5-vl-72b-instruct",
            "Qwen/Qwen2-VL-7B-Instruct",
            "o3",
        ] {
            assert!(known_vision_model(m), "{m}");
        }
        for m in [
            "deepseek-chat",
            "deepseek-reasoner",
            "gpt-3.5-turbo",
            "gpt-4",
            "qwen-max",
            "o3-mini",
            "llama-3.1-70b",
            "",
        ] {
            assert!(!known_vision_model(m), "{m}");
        }
    }
}
