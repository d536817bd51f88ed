//! The operators' dashboard: `outbox dashboard` on its own, or the relay
//! daemon's `/ui`. Server-rendered pages (escaped, under a content security
//! policy that runs no inline script), a small script that refreshes the
//! overview in place, charts drawn as SVG on the server from samples it
//! takes itself. Reading needs nothing; acting needs the configured token
//! (see [`auth`]).

mod auth;
mod bulk;
mod chart;
mod event;
mod failed;
mod html;
mod http;
mod overview;
mod samples;
mod tenants;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::EventId;
use outbox_core::chrono::Utc;
use outbox_core::store::{EventState, OperatorAction};
use tokio::net::TcpListener;

use crate::store::Store;
use auth::{COOKIE, Refused, Sessions};
use html::{Frame, esc};
pub use http::read;
use http::{Request, Response};
pub use tenants::{TenantDashboards, Ui};

/// How the dashboard is served.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where it is mounted: `""` on its own, `/ui` under the daemon.
    pub base: String,
    /// The token that lets a visitor act; `None`: read-only.
    pub token: Option<String>,
    /// How often the charts' counts are read.
    pub sample_every: Duration,
    /// Listening on a loopback address only: then a request must name a
    /// loopback host, so a web page whose domain an attacker rebinds to
    /// 127.0.0.1 cannot read the dashboard from a browser on this machine.
    pub loopback_only: bool,
    /// One tenant's dashboard under a tenant picker: its pages name the
    /// tenant and link back; its session is the picker's.
    pub tenant: Option<TenantOf>,
}

/// The tenant a dashboard shows, under a picker.
#[derive(Clone, Debug)]
pub struct TenantOf {
    /// The tenant.
    pub name: String,
    /// Where the picker is mounted (`/ui`): every tenant's dashboard below
    /// it shares its sign-in, so the session cookie's path is this.
    pub picker: String,
}

/// The dashboard over one store.
pub struct Dashboard {
    store: Store,
    settings: Settings,
    sessions: Arc<Sessions>,
    samples: samples::Samples,
    jobs: bulk::Jobs,
    /// The overview as last read by the sampler.
    latest: std::sync::Mutex<Option<Arc<overview::Overview>>>,
    /// Since when, and why, the sampler has failed to read the store
    /// (`None` while its reads succeed).
    unread: std::sync::Mutex<Option<overview::Unread>>,
}

impl Dashboard {
    /// A dashboard over `store`, sampling it in the background from now on.
    pub fn start(store: Store, settings: Settings) -> Arc<Self> {
        Self::start_sharing(store, settings, Arc::default())
    }

    /// A dashboard whose visitors' sign-ins are `sessions` (shared by
    /// every tenant's dashboard of a picker).
    fn start_sharing(store: Store, settings: Settings, sessions: Arc<Sessions>) -> Arc<Self> {
        let dashboard = Arc::new(Self {
            store,
            settings,
            sessions,
            samples: samples::Samples::default(),
            jobs: bulk::Jobs::default(),
            latest: std::sync::Mutex::new(None),
            unread: std::sync::Mutex::new(None),
        });
        let sampling = Arc::downgrade(&dashboard);
        tokio::spawn(async move {
            while let Some(dashboard) = sampling.upgrade() {
                // Reading the counts costs the store more as the backlog
                // grows (seconds at a million waiting): the dashboard keeps
                // to a tenth of one connection's time. A read that failed
                // (the store down) cost it nothing: the next one comes on
                // schedule, so the page recovers as soon as the store does.
                let every = dashboard.settings.sample_every;
                let pause = match dashboard.sample().await {
                    Ok(took) => every.max(took * 10),
                    Err(()) => every,
                };
                drop(dashboard);
                tokio::time::sleep(pause).await;
            }
        });
        dashboard
    }

    /// Reads the overview, keeps it for the pages and its counts for the
    /// charts; returns how long the store took to answer, or notes why it
    /// could not.
    async fn sample(&self) -> Result<Duration, ()> {
        let read = self.read_overview().await;
        let mut unread = self.unread.lock().unwrap_or_else(|e| e.into_inner());
        match read {
            Ok(overview) => {
                let (written, took) = (overview.written, overview.took);
                let sample = samples::Sample::of(&overview.stats, written, overview.read_at);
                self.samples.record(sample);
                *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(overview));
                *unread = None;
                Ok(took)
            }
            Err(error) => {
                tracing::warn!(%error, "the dashboard could not read the store's counts");
                let since = unread.as_ref().map_or_else(Utc::now, |u| u.since);
                *unread = Some(overview::Unread {
                    since,
                    error: error.to_string(),
                });
                Err(())
            }
        }
    }

    async fn read_overview(&self) -> Result<overview::Overview, outbox_core::StoreError> {
        let admin = self.store.admin();
        // One index probe first: it waits out a connection being made (a
        // store just back from a restart), which the time that spaces the
        // reads out must not count.
        let written = admin.last_sequence().await?;
        let started = std::time::Instant::now();
        let stats = admin.stats().await?;
        let relays = admin.relays().await?;
        let held_back = admin.held_back().await?;
        let blocked = admin.blocked_keys().await?;
        let read_at = Utc::now();
        Ok(overview::Overview {
            held_back: crate::render::held_back_lines(&held_back, &relays, read_at)
                .iter()
                .map(|line| line["detail"].as_str().unwrap_or_default().to_owned())
                .collect(),
            stats,
            relays,
            blocked,
            written,
            read_at,
            took: started.elapsed(),
        })
    }

    /// Serves on `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                continue;
            };
            let dashboard = self.clone();
            tokio::spawn(async move {
                if let Some(request) = http::read(&mut socket).await {
                    dashboard.respond(&request).await.write(&mut socket).await;
                }
            });
        }
    }

    /// The answer to `request`, whose path starts with the base.
    pub async fn respond(&self, request: &Request) -> Response {
        if self.settings.loopback_only && !names_loopback(request) {
            let main = "<h2>421 Misdirected Request</h2><p id=\"error\">This dashboard answers requests for 127.0.0.1, localhost or [::1] only.</p>";
            return Response::html(
                "421 Misdirected Request",
                self.frame(request).page("Misdirected", main),
            );
        }
        let path = request
            .path
            .strip_prefix(&self.settings.base)
            .unwrap_or(&request.path);
        let path = if path.is_empty() { "/" } else { path };
        let segments = path.trim_matches('/').split('/').collect::<Vec<_>>();
        let result = match (request.method.as_str(), segments.as_slice()) {
            ("GET", [""]) => self.overview(request).await,
            ("GET", ["failed"]) => self.failed(request).await,
            ("POST", ["failed", "bulk"]) => self.bulk(request).await,
            ("GET", ["failed", "bulk", id]) => self.bulk_job(request, id),
            ("GET", ["events", id]) => self.event(request, id).await,
            ("POST", ["events", id, action]) => self.act(request, id, action).await,
            ("GET", ["login"]) => Ok(self.login_page(request, "")),
            ("POST", ["login"]) => Ok(self.login(request).await),
            ("POST", ["logout"]) => Ok(self.logout(request)),
            ("GET", ["assets", "app.js"]) => {
                Ok(asset("text/javascript", include_str!("assets/app.js")))
            }
            ("GET", ["assets", "app.css"]) => Ok(asset("text/css", include_str!("assets/app.css"))),
            _ => Err(("404 Not Found", "No such page.".to_string())),
        };
        result.unwrap_or_else(|(status, message)| {
            let main = format!(r#"<h2>{status}</h2><p id="error">{}</p>"#, esc(&message));
            Response::html(status, self.frame(request).page(status, &main))
        })
    }

    fn frame<'a>(&'a self, request: &Request) -> FrameFor<'a> {
        FrameFor {
            dashboard: self,
            csrf: self.sessions.csrf_of(request),
        }
    }

    /// The overview as last sampled (the first one read on request): a page
    /// load or refresh costs the store nothing, however many are open.
    async fn overview(&self, request: &Request) -> Page {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let overview = match latest {
            Some(overview) => overview,
            None => {
                let _ = self.sample().await;
                let latest = self
                    .latest
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                latest.ok_or_else(|| {
                    let unread = self.unread.lock().unwrap_or_else(|e| e.into_inner());
                    let why = unread.as_ref().map_or("", |u| u.error.as_str());
                    (
                        "503 Service Unavailable",
                        format!("The store could not be read: {}", esc(why)),
                    )
                })?
            }
        };
        let unread = self
            .unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let main = overview.render(&self.settings.base, &self.samples.all(), unread.as_ref());
        Ok(Response::html(
            "200 OK",
            self.frame(request).page("Overview", &main),
        ))
    }

    async fn failed(&self, request: &Request) -> Page {
        let frame = self.frame(request);
        let main = failed::list(&frame.frame(), request, self.store.admin()).await?;
        Ok(Response::html("200 OK", frame.page("Failed events", &main)))
    }

    /// A bulk action: its count and confirmation, then (confirmed) its
    /// job, started in the background; the answer sends the browser to
    /// the job's page.
    async fn bulk(&self, request: &Request) -> Page {
        self.authorize(request)?;
        let action = request.field("action");
        let action = bulk::Action::named(action)
            .ok_or_else(|| ("400 Bad Request", format!("no bulk action {action:?}")))?;
        let operator = operator_action(request)?;
        let filter = failed::Filter::from(&request.form);
        let frame = self.frame(request);
        if request.field("confirm") != "yes" {
            let counted = bulk::count(self.store.admin(), &filter)
                .await
                .map_err(|e| ("400 Bad Request", e))?;
            let main = failed::confirm(&frame.frame(), &filter, action, counted, request);
            return Ok(Response::html("200 OK", frame.page("Confirm", &main)));
        }
        let number = |name: &str| {
            let given = request.field(name);
            given.parse::<i64>().map_err(|_| {
                (
                    "400 Bad Request",
                    format!("{name}: {given:?} is not a number"),
                )
            })
        };
        let job = self.jobs.start(
            self.store.clone(),
            bulk::Confirmed {
                action,
                filter,
                through: number("through")?,
                counted: number("count")?.max(0) as u64,
                operator,
            },
        );
        Ok(Response::see_other(&format!(
            "{}/failed/bulk/{}",
            self.settings.base, job.id
        )))
    }

    fn bulk_job(&self, request: &Request, id: &str) -> Page {
        let job = id
            .parse()
            .ok()
            .and_then(|id| self.jobs.get(id))
            .ok_or(("404 Not Found", format!("No bulk action {}.", esc(id))))?;
        let frame = self.frame(request);
        let main = job.render(&self.settings.base);
        Ok(Response::html(
            "200 OK",
            frame.page(&format!("Bulk action #{}", job.id), &main),
        ))
    }

    async fn event(&self, request: &Request, id: &str) -> Page {
        let id = parse_id(id)?;
        let admin = self.store.admin();
        let state = admin
            .event_state(id)
            .await
            .map_err(store_error)?
            .ok_or(("404 Not Found", format!("No event {id}.")))?;
        let failed = if matches!(state, EventState::Failed { .. }) {
            admin.failed_event(id).await.map_err(store_error)?
        } else {
            None
        };
        let page = event::EventPage {
            id,
            history: admin.history(id).await.map_err(store_error)?,
            state,
            failed,
        };
        let frame = self.frame(request);
        let main = page.render(&frame.frame(), request.param("payload") == "1");
        Ok(Response::html(
            "200 OK",
            frame.page(&format!("Event {id}"), &main),
        ))
    }

    async fn act(&self, request: &Request, id: &str, action: &str) -> Page {
        self.authorize(request)?;
        let id = parse_id(id)?;
        let operator = operator_action(request)?;
        let admin = self.store.admin();
        let result = match action {
            "requeue" => admin.requeue(id, &operator).await,
            "skip" => admin.skip(id, &operator).await,
            "supersede" => {
                let payload: serde_json::Value = serde_json::from_str(request.field("payload"))
                    .map_err(|e| {
                        (
                            "400 Bad Request",
                            format!("The new payload is not JSON: {e}"),
                        )
                    })?;
                let failed = crate::commands::find_failed(&self.store, id)
                    .await
                    .map_err(|e| ("409 Conflict", e.to_string()))?;
                let replacement = crate::commands::replacement_of(&failed, &payload)
                    .map_err(|e| ("400 Bad Request", e.to_string()))?;
                admin
                    .supersede(id, replacement, &operator)
                    .await
                    .map(|_| ())
            }
            _ => return Err(("404 Not Found", format!("No action {action:?}."))),
        };
        result.map_err(|e| ("409 Conflict", e.to_string()))?;
        Ok(Response::see_other(&format!(
            "{}/events/{id}",
            self.settings.base
        )))
    }

    fn authorize(&self, request: &Request) -> Result<(), (&'static str, String)> {
        self.sessions
            .authorize(request, self.settings.token.is_some())
            .map_err(|refused| ("403 Forbidden", refused.explain().to_string()))
    }

    fn login_page(&self, request: &Request, problem: &str) -> Response {
        let base = &self.settings.base;
        let main = if self.settings.token.is_none() {
            format!("<p>{}</p>", Refused::ReadOnly.explain())
        } else {
            format!(
                r#"<h2>Sign in</h2>{}<form id="login" method="post" action="{base}/login"><label>token <input type="password" name="token" required autofocus></label><button>Sign in</button></form>"#,
                if problem.is_empty() {
                    String::new()
                } else {
                    format!(r#"<p class="bad" id="error">{}</p>"#, esc(problem))
                }
            )
        };
        let status = if problem.is_empty() {
            "200 OK"
        } else {
            "401 Unauthorized"
        };
        Response::html(status, self.frame(request).page("Sign in", &main))
    }

    async fn login(&self, request: &Request) -> Response {
        let Some(token) = &self.settings.token else {
            return self.login_page(request, "");
        };
        if !auth::same(request.field("token"), token) {
            // Slows guessing down.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return self.login_page(request, "That is not the dashboard's token.");
        }
        let session = self.sessions.start();
        let path = match &self.settings.tenant {
            Some(tenant) => &tenant.picker,
            None if self.settings.base.is_empty() => "/",
            None => &self.settings.base,
        };
        Response::see_other(&format!("{}/", self.settings.base)).set_cookie(&format!(
            "{COOKIE}={session}; Path={path}; HttpOnly; SameSite=Strict"
        ))
    }

    fn logout(&self, request: &Request) -> Response {
        if self.authorize(request).is_ok() {
            self.sessions.end(request);
        }
        Response::see_other(&format!("{}/", self.settings.base))
    }
}

/// A page or why not: a status line and a message for people.
type Page = Result<Response, (&'static str, String)>;

/// The frame of one visitor's pages.
struct FrameFor<'a> {
    dashboard: &'a Dashboard,
    csrf: Option<String>,
}

impl FrameFor<'_> {
    fn frame(&self) -> Frame<'_> {
        Frame {
            base: &self.dashboard.settings.base,
            store: self.dashboard.store.kind(),
            signed_in: self.csrf.is_some(),
            actions_enabled: self.dashboard.settings.token.is_some(),
            csrf: self.csrf.as_deref(),
            tenant: self.dashboard.settings.tenant.as_ref(),
        }
    }

    fn page(&self, title: &str, main: &str) -> String {
        self.frame().page(title, main)
    }
}

/// Whether the request's `Host` is a loopback name (with any port).
fn names_loopback(request: &Request) -> bool {
    let host = request.headers.get("host").map_or("", String::as_str);
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    matches!(name, "127.0.0.1" | "localhost" | "::1")
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    Response::with(content_type, "200 OK", text.as_bytes().to_vec())
}

fn parse_id(id: &str) -> Result<EventId, (&'static str, String)> {
    id.parse::<EventId>()
        .map_err(|_| ("400 Bad Request", format!("{id:?} is not an event id.")))
}

fn operator_action(request: &Request) -> Result<OperatorAction, (&'static str, String)> {
    let (operator, reason) = (
        request.field("operator").trim(),
        request.field("reason").trim(),
    );
    if operator.is_empty() || reason.is_empty() {
        return Err((
            "400 Bad Request",
            "Operator and reason must not be empty: they are kept in the event's history.".into(),
        ));
    }
    Ok(OperatorAction::new(operator, reason))
}

fn store_error(error: outbox_core::StoreError) -> (&'static str, String) {
    (
        "503 Service Unavailable",
        format!("The store could not answer: {error}"),
    )
}
