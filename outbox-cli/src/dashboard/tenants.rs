//! The dashboard over a fleet's tenants (the daemon's `/ui` with
//! `[tenants]`): a picker that lists every tenant and its relay's state,
//! and below it each tenant's own dashboard at `/ui/t/<tenant>/`, made on
//! its first visit and let go once unvisited for a while (it samples its
//! store only while kept). One sign-in serves every tenant.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::tenants::{FleetStatus, TenantId, TenantState};

use super::auth::Sessions;
use super::html::{esc, table, url_value};
use super::http::{Request, Response};
use super::{Dashboard, Settings, TenantOf};
use crate::store::StoreOf;

/// A tenant's dashboard unvisited this long is let go (its sampling stops).
const KEPT_UNVISITED: Duration = Duration::from_secs(600);

/// What the daemon mounts under its dashboard path.
#[derive(Clone)]
pub enum Ui {
    /// One store's dashboard.
    Store(Arc<Dashboard>),
    /// A fleet's tenant picker.
    Tenants(Arc<TenantDashboards>),
}

impl Ui {
    /// Whether `path` is the dashboard's.
    pub fn serves(&self, path: &str) -> bool {
        let base = match self {
            Self::Store(dashboard) => &dashboard.settings.base,
            Self::Tenants(tenants) => &tenants.settings.base,
        };
        under(base, path).is_some()
    }

    /// The answer to `request`, whose path is the dashboard's.
    pub async fn respond(&self, request: &Request) -> Response {
        match self {
            Self::Store(dashboard) => dashboard.respond(request).await,
            Self::Tenants(tenants) => tenants.respond(request).await,
        }
    }
}

/// What of `path` is below `base` (`""` or `/…`), if it is.
fn under<'p>(base: &str, path: &'p str) -> Option<&'p str> {
    path.strip_prefix(base)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The picker and every visited tenant's dashboard.
pub struct TenantDashboards {
    /// The picker's: its base, the token and the sampling every tenant's
    /// dashboard gets.
    settings: Settings,
    fleet: FleetStatus,
    store_of: StoreOf,
    sessions: Arc<Sessions>,
    boards: Mutex<BTreeMap<TenantId, (Arc<Dashboard>, Instant)>>,
}

impl TenantDashboards {
    /// The picker over `fleet`'s tenants, each tenant's store from `store_of`.
    pub fn new(settings: Settings, fleet: FleetStatus, store_of: StoreOf) -> Arc<Self> {
        Arc::new(Self {
            settings,
            fleet,
            store_of,
            sessions: Arc::default(),
            boards: Mutex::default(),
        })
    }

    async fn respond(&self, request: &Request) -> Response {
        if self.settings.loopback_only && !super::names_loopback(request) {
            return self.page(
                "421 Misdirected Request",
                "<p id=\"error\">This dashboard answers requests for 127.0.0.1, localhost or [::1] only.</p>",
            );
        }
        let rest = under(&self.settings.base, &request.path).unwrap_or("");
        let segments: Vec<&str> = rest.trim_matches('/').split('/').collect();
        match (request.method.as_str(), segments.as_slice()) {
            ("GET", [""]) => self.page("200 OK", &self.picker()),
            ("GET", ["pick"]) => {
                let tenant = request.param("tenant");
                Response::see_other(&format!("{}/t/{}/", self.settings.base, url_value(tenant)))
            }
            ("GET", ["assets", "app.css"]) => Response::with(
                "text/css",
                "200 OK",
                include_str!("assets/app.css").as_bytes().to_vec(),
            ),
            (_, ["t", tenant, ..]) => match self.board(tenant) {
                Some(board) => board.respond(request).await,
                None => self.page(
                    "404 Not Found",
                    &format!(
                        r#"<p id="error">No tenant {} is relayed here. <a href="{}/">All tenants</a></p>"#,
                        esc(tenant),
                        self.settings.base
                    ),
                ),
            },
            _ => self.page("404 Not Found", "<p id=\"error\">No such page.</p>"),
        }
    }

    /// The tenant whose id, encoded for a path, is `segment`: its
    /// dashboard, made if needed; unvisited ones are let go meanwhile.
    fn board(&self, segment: &str) -> Option<Arc<Dashboard>> {
        let tenants = self.fleet.tenants();
        let tenant = tenants.keys().find(|t| url_value(t.as_str()) == segment)?;
        let mut boards = self.boards.lock().unwrap_or_else(|e| e.into_inner());
        boards.retain(|t, (_, visited)| {
            tenants.contains_key(t) && visited.elapsed() < KEPT_UNVISITED
        });
        if let Some((board, visited)) = boards.get_mut(tenant) {
            *visited = Instant::now();
            return Some(board.clone());
        }
        let store = match (self.store_of)(tenant) {
            Ok(store) => store,
            Err(error) => {
                tracing::warn!(%error, %tenant, "no dashboard for the tenant");
                return None;
            }
        };
        let settings = Settings {
            base: format!("{}/t/{segment}", self.settings.base),
            tenant: Some(TenantOf {
                name: tenant.to_string(),
                picker: self.settings.base.clone(),
            }),
            ..self.settings.clone()
        };
        let board = Dashboard::start_sharing(store, settings, self.sessions.clone());
        boards.insert(tenant.clone(), (board.clone(), Instant::now()));
        Some(board)
    }

    /// Every tenant, its relay's state, and a form to open one.
    fn picker(&self) -> String {
        let base = &self.settings.base;
        let tenants = self.fleet.tenants();
        let mut options = String::new();
        let rows: Vec<Vec<String>> = tenants
            .iter()
            .map(|(tenant, status)| {
                let name = esc(tenant.as_str());
                let _ = write!(options, r#"<option value="{name}">{name}</option>"#);
                let (state, detail) = match &status.state {
                    TenantState::Running => ("running", String::new()),
                    TenantState::Starting => ("starting", String::new()),
                    TenantState::Stopping => ("stopping", String::new()),
                    TenantState::Retrying {
                        failures,
                        error,
                        retry_at,
                    } => (
                        "retrying",
                        format!(
                            "failed {failures} time(s), retried at {}: {}",
                            retry_at.format("%H:%M:%S"),
                            esc(error)
                        ),
                    ),
                };
                vec![
                    format!(
                        r#"<a href="{base}/t/{}/">{name}</a>"#,
                        url_value(tenant.as_str())
                    ),
                    state.to_owned(),
                    detail,
                ]
            })
            .collect();
        let source = self.fleet.source_error().map_or_else(String::new, |e| {
            format!(
                r#"<p id="source-error">Reading the tenants failed: {}</p>"#,
                esc(&e)
            )
        });
        format!(
            r#"<h2>Tenants</h2>{source}<form id="pick" method="get" action="{base}/pick"><label>tenant <select name="tenant">{options}</select></label><button>Open</button></form><p>{} tenants.</p>{}"#,
            tenants.len(),
            table("tenants", &["tenant", "relay", "detail"], &rows)
        )
    }

    fn page(&self, status: &'static str, main: &str) -> Response {
        let base = &self.settings.base;
        Response::html(
            status,
            format!(
                r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Tenants · outbox</title><link rel="stylesheet" href="{base}/assets/app.css"></head>
<body><header><a class="brand" href="{base}/">outbox</a><nav><a href="{base}/">Tenants</a></nav></header>
<main id="main">{main}</main></body></html>"#
            ),
        )
    }
}
