//! `/metrics` (Prometheus text, with the backlog gauges of [`super::backlog`])
//! and `/health` over plain HTTP/1.1: two GET routes need no web framework.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use outbox_core::relay::RelayHealth;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::backlog::BacklogGauges;
use crate::dashboard::Dashboard;
use crate::error::CliError;
use crate::store::Store;

/// Installs the Prometheus recorder: histograms with the documented bucket
/// bounds (they add up across replicas, unlike summaries), every metric
/// described (`# HELP`), the daemon's own counter at 0 from the start.
pub fn install_recorder() -> Result<PrometheusHandle, CliError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let failed = |e: metrics_exporter_prometheus::BuildError| {
        CliError::failure(format!("metrics recorder: {e}"))
    };
    let mut builder = PrometheusBuilder::new();
    for (name, buckets) in outbox_core::relay::metrics::HISTOGRAM_BUCKETS {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), buckets)
            .map_err(failed)?;
    }
    let handle = builder.install_recorder().map_err(failed)?;
    outbox_core::relay::metrics::describe();
    super::backlog::describe();
    Ok(handle)
}

/// What `/health` answers from.
#[derive(Clone)]
pub struct Liveness {
    /// False once the relay stopped.
    pub running: Arc<AtomicBool>,
    /// The relay's own view: is it paused by a broker outage.
    pub relay: RelayHealth,
    /// How long an outage may last before `/health` answers 503.
    pub outage_unhealthy_after: Duration,
}

impl Liveness {
    /// The status line and body of `/health` now.
    fn answer(&self) -> (&'static str, String) {
        if !self.running.load(Ordering::SeqCst) {
            return ("503 Service Unavailable", "relay stopped\n".into());
        }
        let Some(ongoing) = self.relay.outage() else {
            return ("200 OK", "ok\n".into());
        };
        let lasted = ongoing.duration();
        let body = format!(
            "degraded: publishing to {} paused for {} s: {}\n",
            ongoing.outage.destination,
            lasted.as_secs(),
            ongoing.outage.reason
        );
        if lasted >= self.outage_unhealthy_after {
            ("503 Service Unavailable", body)
        } else {
            ("200 OK", body)
        }
    }
}

/// Serves until the process ends. `/health` is 200 while the relay runs
/// (saying "degraded: …" during a broker outage), 503 once it stopped or
/// an outage outlasted `outage_unhealthy_after`; the dashboard under its
/// path when it is mounted.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    store: Store,
    liveness: Liveness,
    dashboard: Option<Arc<Dashboard>>,
) {
    let backlog = BacklogGauges::new(store);
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let liveness = liveness.clone();
        let backlog = backlog.clone();
        let dashboard = dashboard.clone();
        tokio::spawn(async move {
            let Some(request) = crate::dashboard::read(&mut socket).await else {
                return;
            };
            if let Some(dashboard) = dashboard.filter(|d| d.serves(&request.path)) {
                dashboard.respond(&request).await.write(&mut socket).await;
                return;
            }
            if request.path == "/metrics" {
                backlog.refresh().await;
            }
            let (status, content_type, body) = match request.path.as_str() {
                "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
                "/health" => {
                    let (status, body) = liveness.answer();
                    (status, "text/plain", body)
                }
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
