//! `/metrics` (Prometheus text) and `/health` over plain HTTP/1.1: two GET
//! routes need no web framework.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use metrics_exporter_prometheus::PrometheusHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves until the process ends. `/health` is 200 while the relay runs,
/// 503 once it stopped.
pub async fn serve(listener: TcpListener, metrics: PrometheusHandle, running: Arc<AtomicBool>) {
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let running = running.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let Ok(n) = socket.read(&mut request).await else {
                return;
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let (status, content_type, body) = match path {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
                "/health" if running.load(Ordering::SeqCst) => {
                    ("200 OK", "text/plain", "ok\n".to_string())
                }
                "/health" => (
                    "503 Service Unavailable",
                    "text/plain",
                    "relay stopped\n".to_string(),
                ),
                _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        });
    }
}
