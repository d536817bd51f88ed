//! Just enough HTTP/1.1 for the dashboard: one request per connection
//! (`connection: close`), a bounded head and body, urlencoded forms, and
//! every response sent with the headers that keep a page inert (a content
//! security policy that allows no inline script, no framing, no sniffing).

use std::collections::HashMap;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest request head read (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// Longest request body read (a superseding payload fits).
const MAX_BODY: usize = 1024 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// What every page may load: its own script and style sheet, nothing
/// inline, nothing from elsewhere. A payload that holds `<script>` could not
/// run even if it escaped the escaping.
const SECURITY_HEADERS: &str = "content-security-policy: default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
frame-ancestors 'none'; base-uri 'none'\r\nx-content-type-options: nosniff\r\n\
x-frame-options: DENY\r\nreferrer-policy: no-referrer\r\ncache-control: no-store\r\n";

/// A request as the dashboard reads it.
#[derive(Debug, Default)]
pub struct Request {
    /// `GET`, `POST`, …
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query's parameters (a repeated name keeps its last value).
    pub query: HashMap<String, String>,
    /// Header names in lower case.
    pub headers: HashMap<String, String>,
    /// An urlencoded form body's fields.
    pub form: HashMap<String, String>,
}

impl Request {
    /// A query parameter, empty when absent.
    pub fn param(&self, name: &str) -> &str {
        self.query.get(name).map_or("", String::as_str)
    }

    /// A form field, empty when absent.
    pub fn field(&self, name: &str) -> &str {
        self.form.get(name).map_or("", String::as_str)
    }

    /// A cookie's value.
    pub fn cookie(&self, name: &str) -> Option<&str> {
        self.headers.get("cookie")?.split(';').find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then_some(value)
        })
    }

    /// Parses a request head and body; `None` when it is not HTTP.
    pub fn parse(head: &str, body: &[u8]) -> Option<Self> {
        let mut lines = head.split("\r\n");
        let mut first = lines.next()?.split(' ');
        let method = first.next()?.to_owned();
        let target = first.next()?;
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let headers = lines
            .filter_map(|line| line.split_once(':'))
            .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
            .collect::<HashMap<_, _>>();
        let is_form = headers
            .get("content-type")
            .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
        Some(Self {
            method,
            path: percent_decoded(path),
            query: form_fields(query.as_bytes()),
            form: if is_form {
                form_fields(body)
            } else {
                HashMap::new()
            },
            headers,
        })
    }
}

fn percent_decoded(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

fn form_fields(bytes: &[u8]) -> HashMap<String, String> {
    form_urlencoded::parse(bytes).into_owned().collect()
}

/// Reads one request; `None` when the client sent nothing readable in
/// time, or more than the bounds allow.
pub async fn read(socket: &mut TcpStream) -> Option<Request> {
    tokio::time::timeout(READ_TIMEOUT, read_unbounded_in_time(socket))
        .await
        .ok()
        .flatten()
}

async fn read_unbounded_in_time(socket: &mut TcpStream) -> Option<Request> {
    let mut buffer = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if buffer.len() > MAX_HEAD {
            return None;
        }
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).ok()?;
    let length = head
        .split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .map_or(Some(0), |(_, v)| v.trim().parse::<usize>().ok())?;
    if length > MAX_BODY {
        return None;
    }
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = vec![0u8; length - body.len()];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Request::parse(&head, &body)
}

/// A response about to be written.
#[derive(Debug)]
pub struct Response {
    /// `200 OK`, `303 See Other`, …
    pub status: &'static str,
    /// The media type.
    pub content_type: &'static str,
    /// Extra header lines, each ending in `\r\n`.
    pub headers: String,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A page.
    pub fn html(status: &'static str, body: String) -> Self {
        Self::with("text/html; charset=utf-8", status, body.into_bytes())
    }

    /// Any other content.
    pub fn with(content_type: &'static str, status: &'static str, body: Vec<u8>) -> Self {
        Self {
            status,
            content_type,
            headers: String::new(),
            body,
        }
    }

    /// After an action: go to `location` (the browser GETs it).
    pub fn see_other(location: &str) -> Self {
        let mut response = Self::with("text/plain", "303 See Other", Vec::new());
        response.headers = format!("location: {location}\r\n");
        response
    }

    /// Adds a `set-cookie` header.
    pub fn set_cookie(mut self, cookie: &str) -> Self {
        self.headers.push_str(&format!("set-cookie: {cookie}\r\n"));
        self
    }

    /// Writes the response and closes the connection.
    pub async fn write(self, socket: &mut TcpStream) {
        let head = format!(
            "HTTP/1.1 {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n{SECURITY_HEADERS}{}\r\n",
            self.status,
            self.content_type,
            self.body.len(),
            self.headers
        );
        let _ = socket.write_all(head.as_bytes()).await;
        let _ = socket.write_all(&self.body).await;
        let _ = socket.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_post_is_read_with_its_query_cookies_and_fields() {
        let head = "POST /events/a%20b?x=1&y=two+words HTTP/1.1\r\nHost: h\r\nCookie: a=1; outbox_session=s3\r\nContent-Type: application/x-www-form-urlencoded";
        let request = Request::parse(head, b"reason=it+was+%3Cbad%3E&csrf=t").unwrap();
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/events/a b");
        assert_eq!(request.param("y"), "two words");
        assert_eq!(request.cookie("outbox_session"), Some("s3"));
        assert_eq!(request.field("reason"), "it was <bad>");
        assert_eq!(request.field("missing"), "");
    }

    #[test]
    fn a_body_that_is_not_a_form_gives_no_fields() {
        let request =
            Request::parse("POST / HTTP/1.1\r\nContent-Type: text/plain", b"a=b").unwrap();
        assert!(request.form.is_empty());
        assert!(Request::parse("", b"").is_none());
    }
}
