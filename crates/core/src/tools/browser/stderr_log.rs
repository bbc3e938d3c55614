//! Chromium's stderr, read on the host from the exec that started it: the one place the
//! DevTools endpoint is learnt from ("DevTools listening on ws://127.0.0.1:<port>/…", see
//! chromium.rs for why never from DevToolsActivePort), and a bounded tail of what Chromium
//! said, to explain a start that failed. The stream must be read all along, or Chromium
//! blocks on a full pipe; its end means Chromium exited.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::sandbox::{AttachedProcess, OutputChunk};

/// How much of Chromium's stderr is kept to explain a failed start.
const LOG_TAIL: usize = 4096;
/// Only the start of a line can hold the announcement; the rest of a long line is not kept.
const LINE_MAX: usize = 512;

/// What the stderr reader saw first.
#[derive(Clone)]
pub(super) enum Announced {
    Endpoint(u16, String),
    /// "Cannot start http server for devtools": something of the sandbox holds the port.
    PortTaken,
}

/// The reader of one Chromium's stderr.
pub(super) struct StderrWatch {
    /// None until the first announcement (or the port refusal) is seen.
    pub announced: watch::Receiver<Option<Announced>>,
    /// The last `LOG_TAIL` bytes of stdout and stderr, cut at a character boundary.
    pub log: Arc<Mutex<String>>,
    /// The reading task; `dead` is cancelled when it ends (Chromium exited).
    pub drain: JoinHandle<()>,
}

/// Reads `process`'s output until it ends, then cancels `dead`.
pub(super) fn watch(mut process: AttachedProcess, dead: CancellationToken) -> StderrWatch {
    let log = Arc::new(Mutex::new(String::new()));
    let (announce, announced) = watch::channel(None::<Announced>);
    let drain = {
        let log = log.clone();
        tokio::spawn(async move {
            let _on_end = dead.drop_guard();
            drop(process.stdin);
            let mut line: Vec<u8> = Vec::new();
            while let Some(chunk) = process.output.next().await {
                let bytes = match chunk {
                    Ok(OutputChunk::Stdout(b)) => b,
                    Ok(OutputChunk::Stderr(b)) => {
                        for &byte in b.iter() {
                            if byte == b'\n' {
                                if announce.borrow().is_none() {
                                    let text = String::from_utf8_lossy(&line);
                                    if let Some((port, path)) = parse_announcement(&text) {
                                        let _ =
                                            announce.send(Some(Announced::Endpoint(port, path)));
                                    } else if text.contains("Cannot start http server for devtools")
                                    {
                                        let _ = announce.send(Some(Announced::PortTaken));
                                    }
                                }
                                line.clear();
                            } else if line.len() < LINE_MAX {
                                line.push(byte);
                            }
                        }
                        b
                    }
                    Err(_) => break,
                };
                if let Ok(mut log) = log.lock() {
                    log.push_str(&String::from_utf8_lossy(&bytes));
                    if log.len() > LOG_TAIL {
                        let cut = log.len() - LOG_TAIL;
                        let cut = (cut..log.len())
                            .find(|i| log.is_char_boundary(*i))
                            .unwrap_or(log.len());
                        log.drain(..cut);
                    }
                }
            }
        })
    };
    StderrWatch {
        announced,
        log,
        drain,
    }
}

/// The last `lines` lines of the log, trimmed.
pub(super) fn tail(log: &Mutex<String>, lines: usize) -> String {
    let text = log.lock().map(|l| l.trim().to_string()).unwrap_or_default();
    let kept: Vec<&str> = text.lines().rev().take(lines).collect();
    kept.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Chromium's "DevTools listening on ws://127.0.0.1:<port>/devtools/browser/<id>" line.
/// Only a loopback address, a real port and an id of UUID characters are accepted.
pub(super) fn parse_announcement(line: &str) -> Option<(u16, String)> {
    let rest = line
        .trim()
        .strip_prefix("DevTools listening on ws://127.0.0.1:")?;
    let (port, path) = rest.split_once('/')?;
    let port: u16 = port.parse().ok()?;
    let id = path.strip_prefix("devtools/browser/")?;
    let id_ok =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    (port != 0 && id_ok).then(|| (port, format!("/{path}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcement_line() {
        assert_eq!(
            parse_announcement(
                "DevTools listening on ws://127.0.0.1:40123/devtools/browser/abc-def\r"
            ),
            Some((40123, "/devtools/browser/abc-def".to_string()))
        );
        for bad in [
            "",
            "DevTools listening on ws://10.0.0.1:40123/devtools/browser/abc",
            "DevTools listening on ws://127.0.0.1:0/devtools/browser/abc",
            "DevTools listening on ws://127.0.0.1:40123/devtools/page/abc",
            "DevTools listening on ws://127.0.0.1:40123/devtools/browser/a b",
            "DevTools listening on ws://127.0.0.1:40123/devtools/browser/",
        ] {
            assert_eq!(parse_announcement(bad), None, "{bad}");
        }
    }
}
