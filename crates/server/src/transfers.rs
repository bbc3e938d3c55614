//! Transfers (file and archive uploads and downloads, previews): how many may run at once,
//! per user and on the whole server, and where their bytes wait on the host.
//!
//! A transfer is what goes through a spool file: an upload not announced at 1 MiB or less, a
//! download of a file over 1 MiB, an archive either way; and a preview (up to 4 MiB in
//! memory). Small bodies and files stay in memory like any small request and claim nothing.
//! Each transfer holds one `TransferPermit` from before it reads a body until its response has
//! been streamed out; over a limit the answer is 429 at once, with Retry-After, so a client
//! retries instead of queueing connections. Together with `[server] upload_limit_mb` and the
//! sessions' `workspace_mb` this bounds what transfers cost the host: memory, a few buffers
//! each; temp disk, one spooled file each. Spooled files live in `<data_dir>/spool`, unlinked
//! from the start (nothing is left behind by a crash), and not in TMPDIR: /tmp is often a
//! tmpfs, which is memory again. The counts are this process's own: they bound this process's
//! memory and disk, which is what they are for, so several replicas each have their own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{ApiError, ErrorCode};

/// Seconds a client is told to wait before retrying a refused transfer.
const RETRY_AFTER_SECS: u64 = 2;

#[derive(Default)]
struct Counts {
    total: usize,
    per_user: HashMap<String, usize>,
}

/// The transfer limits of the server and the spool directory.
#[derive(Clone)]
pub struct Transfers {
    counts: Arc<Mutex<Counts>>,
    per_user: usize,
    total: usize,
    spool: PathBuf,
}

/// One transfer in progress; dropping it ends the transfer's claim.
pub struct TransferPermit {
    counts: Arc<Mutex<Counts>>,
    user: String,
}

impl Drop for TransferPermit {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.per_user.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_user.remove(&self.user);
            }
        }
    }
}

impl Transfers {
    /// Limits of `per_user` and `total` transfers at once (each at least 1), spooling into
    /// `spool` (created if missing).
    pub fn new(per_user: u32, total: u32, spool: PathBuf) -> std::io::Result<Transfers> {
        std::fs::create_dir_all(&spool)?;
        Ok(Transfers {
            counts: Arc::default(),
            per_user: per_user.max(1) as usize,
            total: total.max(1) as usize,
            spool,
        })
    }

    /// Claims a transfer for `user`, or says which limit is reached (429).
    pub fn start(&self, user: &str) -> Result<TransferPermit, ApiError> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let mine = c.per_user.get(user).copied().unwrap_or(0);
        if mine >= self.per_user {
            let mut e = ApiError::quota(
                "transfers_per_user",
                self.per_user,
                format!(
                    "you have {mine} transfers (uploads, downloads, archives, previews) in progress, the most one user may have ([server] transfers_per_user); retry when one has finished"
                ),
            );
            e.retry_after = Some(RETRY_AFTER_SECS);
            return Err(e);
        }
        if c.total >= self.total {
            let mut e = ApiError::new(
                ErrorCode::RateLimited,
                format!(
                    "the server has {} transfers in progress, its limit ([server] transfers); retry in a few seconds",
                    c.total
                ),
            );
            e.retry_after = Some(RETRY_AFTER_SECS);
            return Err(e);
        }
        c.total += 1;
        *c.per_user.entry(user.to_string()).or_insert(0) += 1;
        Ok(TransferPermit {
            counts: self.counts.clone(),
            user: user.to_string(),
        })
    }

    /// A new unlinked file in the spool directory.
    pub fn spool_file(&self) -> Result<std::fs::File, ApiError> {
        tempfile::tempfile_in(&self.spool).map_err(|e| {
            ApiError::internal(format!(
                "cannot create a temp file in {}: {e}; check that the data directory is writable and has room",
                self.spool.display()
            ))
        })
    }

    pub fn spool_dir(&self) -> &Path {
        &self.spool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_user_and_global_limits_hold_and_release() {
        let dir = tempfile::tempdir().unwrap();
        let t = Transfers::new(2, 3, dir.path().join("spool")).unwrap();
        let a1 = t.start("a").unwrap();
        let _a2 = t.start("a").unwrap();
        let e = t.start("a").err().unwrap();
        assert_eq!(e.code(), ErrorCode::QuotaExceeded);
        assert_eq!(e.detail.quota.as_deref(), Some("transfers_per_user"));
        assert_eq!(e.retry_after, Some(RETRY_AFTER_SECS));
        let _b1 = t.start("b").unwrap();
        let e = t.start("b").err().unwrap();
        assert_eq!(e.code(), ErrorCode::RateLimited, "the server-wide limit");
        drop(a1);
        let _b2 = t.start("b").expect("a finished transfer frees its place");
        assert!(t.counts.lock().unwrap().per_user.get("a") == Some(&1));
    }
}
