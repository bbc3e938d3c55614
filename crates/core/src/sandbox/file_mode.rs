//! A file's permission bits as a client gives them (an upload's `mode`), and setting them in
//! the sandbox.
//!
//! Only the nine permission bits (0o777) are accepted: setuid, setgid and sticky are refused
//! with a clear error rather than dropped, so a client never believes it set what it did
//! not. (The sandbox runs with no-new-privileges, so a setuid bit would do nothing anyway.)

use std::fmt;
use std::time::Duration;

use serde::Deserialize;

use super::{ExecRequest, Sandbox, SandboxError};

/// Permission bits, 0 to 0o777.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode(u32);

impl FileMode {
    /// The bits, checked: at most 0o777.
    pub fn new(bits: u64) -> Result<FileMode, String> {
        if bits > 0o7777 {
            return Err(format!(
                "{bits:#o} is not a file mode; give permission bits such as \"0755\""
            ));
        }
        if bits & 0o7000 != 0 {
            return Err(format!(
                "{bits:#o} sets setuid, setgid or sticky bits, which sandboxd does not set; \
                 give only permission bits (0 to 0777)"
            ));
        }
        Ok(FileMode(bits as u32))
    }

    /// Octal digits, optionally after `0o` (`"755"`, `"0755"`, `"0o755"`).
    pub fn parse(text: &str) -> Result<FileMode, String> {
        let digits = text.strip_prefix("0o").unwrap_or(text);
        if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "{text:?} is not an octal file mode; give permission bits such as \"0755\""
            ));
        }
        let bits = u64::from_str_radix(digits, 8)
            .map_err(|_| format!("{text:?} is not octal (digits 0 to 7 only), e.g. \"0755\""))?;
        FileMode::new(bits)
    }

    pub fn bits(self) -> u32 {
        self.0
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

/// From JSON: an octal string (`"0755"`) or an integer taken as the bits' value (`493`).
impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Bits(u64),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => FileMode::parse(&t),
            Raw::Bits(b) => FileMode::new(b),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// Sets the mode of the file `path` in the sandbox (one process, ~70 ms), as the sandbox user.
pub async fn set_mode(
    sandbox: &dyn Sandbox,
    path: &str,
    mode: FileMode,
    timeout: Duration,
) -> Result<(), SandboxError> {
    let path = super::resolve_path(path)?;
    let bits = mode.to_string();
    let argv = ["chmod", bits.as_str(), "--", path.as_str()];
    let out = sandbox
        .exec(ExecRequest::new(argv).timeout(timeout))
        .await?;
    if out.success() {
        return Ok(());
    }
    Err(SandboxError::FileOp {
        operation: "chmod",
        path,
        message: out.stderr_lossy().trim().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_bits_are_accepted_in_every_spelling() {
        for (text, bits) in [("0755", 0o755), ("755", 0o755), ("0o644", 0o644), ("0", 0)] {
            assert_eq!(FileMode::parse(text).unwrap().bits(), bits, "{text}");
        }
        let json: FileMode = serde_json::from_str("493").unwrap();
        assert_eq!(json.bits(), 0o755);
        let json: FileMode = serde_json::from_str("\"0700\"").unwrap();
        assert_eq!(json.to_string(), "0700");
    }

    #[test]
    fn special_bits_and_junk_are_refused_with_the_reason() {
        for (text, says) in [
            ("4755", "setuid"),
            ("1777", "sticky"),
            ("0o2755", "setgid"),
            ("0789", "octal"),
            ("rwx", "not an octal"),
            ("", "not an octal"),
            ("-1", "not an octal"),
            ("77777", "not a file mode"),
        ] {
            let err = FileMode::parse(text).expect_err(text);
            assert!(err.contains(says), "{text}: {err}");
        }
        assert!(serde_json::from_str::<FileMode>("2048").is_err());
        assert!(serde_json::from_str::<FileMode>("-5").is_err());
    }
}
