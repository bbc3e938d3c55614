//! Placeholder until the tar branch lands (replaced by the real module on merge).
#[derive(Debug, thiserror::Error)]
pub enum TarError {
    #[error("placeholder")]
    Placeholder,
}
pub struct TarLimits {
    pub max_total_bytes: u64,
    pub max_entries: usize,
}
impl Default for TarLimits {
    fn default() -> Self {
        Self { max_total_bytes: 1 << 30, max_entries: 100_000 }
    }
}
pub struct ArchiveSummary {
    pub entries: usize,
    pub total_bytes: u64,
}
pub fn validate_archive(_bytes: &[u8], _limits: &TarLimits) -> Result<ArchiveSummary, TarError> {
    Ok(ArchiveSummary { entries: 0, total_bytes: 0 })
}
