//! Downloads: they land in /workspace, where the model's other tools find them, and the
//! browser says so.
//!
//! Chromium told to save into a directory ("allow") overwrites a file of the same name, so a
//! page could replace any file of /workspace by suggesting its name. Instead it saves under
//! the download's GUID into a staging directory on the same file system
//! (`Browser.setDownloadBehavior` allowAndName, set on every connection), and a finished file
//! is moved to `/workspace/<suggested name>` by a hard link that never replaces anything
//! (`name (1).ext`, … when taken). The `Browser.downloadWillBegin` and `downloadProgress`
//! events are kept in a small book: a `go_to_url` that turns into a download waits (bounded)
//! for it to finish and names the file; downloads started by clicks are reported in the next
//! state.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chromiumoxide::Browser;
use chromiumoxide::cdp::browser_protocol::browser::{
    DownloadProgressState, EventDownloadProgress, EventDownloadWillBegin,
    SetDownloadBehaviorBehavior, SetDownloadBehaviorParams,
};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::chromium::BrowserError;
use crate::sandbox::{ExecRequest, Sandbox};

/// Where downloads land inside the sandbox.
pub const DOWNLOAD_DIR: &str = "/workspace";
/// Where Chromium writes them (by GUID) until they are complete: the same file system.
/// Chromium makes it for a download; the move removes it again once it is empty.
pub const STAGING_DIR: &str = "/workspace/.sandboxd-downloads";
/// Moves a finished download to a free name, never replacing a file: argv is the staged
/// file, the directory and the name.
const PLACE: &str = r#"
import os, sys
src, d, name = sys.argv[1:4]
stem, ext = os.path.splitext(name)
for i in range(1000):
    dest = os.path.join(d, name if i == 0 else "%s (%d)%s" % (stem, i, ext))
    try:
        os.link(src, dest)
    except FileExistsError:
        continue
    os.unlink(src)
    try:
        os.rmdir(os.path.dirname(src))  # only when empty: nothing left behind in /workspace
    except OSError:
        pass
    print(dest)
    sys.exit(0)
sys.exit(3)
"#;
/// How long a go_to_url that became a download waits for the file to be complete.
pub const DOWNLOAD_WAIT: Duration = Duration::from_secs(15);
/// Downloads remembered (the oldest are forgotten): the book is fed by the sandbox's pages.
const KEPT: usize = 32;

#[derive(Debug, Clone)]
struct Download {
    /// Its number among this browser's downloads (what `mark` counts).
    seq: u64,
    guid: String,
    name: String,
    state: DownloadProgressState,
    bytes: u64,
    /// Where it was placed, or why it could not be.
    placed: Option<Result<String, String>>,
    /// Already told to the model.
    reported: bool,
}

impl Download {
    fn describe(&self) -> String {
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let name = quote(&self.name.chars().take(120).collect::<String>());
        match (&self.state, &self.placed) {
            (DownloadProgressState::Completed, Some(Ok(path))) => {
                format!("downloaded {} ({} bytes)", quote(path), self.bytes)
            }
            (DownloadProgressState::Completed, Some(Err(why))) => format!(
                "the download of {name} finished but could not be moved into {DOWNLOAD_DIR}: {why}"
            ),
            (DownloadProgressState::Canceled, _) => {
                format!("the download of {name} was cancelled")
            }
            _ => format!("downloading {name} ({} bytes so far)", self.bytes),
        }
    }
}

#[derive(Default)]
struct Book {
    list: Vec<Download>,
    began: u64,
}

/// The downloads of one running Chromium.
pub struct Downloads {
    book: Arc<Mutex<Book>>,
    changed: watch::Receiver<u64>,
    _task: AbortOnDropHandle<()>,
}

impl Downloads {
    /// Lets Chromium download into the staging directory and starts following its download
    /// events, placing each finished file in /workspace.
    pub async fn watch(
        browser: &Browser,
        sandbox: Arc<dyn Sandbox>,
        dead: CancellationToken,
    ) -> Result<Self, BrowserError> {
        let mut began = browser.event_listener::<EventDownloadWillBegin>().await?;
        let mut progress = browser.event_listener::<EventDownloadProgress>().await?;
        let params = SetDownloadBehaviorParams::builder()
            .behavior(SetDownloadBehaviorBehavior::AllowAndName)
            .download_path(STAGING_DIR)
            .events_enabled(true)
            .build()
            .map_err(BrowserError::Cdp)?;
        browser.execute(params).await?;
        let book = Arc::new(Mutex::new(Book::default()));
        let (tx, changed) = watch::channel(0u64);
        let kept = book.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    ev = began.next() => {
                        let Some(ev) = ev else { break };
                        if let Ok(mut b) = kept.lock() {
                            b.began += 1;
                            let seq = b.began;
                            b.list.push(Download {
                                seq,
                                guid: ev.guid.chars().take(64).collect(),
                                name: ev.suggested_filename.chars().take(255).collect(),
                                state: DownloadProgressState::InProgress,
                                bytes: 0,
                                placed: None,
                                reported: false,
                            });
                            let excess = b.list.len().saturating_sub(KEPT);
                            b.list.drain(..excess);
                        }
                    }
                    ev = progress.next() => {
                        let Some(ev) = ev else { break };
                        let name = kept.lock().ok().and_then(|b| {
                            b.list.iter().find(|d| d.guid == ev.guid).map(|d| d.name.clone())
                        });
                        let Some(name) = name else { continue };
                        // Placed before it counts as finished: a waiter then names the file.
                        let placed = match ev.state {
                            DownloadProgressState::Completed => {
                                Some(place(&*sandbox, &ev.guid, &name).await)
                            }
                            _ => None,
                        };
                        if let Ok(mut b) = kept.lock()
                            && let Some(d) = b.list.iter_mut().find(|d| d.guid == ev.guid)
                        {
                            d.state = ev.state.clone();
                            d.bytes = ev.received_bytes.max(0.0) as u64;
                            d.placed = placed;
                        }
                    }
                    _ = dead.cancelled() => break,
                }
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        Ok(Self {
            book,
            changed,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// How many downloads began so far: later ones are "since" this mark.
    pub fn mark(&self) -> u64 {
        self.book.lock().map(|b| b.began).unwrap_or(0)
    }

    /// Resolves once a download began after `mark` (never, if none does).
    pub async fn began_after(&self, mark: u64) {
        let mut changed = self.changed.clone();
        loop {
            if self.mark() > mark {
                return;
            }
            if changed.changed().await.is_err() {
                // The follower ended (Chromium is gone): nothing will begin.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Waits (at most `limit`) for the downloads begun after `mark` to end, and describes
    /// them; they are not reported again in the state.
    pub async fn finished_after(&self, mark: u64, limit: Duration) -> Vec<String> {
        let mut changed = self.changed.clone();
        let all_done = |book: &Book| {
            book.list
                .iter()
                .filter(|d| d.seq > mark)
                .all(|d| d.state != DownloadProgressState::InProgress)
        };
        let wait = async {
            loop {
                if self.book.lock().map(|b| all_done(&b)).unwrap_or(true) {
                    return;
                }
                if changed.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(limit, wait).await;
        let Ok(mut book) = self.book.lock() else {
            return Vec::new();
        };
        book.list
            .iter_mut()
            .filter(|d| d.seq > mark)
            .map(|d| {
                d.reported = d.state != DownloadProgressState::InProgress;
                d.describe()
            })
            .collect()
    }

    /// The downloads the model has not been told about (for the state): finished ones once,
    /// running ones each time.
    pub fn unreported(&self) -> Vec<String> {
        let Ok(mut book) = self.book.lock() else {
            return Vec::new();
        };
        book.list
            .iter_mut()
            .filter(|d| !d.reported)
            .map(|d| {
                d.reported = d.state != DownloadProgressState::InProgress;
                d.describe()
            })
            .collect()
    }
}

/// Moves the staged file of download `guid` to a free name after `suggested` in /workspace.
async fn place(sandbox: &dyn Sandbox, guid: &str, suggested: &str) -> Result<String, String> {
    // Chromium's GUIDs are hex and dashes; anything else is not a file of ours.
    if guid.is_empty() || !guid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err("the browser named the download oddly".into());
    }
    let name = file_name(suggested);
    let mut req = ExecRequest::new([
        "python3".to_string(),
        "-c".into(),
        PLACE.into(),
        format!("{STAGING_DIR}/{guid}"),
        DOWNLOAD_DIR.into(),
        name,
    ]);
    req.timeout = Duration::from_secs(20);
    let out = sandbox.exec(req).await.map_err(|e| e.to_string())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.exit_code == Some(0) && path.starts_with(DOWNLOAD_DIR) {
        Ok(path.chars().take(300).collect())
    } else {
        Err(format!("the move ended with {:?}", out.exit_code))
    }
}

/// A plain file name from the page's suggestion: no directories, not hidden, bounded.
fn file_name(suggested: &str) -> String {
    let base = suggested.rsplit(['/', '\\']).next().unwrap_or_default();
    let clean: String = base
        .chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .trim()
        .trim_start_matches('.')
        .chars()
        .take(120)
        .collect();
    if clean.is_empty() {
        "download".into()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_quote_the_name_and_stay_bounded() {
        let mut d = Download {
            seq: 1,
            guid: "g".into(),
            name: "report \"x\".bin".into(),
            state: DownloadProgressState::Completed,
            bytes: 12,
            placed: Some(Ok("/workspace/report \"x\" (1).bin".into())),
            reported: false,
        };
        assert_eq!(
            d.describe(),
            "downloaded \"/workspace/report \\\"x\\\" (1).bin\" (12 bytes)"
        );
        d.placed = Some(Err("no room".into()));
        assert!(
            d.describe()
                .contains("could not be moved into /workspace: no room")
        );
        d.name = "n\n".repeat(500);
        d.state = DownloadProgressState::InProgress;
        assert!(d.describe().len() < 400);
        assert!(!d.describe().contains('\n'));
    }

    #[test]
    fn suggested_names_become_plain_file_names() {
        assert_eq!(file_name("report.pdf"), "report.pdf");
        assert_eq!(file_name("../../etc/passwd"), "passwd");
        assert_eq!(file_name("a\\b\\c.txt"), "c.txt");
        assert_eq!(file_name(".bashrc"), "bashrc");
        assert_eq!(file_name(".."), "download");
        assert_eq!(file_name("x\ny"), "xy");
        assert_eq!(file_name(""), "download");
        assert_eq!(file_name(&"é".repeat(500)).chars().count(), 120);
    }
}
