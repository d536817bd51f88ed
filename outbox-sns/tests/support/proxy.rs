//! An HTTP proxy in front of the emulator that answers chosen requests
//! itself: the errors real AWS returns (throttling, 5xx, authorization,
//! per-entry failures) or no answer at all, so each error class is tested
//! through the real SDK's parsing.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the proxy answers a request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Pass it to the emulator.
    Forward,
    /// Answer with this status and body.
    Canned {
        status: u16,
        content_type: &'static str,
        body: String,
    },
    /// Never answer.
    Hang,
}

impl Reply {
    /// An SNS (query protocol) error response.
    pub fn sns_error(status: u16, code: &str) -> Self {
        let kind = if status >= 500 { "Receiver" } else { "Sender" };
        Self::Canned {
            status,
            content_type: "text/xml",
            body: format!(
                "<ErrorResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><Error><Type>{kind}</Type><Code>{code}</Code><Message>injected by the test proxy</Message></Error><RequestId>proxy</RequestId></ErrorResponse>"
            ),
        }
    }

    /// An SQS (JSON protocol) error response.
    pub fn sqs_error(status: u16, code: &str) -> Self {
        Self::Canned {
            status,
            content_type: "application/x-amz-json-1.0",
            body: format!(
                "{{\"__type\":\"com.amazonaws.sqs#{code}\",\"message\":\"injected by the test proxy\"}}"
            ),
        }
    }

    /// A PublishBatch answer: `ok` ids succeeded; `failed` are
    /// `(id, code, sender_fault)`.
    pub fn publish_batch(ok: &[&str], failed: &[(&str, &str, bool)]) -> Self {
        let ok: String = ok
            .iter()
            .map(|id| format!("<member><Id>{id}</Id><MessageId>m-{id}</MessageId></member>"))
            .collect();
        let failed: String = failed
            .iter()
            .map(|(id, code, sender)| {
                format!("<member><Id>{id}</Id><Code>{code}</Code><Message>injected</Message><SenderFault>{sender}</SenderFault></member>")
            })
            .collect();
        Self::Canned {
            status: 200,
            content_type: "text/xml",
            body: format!(
                "<PublishBatchResponse xmlns=\"http://sns.amazonaws.com/doc/2010-03-31/\"><PublishBatchResult><Successful>{ok}</Successful><Failed>{failed}</Failed></PublishBatchResult><ResponseMetadata><RequestId>proxy</RequestId></ResponseMetadata></PublishBatchResponse>"
            ),
        }
    }
}

#[derive(Default)]
struct State {
    next: VecDeque<Reply>,
    every: Option<(usize, Reply)>,
    for_action: Vec<(String, Reply)>,
    requests: usize,
    injected: usize,
    actions: Vec<String>,
}

/// The proxy; stops when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("upstream is http://ip:port");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(serve(client, upstream, shared.clone()));
            }
        });
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers the next request with `reply` (queued after earlier ones).
    pub fn then(&self, reply: Reply) {
        self.state.lock().unwrap().next.push_back(reply);
    }

    /// Answers the next `action` request (`SendMessage`, …) with `reply`.
    pub fn then_for(&self, action: &str, reply: Reply) {
        self.state
            .lock()
            .unwrap()
            .for_action
            .push((action.to_owned(), reply));
    }

    /// Answers every `n`-th request with `reply` (queued replies first).
    pub fn every(&self, n: usize, reply: Reply) {
        self.state.lock().unwrap().every = Some((n, reply));
    }

    /// Requests seen so far.
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().requests
    }

    /// Requests the proxy answered itself.
    pub fn injected(&self) -> usize {
        self.state.lock().unwrap().injected
    }

    /// The action of every request so far (`PublishBatch`, `ReceiveMessage`, …).
    pub fn actions(&self) -> Vec<String> {
        self.state.lock().unwrap().actions.clone()
    }
}

/// One client connection, one request: every answer says `Connection:
/// close` (as the emulator's do), so the SDK opens a new one per request.
async fn serve(mut client: TcpStream, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    let Some((head, body)) = read_request(&mut client).await else {
        return;
    };
    let reply = {
        let mut state = state.lock().unwrap();
        state.requests += 1;
        let this_action = action(&head, &body);
        state.actions.push(this_action.clone());
        let n = state.requests;
        let targeted = state.for_action.iter().position(|(a, _)| *a == this_action);
        let reply = match targeted
            .map(|i| state.for_action.remove(i).1)
            .or_else(|| state.next.pop_front())
        {
            Some(reply) => reply,
            None => match &state.every {
                Some((every, reply)) if n.is_multiple_of(*every) => reply.clone(),
                _ => Reply::Forward,
            },
        };
        if !matches!(reply, Reply::Forward) {
            state.injected += 1;
        }
        reply
    };
    match reply {
        Reply::Forward => {
            let Ok(mut up) = TcpStream::connect(upstream).await else {
                return;
            };
            let mut request = head;
            request.extend_from_slice(&body);
            if up.write_all(&request).await.is_err() {
                return;
            }
            // The emulator answers with `Connection: close`.
            let mut response = Vec::new();
            if up.read_to_end(&mut response).await.is_ok() {
                let _ = client.write_all(&response).await;
            }
        }
        Reply::Canned {
            status,
            content_type,
            body,
        } => {
            let response = format!(
                "HTTP/1.1 {status} Injected\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nx-amzn-RequestId: proxy\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(response.as_bytes()).await;
        }
        Reply::Hang => {
            let mut sink = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(120), client.read(&mut sink)).await;
        }
    }
}

/// Reads one request: the head (through the blank line) and its body.
async fn read_request(client: &mut TcpStream) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head_text = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
    assert!(
        !head_text.contains("transfer-encoding: chunked"),
        "the test proxy reads Content-Length bodies only"
    );
    let length: usize = head_text
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.truncate(head_end);
    Some((buffer, body))
}

/// `Action=…` of a query request, or the operation of an `X-Amz-Target` one.
fn action(head: &[u8], body: &[u8]) -> String {
    let head = String::from_utf8_lossy(head);
    if let Some(target) = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("x-amz-target:")
            .map(|_| l.to_owned())
    }) {
        return target
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
    }
    let body = String::from_utf8_lossy(body);
    body.split('&')
        .find_map(|pair| pair.strip_prefix("Action="))
        .unwrap_or("?")
        .to_owned()
}
