//! Placeholder until the image branch lands (replaced by the real module on merge).
use bollard::Docker;

pub const IMAGE_REPO: &str = "sandboxd/sandbox";

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image support is not merged yet")]
    NotMerged,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildProgress {
    Step(String),
    Log(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum BuildOutcome {
    UpToDate { tag: String },
    Built { tag: String, size_bytes: u64, seconds: f64 },
}

pub fn image_tag() -> String {
    format!("{IMAGE_REPO}:latest")
}

pub async fn image_present(_docker: &Docker) -> Result<bool, ImageError> {
    Ok(true)
}

pub async fn ensure_image(_docker: &Docker, _progress: &(dyn Fn(BuildProgress) + Send + Sync)) -> Result<String, ImageError> {
    Ok(image_tag())
}

pub async fn build_image(_docker: &Docker, _force: bool, _progress: &(dyn Fn(BuildProgress) + Send + Sync)) -> Result<BuildOutcome, ImageError> {
    Err(ImageError::NotMerged)
}
