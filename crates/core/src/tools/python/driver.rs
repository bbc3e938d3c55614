//! The host side of the in-sandbox python driver (images/sandbox/helpers/sandboxd_py.py):
//! reaching it, running one cell under a deadline, interrupting it and killing it.
//!
//! The driver is a daemon of the container listening on a unix socket in a private directory,
//! so it outlives this process: a later `sandboxd run --session ID` reaches the same
//! interpreter and its variables. This process reaches it through one exec of
//! sandboxd_pyrelay.py, which finds the running driver or starts one, then copies frames
//! between its stdin/stdout and the socket. The relay's exit status says whose end it was
//! (the driver's, with its status and last words, or the relay's own).
//!
//! Everything the driver sends is hostile input: it runs the model's code in the same
//! process, so a cell can write anything to the protocol channel. Frames are bounded by
//! `FramedProcess`, and a reply is checked (part sizes add up) before it is used.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use super::live::{LiveOutput, Stream};
use crate::sandbox::framed::FramedProcess;
use crate::sandbox::{ExecRequest, Sandbox, SandboxError, SpawnRequest, WORKSPACE, helpers};

/// How long an interrupted cell gets to come back before the interpreter is killed.
pub(super) const GRACE: Duration = Duration::from_secs(2);
/// Interrupts are repeated at this pace during the grace period: a cell may swallow one.
const INTERRUPT_EVERY: Duration = Duration::from_millis(500);
const HELLO_TIMEOUT: Duration = Duration::from_secs(20);
/// The most bytes of figures one reply carries, all together (the driver checks too).
const IMAGE_LIMIT: usize = crate::tools::MAX_IMAGE_BYTES;
/// The most figures one reply shows (the driver's SHOWN_LIMIT); the rest are only saved.
pub(super) const SHOWN_LIMIT: usize = 8;

/// What one cell produced.
#[derive(Debug, Default)]
pub struct CellOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_cut: bool,
    pub stderr_cut: bool,
    /// The repr of the cell's final expression, when it had one that was not None.
    pub value: Option<String>,
    /// The traceback of an exception the cell raised (KeyboardInterrupt included).
    pub error: Option<String>,
    /// The PNGs of the figures shown, in order, and where every figure was saved.
    pub images: Vec<Vec<u8>>,
    pub figures: Vec<String>,
}

/// How a cell ended.
#[derive(Debug)]
pub(super) enum CellEnd {
    Done(CellOutput),
    /// The deadline passed: interrupted and back with the state kept (Some), or stuck (None)
    /// and to be killed by the caller.
    TimedOut(Option<CellOutput>),
    /// The caller cancelled; an interrupt was sent and the reply is left for `settle`.
    Cancelled,
    /// The interpreter is gone; says why.
    Died(String),
}

/// The relay's exit statuses (see sandboxd_pyrelay.py); any other status is the relay's own
/// death (it was killed), which leaves the interpreter running.
const RELAY_DRIVER_ALIVE: i64 = 75;
const RELAY_CANNOT_START: i64 = 76;
const RELAY_DRIVER_EXITED: i64 = 77;
/// The relay's last line when the driver exited.
const EXIT_MARKER: &str = "sandboxd_pyrelay: the interpreter exited with status ";
/// The relay's private directory (sandboxd_pyrelay.py's DIR).
const RELAY_DIR: &str = "/tmp/sandboxd-py";
/// Why a connection ended when a later sandboxd process took the interpreter over.
const REPLACED: &str =
    "another sandboxd process connected to this session's python interpreter and took it over";
/// Cell ids stay below this (they travel as JSON numbers).
const MAX_CELL_ID: u64 = 1 << 53;

/// One connection to the session's interpreter.
pub(super) struct Driver {
    framed: FramedProcess,
    pid: u32,
    next_id: u64,
    /// A cell whose reply was not read yet (its caller was cancelled or dropped, or an
    /// earlier process left it running).
    in_flight: Option<u64>,
    /// How many cells the interpreter had run when this connection opened (0: a fresh one).
    pub(super) cells_before: u64,
}

/// How a lost connection ended, as the relay's status tells it.
pub(super) enum Loss {
    /// The interpreter is gone (or was killed because its channel was corrupted): why, and
    /// its last words.
    Died(String, Option<String>),
    /// Only the connection is gone: the relay died; the interpreter and its variables may
    /// still be there for the next call.
    Connection(String),
}

impl Driver {
    /// Connects to the session's interpreter (starting one if none runs) and reads its hello.
    /// `context`: a code context's own interpreter (its id and working directory) rather
    /// than the session's.
    pub(super) async fn start(
        sandbox: &dyn Sandbox,
        max_body: usize,
        context: Option<(&str, &str)>,
    ) -> Result<Self, SandboxError> {
        // The relay passes its environment and /workspace on to a driver it starts.
        let args: Vec<&str> = match context {
            Some((id, cwd)) => vec!["--context", id, "--cwd", cwd],
            None => Vec::new(),
        };
        let mut req = SpawnRequest::new(helpers::argv("sandboxd_pyrelay.py", &args));
        for (k, v) in helpers::env() {
            req = req.env(k, v);
        }
        let req = req
            .cwd(WORKSPACE)
            .env("MPLBACKEND", "Agg")
            .env("MPLCONFIGDIR", "/tmp/matplotlib")
            .env("PYTHONUNBUFFERED", "1");
        let process = sandbox.spawn(req).await?;
        let mut framed = FramedProcess::new("sandboxd_py", process, max_body);
        let hello = match timeout(HELLO_TIMEOUT, framed.recv()).await {
            Ok(r) => r?.0,
            Err(_) => {
                return Err(SandboxError::Timeout {
                    what: "starting the python interpreter".into(),
                    after: HELLO_TIMEOUT,
                });
            }
        };
        let pid = hello["pid"]
            .as_u64()
            .filter(|p| *p > 1 && *p <= u32::MAX as u64);
        let id = |v: &Value| v.as_u64().filter(|n| *n < MAX_CELL_ID);
        let last_id = id(&hello["last_id"]);
        let running = match &hello["running"] {
            Value::Null => Some(None),
            v => id(v).filter(|n| *n > 0).map(Some),
        };
        match (hello["hello"].as_str(), pid, last_id, running) {
            (Some("sandboxd_py"), Some(pid), Some(last_id), Some(running)) => Ok(Self {
                framed,
                pid: pid as u32,
                next_id: last_id.max(running.unwrap_or(0)) + 1,
                in_flight: running,
                cells_before: hello["cells"].as_u64().unwrap_or(0),
            }),
            _ => Err(SandboxError::Protocol {
                helper: "sandboxd_py".into(),
                message: format!("unexpected hello {}", tail_chars(&hello.to_string(), 300)),
            }),
        }
    }

    pub(super) fn has_cell_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Runs one cell until it finishes, the deadline passes or `cancel` fires; with `live`,
    /// its output is sent there as it is printed.
    pub(super) async fn run(
        &mut self,
        code: &str,
        output_cap: usize,
        deadline: Duration,
        cancel: &CancellationToken,
        mut live: Option<LiveOutput>,
    ) -> CellEnd {
        let id = self.next_id;
        self.next_id = (self.next_id + 1).min(MAX_CELL_ID - 1);
        if let Some(live) = live.as_mut() {
            live.left = [output_cap, output_cap];
        }
        let header =
            json!({"op": "execute", "id": id, "output_cap": output_cap, "live": live.is_some()});
        let until = Instant::now() + deadline;
        // A driver (or whatever holds its socket) that does not read must not hold the call
        // past its deadline.
        match tokio::time::timeout_at(until, self.framed.send(&header, code.as_bytes())).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return CellEnd::Died(e.to_string()),
            Err(_) => return CellEnd::TimedOut(None),
        }
        self.in_flight = Some(id);
        tokio::select! {
            reply = self.reply(id, &mut live) => return reply.map_or_else(CellEnd::Died, CellEnd::Done),
            _ = sleep_until(until) => {}
            _ = cancel.cancelled() => {
                let _ = self.interrupt(id).await;
                return CellEnd::Cancelled;
            }
        }
        match self.interrupt_and_wait(id, &mut live).await {
            Ok(out) => CellEnd::TimedOut(out),
            Err(why) => CellEnd::Died(why),
        }
    }

    /// Brings back a cell left running by a cancelled call. Ok(false): it would not stop.
    pub(super) async fn settle(&mut self) -> Result<bool, String> {
        match self.in_flight {
            None => Ok(true),
            Some(id) => Ok(self.interrupt_and_wait(id, &mut None).await?.is_some()),
        }
    }

    async fn interrupt(&mut self, id: u64) -> Result<(), SandboxError> {
        let frame = json!({"op": "interrupt", "id": id});
        match timeout(INTERRUPT_EVERY, self.framed.send(&frame, &[])).await {
            Ok(sent) => sent,
            Err(_) => Err(SandboxError::Protocol {
                helper: "sandboxd_py".into(),
                message: "the interpreter does not read what sandboxd sends".into(),
            }),
        }
    }

    /// Interrupts cell `id` (repeatedly) and waits up to GRACE for its reply.
    async fn interrupt_and_wait(
        &mut self,
        id: u64,
        live: &mut Option<LiveOutput>,
    ) -> Result<Option<CellOutput>, String> {
        let until = Instant::now() + GRACE;
        while Instant::now() < until {
            self.interrupt(id).await.map_err(|e| e.to_string())?;
            let slice = INTERRUPT_EVERY.min(until.saturating_duration_since(Instant::now()));
            if let Ok(reply) = timeout(slice, self.reply(id, live)).await {
                return reply.map(Some);
            }
        }
        Ok(None)
    }

    /// Reads frames until the reply of cell `id` (stale replies of older cells are skipped);
    /// its live chunks go to `live` (dropped without one).
    async fn reply(
        &mut self,
        id: u64,
        live: &mut Option<LiveOutput>,
    ) -> Result<CellOutput, String> {
        loop {
            let (header, body) = self.framed.recv().await.map_err(|e| match e {
                SandboxError::Protocol { message, .. } => message,
                other => other.to_string(),
            })?;
            if header["replaced"] == true {
                return Err(REPLACED.into());
            }
            if header["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(chunk) = header.get("chunk") {
                let stream = match chunk.as_str() {
                    Some("stdout") => Stream::Stdout,
                    Some("stderr") => Stream::Stderr,
                    _ => continue,
                };
                if let Some(live) = live.as_mut() {
                    live.push(stream, body);
                }
                continue;
            }
            self.in_flight = None;
            return parse_reply(&header, body);
        }
    }

    /// Says how the connection was lost, from the relay's exit status: the interpreter
    /// died (its status and last words), or only the relay did. Consumes the driver.
    pub(super) async fn obituary(self, sandbox: &dyn Sandbox, what_happened: String) -> Loss {
        if what_happened == REPLACED {
            // The interpreter is fine and in use by that process: leave it alone.
            return Loss::Connection(REPLACED.into());
        }
        let pid = self.pid;
        let code = timeout(Duration::from_secs(3), self.framed.exit_code())
            .await
            .ok()
            .flatten();
        let words = what_happened
            .split_once("its last words: ")
            .map(|(_, w)| w.to_string())
            .unwrap_or_default();
        match code {
            Some(RELAY_DRIVER_EXITED) => {
                let (status, words) = exit_marker(&words);
                let cause = match status {
                    Some(status) => describe_exit(status),
                    None => "it exited".into(),
                };
                let words = Some(last_words(&words)).filter(|w| !w.is_empty());
                Loss::Died(cause, words)
            }
            Some(RELAY_DRIVER_ALIVE) | Some(RELAY_CANNOT_START) | None => {
                // Its channel was corrupted (a cell wrote on it or closed it) while it still
                // runs: make sure it is gone, so the next call starts clean.
                let _ = kill_tree(sandbox, pid).await;
                Loss::Died(
                    format!(
                        "its channel to sandboxd was corrupted ({}), so it was killed",
                        tail_chars(&what_happened, 200)
                    ),
                    None,
                )
            }
            Some(code) => Loss::Connection(format!(
                "the relay process that connects sandboxd to it inside the sandbox {}",
                match code {
                    c if c > 128 && c < 160 => format!("was killed by signal {}", c - 128),
                    c => format!("exited with code {c}"),
                }
            )),
        }
    }

    /// Kills the interpreter and every process it started; `Err` when that is not confirmed.
    pub(super) async fn kill(self, sandbox: &dyn Sandbox) -> Result<(), String> {
        kill_tree(sandbox, self.pid).await
    }

    /// Asks an idle interpreter to leave (processes it started keep running), and waits
    /// until it has (its relay ends then), so the next connection finds a fresh one.
    pub(super) async fn exit(mut self) {
        if self.framed.send(&json!({"op": "exit"}), &[]).await.is_ok() {
            let _ = timeout(Duration::from_secs(2), self.framed.exit_code()).await;
        }
    }
}

/// Kills the interpreter's tree; `Err` (with killtree's words) when it could not confirm
/// that nothing of the tree is left.
async fn kill_tree(sandbox: &dyn Sandbox, pid: u32) -> Result<(), String> {
    let mut req = ExecRequest::new(helpers::argv("killtree.py", &["--tree", &pid.to_string()]))
        .timeout(Duration::from_secs(10))
        .output_cap(4096);
    req.env = helpers::env();
    let outcome = match sandbox.exec(req).await {
        Ok(out) if helpers::kill_confirmed(out.exit_code) => Ok(()),
        Ok(out) => Err(out.stderr_lossy().trim().to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = &outcome {
        tracing::warn!(session = sandbox.session_id(), pid, error = %e, "could not kill the python interpreter");
    }
    outcome
}

/// Removes the files of code context `id` in the relay's directory (its socket, status,
/// last words and lock; see sandboxd_pyrelay.py), once its interpreter is gone. `id` is
/// checked as the relay checks it, so nothing else can be named.
pub(super) async fn remove_context_files(sandbox: &dyn Sandbox, id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 32
        || !id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!("{id:?} is not a code context id"));
    }
    let mut argv = vec!["rm".to_string(), "-f".to_string(), "--".to_string()];
    argv.extend(["sock", "status", "err", "lock"].map(|f| format!("{RELAY_DIR}/{f}-{id}")));
    let mut req = ExecRequest::new(argv)
        .timeout(Duration::from_secs(10))
        .output_cap(4096);
    req.env = helpers::env();
    match sandbox.exec(req).await {
        Ok(out) if out.exit_code == Some(0) => Ok(()),
        Ok(out) => Err(format!(
            "could not remove the code context's files: {}",
            out.stderr_lossy().trim()
        )),
        Err(e) => Err(format!("could not remove the code context's files: {e}")),
    }
}

fn describe_exit(code: i64) -> String {
    match code {
        137 => {
            "it was killed with SIGKILL, most likely for using more memory than the sandbox allows"
                .into()
        }
        139 => "it crashed with a segmentation fault (SIGSEGV)".into(),
        134 => "it aborted (SIGABRT)".into(),
        c if c > 128 && c < 160 => format!("it was killed by signal {}", c - 128),
        c => format!("it exited with code {c}"),
    }
}

/// The useful part of what a dying interpreter wrote on its own stderr: faulthandler's
/// "Fatal Python error" and the cell lines it was in, else the end of the text.
fn last_words(text: &str) -> String {
    let text = text.trim();
    let picked: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("Fatal Python error") || l.contains("File \"<cell-"))
        .take(20)
        .collect();
    if picked.is_empty() {
        tail_chars(text, 1000).to_string()
    } else {
        picked.join("\n")
    }
}

fn tail_chars(s: &str, n: usize) -> &str {
    match s.char_indices().rev().nth(n) {
        Some((i, _)) => &s[i..],
        None => s,
    }
}

/// The driver's exit status from the relay's last line, and the words before it.
fn exit_marker(words: &str) -> (Option<i64>, String) {
    let words = words.trim_end();
    let (before, last) = words.rsplit_once('\n').unwrap_or(("", words));
    match last
        .strip_prefix(EXIT_MARKER)
        .map(|n| n.trim().parse::<i64>())
    {
        Some(Ok(status)) if (0..=255).contains(&status) => (Some(status), before.to_string()),
        _ => (None, words.to_string()),
    }
}

/// Splits a reply body into its parts, checking the sizes the (hostile) header claims.
fn parse_reply(header: &Value, body: Bytes) -> Result<CellOutput, String> {
    let bad = |why: &str| format!("the interpreter sent a malformed reply ({why})");
    let sizes: Vec<usize> = header["sizes"]
        .as_array()
        .ok_or_else(|| bad("no sizes"))?
        .iter()
        .map(|v| v.as_u64().map(|n| n as usize))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("sizes are not numbers"))?;
    if sizes.len() != 5
        || sizes.iter().try_fold(0usize, |a, n| a.checked_add(*n)) != Some(body.len())
    {
        return Err(bad("the part sizes do not add up to the body"));
    }
    let mut parts = Vec::with_capacity(5);
    let mut at = 0;
    for n in sizes {
        parts.push(body.slice(at..at + n));
        at += n;
    }
    let text = |b: &Bytes| (!b.is_empty()).then(|| String::from_utf8_lossy(b).into_owned());
    let images = split_images(header, &parts[4]);
    let figures = header["figures"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .take(100)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(CellOutput {
        stdout: parts[0].to_vec(),
        stderr: parts[1].to_vec(),
        stdout_cut: header["stdout_cut"] == true,
        stderr_cut: header["stderr_cut"] == true,
        value: text(&parts[2]),
        error: text(&parts[3]),
        images,
        figures,
    })
}

/// The figures' PNGs from the images part, by the sizes the header lists ("images"); a driver
/// from before that key sends one figure. Sizes that do not add up drop them all, and a part
/// that is not a PNG is dropped: the bytes come from the model's own process.
fn split_images(header: &Value, part: &Bytes) -> Vec<Vec<u8>> {
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    if part.is_empty() || part.len() > IMAGE_LIMIT {
        return Vec::new();
    }
    let sizes: Vec<usize> = match header.get("images").and_then(Value::as_array) {
        None => vec![part.len()],
        Some(list) => {
            let sizes: Option<Vec<usize>> = list
                .iter()
                .map(|v| v.as_u64().map(|n| n as usize))
                .collect();
            match sizes {
                Some(s) if s.len() <= SHOWN_LIMIT && s.iter().sum::<usize>() == part.len() => s,
                _ => return Vec::new(),
            }
        }
    };
    let mut at = 0;
    let mut images = Vec::with_capacity(sizes.len());
    for n in sizes {
        let png = part.slice(at..at + n);
        at += n;
        if png.starts_with(PNG) {
            images.push(png.to_vec());
        }
    }
    images
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_split_by_their_sizes() {
        let h = json!({"id": 1, "sizes": [2, 1, 1, 0, 0], "figures": ["/workspace/figures/figure-1.png"]});
        let out = parse_reply(&h, Bytes::from_static(b"hie2")).unwrap();
        assert_eq!(out.stdout, b"hi");
        assert_eq!(out.stderr, b"e");
        assert_eq!(out.value.as_deref(), Some("2"));
        assert_eq!(out.error, None);
        assert_eq!(out.figures.len(), 1);
    }

    #[test]
    fn lying_sizes_are_refused() {
        for sizes in [
            json!([1, 1, 1, 1, 1]),
            json!([usize::MAX, 2, 0, 0, 0]),
            json!([1]),
            json!("x"),
        ] {
            let h = json!({"id": 1, "sizes": sizes});
            assert!(
                parse_reply(&h, Bytes::from_static(b"abc")).is_err(),
                "{sizes}"
            );
        }
    }

    #[test]
    fn an_image_that_is_not_a_png_is_dropped() {
        let h = json!({"id": 1, "sizes": [0, 0, 0, 0, 3]});
        assert!(
            parse_reply(&h, Bytes::from_static(b"GIF"))
                .unwrap()
                .images
                .is_empty()
        );
    }

    #[test]
    fn figures_are_split_in_order_and_lying_sizes_drop_them() {
        let (a, b) = (
            b"\x89PNG\r\n\x1a\nA".as_slice(),
            b"\x89PNG\r\n\x1a\nBB".as_slice(),
        );
        let body = Bytes::from([a, b"GIF89", b].concat());
        let h =
            json!({"id": 1, "sizes": [0, 0, 0, 0, body.len()], "images": [a.len(), 5, b.len()]});
        let out = parse_reply(&h, body.clone()).unwrap();
        assert_eq!(
            out.images,
            vec![a.to_vec(), b.to_vec()],
            "the GIF is dropped"
        );
        let h = json!({"id": 1, "sizes": [0, 0, 0, 0, body.len()], "images": [1, 2]});
        assert!(parse_reply(&h, body.clone()).unwrap().images.is_empty());
        let many = vec![1; SHOWN_LIMIT + 1];
        let h = json!({"id": 1, "sizes": [0, 0, 0, 0, SHOWN_LIMIT + 1], "images": many});
        let body = Bytes::from(vec![0u8; SHOWN_LIMIT + 1]);
        assert!(parse_reply(&h, body).unwrap().images.is_empty());
    }

    #[test]
    fn last_words_keep_the_fatal_error_and_the_cell_lines() {
        let dump = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n  \
                    File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n  File \"<cell-3>\", line 2 in <module>\n  \
                    File \"/usr/local/lib/sandboxd/sandboxd_py.py\", line 344 in main\n\nExtension modules: numpy (total: 1)";
        assert_eq!(
            last_words(dump),
            "Fatal Python error: Segmentation fault\n  File \"<cell-3>\", line 2 in <module>"
        );
        assert_eq!(last_words("  plain words \n"), "plain words");
    }

    #[test]
    fn the_relay_names_the_drivers_status() {
        let (s, w) = exit_marker(
            "Fatal Python error: x\nsandboxd_pyrelay: the interpreter exited with status 139\n",
        );
        assert_eq!((s, w.as_str()), (Some(139), "Fatal Python error: x"));
        assert_eq!(
            exit_marker("sandboxd_pyrelay: the interpreter exited with status 137").0,
            Some(137)
        );
        for bad in [
            "",
            "words",
            "sandboxd_pyrelay: the interpreter exited with status 9999",
            "sandboxd_pyrelay: the interpreter exited with status x",
        ] {
            assert_eq!(exit_marker(bad).0, None, "{bad}");
        }
    }

    #[test]
    fn exit_codes_are_explained() {
        assert!(describe_exit(137).contains("memory"));
        assert!(describe_exit(139).contains("segmentation"));
        assert_eq!(describe_exit(1), "it exited with code 1");
    }
}
