//! The fake's exec subresource: the WebSocket upgrade with the channel subprotocol the
//! client offers and the fake allows (v5, or v4 only), then `docker exec` of the command in
//! the pod's container, its stdout and stderr as channel 1 and 2 frames, stdin from channel
//! 0 frames, `[255, 0]` closing stdin (v5), and the exit `Status` on channel 3 last.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::{Fake, status};

const V5: &str = "v5.channel.k8s.io";
const V4: &str = "v4.channel.k8s.io";

pub(crate) async fn exec(
    State(fake): State<Arc<Fake>>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    mut req: Request,
) -> Response {
    let Some(container) = fake.container(&ns, &name) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("pods \"{name}\" not found"),
        );
    };
    let query = query.unwrap_or_default();
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let command: Vec<String> = params
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    let stdin = params.iter().any(|(k, v)| k == "stdin" && v == "true");
    let offered = req
        .headers()
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let offers = |p: &str| offered.split(',').any(|o| o.trim() == p);
    let protocol = if offers(V5) && !fake.v4_only {
        V5
    } else if offers(V4) {
        V4
    } else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "no channel subprotocol",
        );
    };
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "not a WebSocket upgrade",
        );
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        let pod = (fake, ns, name);
        run(ws, container, command, stdin, protocol == V5, pod).await;
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::UPGRADE, "websocket".to_string()),
            (header::CONNECTION, "Upgrade".to_string()),
            (header::SEC_WEBSOCKET_ACCEPT, accept),
            (header::SEC_WEBSOCKET_PROTOCOL, protocol.to_string()),
        ],
    )
        .into_response()
}

async fn run(
    ws: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    container: String,
    command: Vec<String>,
    with_stdin: bool,
    v5: bool,
    (fake, ns, name): (Arc<Fake>, String, String),
) {
    let (mut sink, mut stream) = ws.split();
    let mut cmd = tokio::process::Command::new("docker");
    cmd.arg("exec");
    if with_stdin {
        cmd.arg("-i");
    }
    cmd.arg(&container).args(&command);
    cmd.stdin(if with_stdin {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    let Ok(mut child) = cmd.spawn() else {
        let _ = sink.close().await;
        return;
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(8);
    let readers = [
        (
            1u8,
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            2u8,
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ];
    let mut pumps = Vec::new();
    for (channel, reader) in readers {
        let Some(mut reader) = reader else { continue };
        let tx = tx.clone();
        pumps.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = reader.read(&mut buf).await {
                if n == 0 || tx.send([&[channel][..], &buf[..n]].concat()).await.is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut stdin = child.stdin.take();
    let mut client_open = true;
    // Stdin frames in, output frames out, until both outputs end.
    loop {
        tokio::select! {
            frame = rx.recv() => match frame {
                Some(f) => {
                    if sink.send(Message::binary(f)).await.is_err() { break; }
                }
                None => break,
            },
            msg = stream.next(), if client_open => match msg {
                Some(Ok(Message::Binary(b))) if !b.is_empty() => match (b[0], b.get(1)) {
                    (0, _) => {
                        if let Some(s) = stdin.as_mut() {
                            let _ = s.write_all(&b[1..]).await;
                        }
                    }
                    (255, Some(0)) if v5 => stdin = None,
                    _ => {}
                },
                // The client went away: so does the process's input.
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    stdin = None;
                    client_open = false;
                }
                Some(Ok(_)) => {}
            }
        }
    }
    for p in pumps {
        let _ = p.await;
    }
    let code = child.wait().await.ok().and_then(|s| s.code()).unwrap_or(-1);
    // As a kubelet whose container went away under the exec: a failure, not an exit code.
    let body = if !fake.running(&ns, &name) {
        json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
               "message": "error executing command in container: container not running"})
    } else if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({"metadata": {}, "status": "Failure",
               "message": format!("command terminated with non-zero exit code: exit status {code}"),
               "reason": "NonZeroExitCode",
               "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
    };
    let frame = [&[3u8][..], body.to_string().as_bytes()].concat();
    let _ = sink.send(Message::binary(frame)).await;
    let _ = sink.close().await;
}
