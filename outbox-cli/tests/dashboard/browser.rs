//! Headless Chromium driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`, installed by `scripts/chromium.sh`): a private
//! ChromeDriver per test on a free loopback port, and the few W3C WebDriver
//! commands the dashboard's tests use, spoken as JSON over HTTP/1.1.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session. ChromeDriver runs in a process group of its own,
/// with the Chromium it starts; dropping the session kills the group
/// (killing ChromeDriver alone left every Chromium of every run behind).
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempdir::Dir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(group) = self.driver.id() {
            // `kill -KILL -<group>`: ChromeDriver and its Chromium.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{group}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium session.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .expect("chromedriver runs (install it with scripts/chromium.sh)");
        let profile = tempdir::Dir::new("outbox-chromium");
        let mut browser = Self {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--window-size=1280,1100",
                         format!("--user-data-dir={}", browser._profile.path.display())],
            },
        }}});
        let created = browser.call("POST", "/session", Some(capabilities)).await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        browser
    }

    /// Opens `url` and waits for it to load.
    pub async fn goto(&self, url: &str) {
        self.command("POST", "url", json!({ "url": url })).await;
    }

    /// Waits (up to 10 s) until `css` selects an element: a click that
    /// submits a form returns before the next page has loaded.
    pub async fn wait_for(&self, css: &str) {
        for _ in 0..200 {
            let path = format!("/session/{}/element", self.session);
            let body = json!({"using": "css selector", "value": css}).to_string();
            if http(self.port, "POST", &path, "", Some(body)).await.0 == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("no element {css:?} after 10 s");
    }

    /// The first element `css` selects.
    pub async fn find(&self, css: &str) -> String {
        let found = self
            .command(
                "POST",
                "element",
                json!({"using": "css selector", "value": css}),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css:?}: {found}"))
            .to_owned()
    }

    /// The visible text of the first element `css` selects.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        let text = self
            .command("GET", &format!("element/{element}/text"), Value::Null)
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Clicks the first element `css` selects.
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.command("POST", &format!("element/{element}/click"), json!({}))
            .await;
    }

    /// Empties the first input or text area `css` selects.
    pub async fn clear(&self, css: &str) {
        let element = self.find(css).await;
        self.command("POST", &format!("element/{element}/clear"), json!({}))
            .await;
    }

    /// Types `text` into the first element `css` selects.
    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await;
        self.command(
            "POST",
            &format!("element/{element}/value"),
            json!({ "text": text }),
        )
        .await;
    }

    /// Runs `script` (a function body) in the page; its return value.
    pub async fn run(&self, script: &str) -> Value {
        self.command(
            "POST",
            "execute/sync",
            json!({"script": script, "args": []}),
        )
        .await
    }

    /// The session's cookies, as `name=value; …`.
    pub async fn cookies(&self) -> String {
        let cookies = self.command("GET", "cookie", Value::Null).await;
        cookies
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                format!(
                    "{}={}",
                    c["name"].as_str().unwrap_or(""),
                    c["value"].as_str().unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Saves a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine;
        let shot = self.command("GET", "screenshot", Value::Null).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot.as_str().expect("a screenshot"))
            .expect("base64");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    async fn command(&self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}/{path}", self.session);
        let body = if method == "GET" { None } else { Some(body) };
        self.call(method, &path, body).await
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, answer) = http(self.port, method, path, "", body.map(|b| b.to_string())).await;
        let answer: Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("WebDriver answered {status} not JSON ({e}): {answer}"));
        if status != 200 {
            panic!("WebDriver {method} {path}: {status} {answer}");
        }
        answer["value"].clone()
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port`; the status and body.
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: Option<String>,
) -> (u16, String) {
    let mut socket = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connects");
    let body = body.unwrap_or_default();
    let host = if headers.contains("host:") {
        String::new()
    } else {
        format!("host: 127.0.0.1:{port}\r\n")
    };
    let content_type = if headers.contains("content-type") {
        ""
    } else {
        "content-type: application/json\r\n"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\n{host}{content_type}{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    // Read up to the body's length: ChromeDriver may keep the connection
    // open despite `connection: close`.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = socket.read(&mut chunk).await.unwrap();
        answer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&answer);
        if n == 0 {
            break;
        }
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok());
            if length.is_some_and(|length| body.len() >= length) {
                break;
            }
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunked(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn unchunked(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// A directory removed on drop.
mod tempdir {
    pub struct Dir {
        pub path: std::path::PathBuf,
    }

    impl Dir {
        pub fn new(stem: &str) -> Self {
            let path = std::env::temp_dir().join(format!("{stem}-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
