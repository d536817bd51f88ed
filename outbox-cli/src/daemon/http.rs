//! `/metrics` (Prometheus text, with the backlog gauges of [`super::backlog`])
//! and `/health` over plain HTTP/1.1: two GET routes need no web framework.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use outbox_core::relay::RelayHealth;
use outbox_core::tenants::{FleetStatus, TenantState};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::backlog::BacklogGauges;
use super::served::Served;
use crate::dashboard::Ui;
use crate::error::CliError;

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
    /// False once the relay (or the fleet) stopped.
    pub running: Arc<AtomicBool>,
    /// The relay's, or each tenant's, view.
    pub watched: Watched,
    /// How long an outage may last before `/health` answers 503.
    pub outage_unhealthy_after: Duration,
}

/// Whose health `/health` reports.
#[derive(Clone)]
pub enum Watched {
    /// One relay: is it paused by a broker outage.
    Relay(RelayHealth),
    /// A fleet of tenants: which are not running, and why.
    Tenants(FleetStatus),
}

impl Liveness {
    /// The status line and body of `/health` now.
    fn answer(&self) -> (&'static str, String) {
        if !self.running.load(Ordering::SeqCst) {
            return ("503 Service Unavailable", "relay stopped\n".into());
        }
        match &self.watched {
            Watched::Relay(relay) => self.relay_answer(relay),
            Watched::Tenants(fleet) => ("200 OK", tenants_answer(fleet)),
        }
    }

    fn relay_answer(&self, relay: &RelayHealth) -> (&'static str, String) {
        let Some(ongoing) = relay.outage() else {
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

/// A fleet's `/health` body: one line per tenant not running (a tenant's
/// failure is its own: the process stays healthy), then the count.
fn tenants_answer(fleet: &FleetStatus) -> String {
    let tenants = fleet.tenants();
    let mut body = String::new();
    if let Some(error) = fleet.source_error() {
        body.push_str(&format!("degraded: reading the tenants failed: {error}\n"));
    }
    let mut running = 0;
    for (tenant, status) in &tenants {
        match &status.state {
            TenantState::Running => running += 1,
            TenantState::Starting => body.push_str(&format!("tenant {tenant}: starting\n")),
            TenantState::Stopping => body.push_str(&format!("tenant {tenant}: stopping\n")),
            TenantState::Retrying {
                failures,
                error,
                retry_at,
            } => body.push_str(&format!(
                "degraded: tenant {tenant}: failed {failures} time(s), retried at {}: {error}\n",
                retry_at.format("%H:%M:%S")
            )),
        }
    }
    body.push_str(&format!(
        "ok: {running} of {} tenants running\n",
        tenants.len()
    ));
    body
}

/// Serves until the process ends. `/health` is 200 while the relay runs
/// (saying "degraded: …" during a broker outage), 503 once it stopped or
/// an outage outlasted `outage_unhealthy_after`; the dashboard under its
/// path when it is mounted.
pub async fn serve(
    listener: TcpListener,
    metrics: PrometheusHandle,
    backlog: Option<Served>,
    liveness: Liveness,
    dashboard: Option<Ui>,
) {
    let backlog = backlog.map(BacklogGauges::new);
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
            if let Some(backlog) = backlog.filter(|_| request.path == "/metrics") {
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
