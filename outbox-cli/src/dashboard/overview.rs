//! The overview: per event type what waits and what failed, what holds
//! publication back, the relays with their outages, blocked keys, and the
//! last hour as charts. The page's script refreshes `#live` in place.

use std::fmt::Write;

use std::time::Duration;

use outbox_core::chrono::{DateTime, Utc};
use outbox_core::store::{BlockedKey, EventTypeStats, RelayStatus};

use super::chart::{self, Shape};
use super::html::{age, esc, table, url_value};
use super::samples::{self, Sample, WINDOW};
use crate::render;

/// What the overview shows, read from the store for one request.
pub struct Overview {
    /// Per event type.
    pub stats: Vec<EventTypeStats>,
    /// One line per cause, from [`render::held_back`].
    pub held_back: Vec<String>,
    /// Relays with their last heartbeat.
    pub relays: Vec<RelayStatus>,
    /// Keys parked behind failed events.
    pub blocked: Vec<BlockedKey>,
    /// The newest event's sequence then.
    pub written: Option<i64>,
    /// When it was read.
    pub read_at: DateTime<Utc>,
    /// How long reading it took.
    pub took: Duration,
}

/// Why the store has not been read lately: since when the reads fail, and
/// the last one's error.
#[derive(Clone, Debug)]
pub struct Unread {
    /// The first failed read of this run of failures.
    pub since: DateTime<Utc>,
    /// The last read's error.
    pub error: String,
}

impl Overview {
    /// The page's main part; `base` prefixes links; `unread` says the store
    /// cannot be read now (the counts shown are the last read).
    pub fn render(&self, base: &str, history: &[Sample], unread: Option<&Unread>) -> String {
        let mut out = String::from(r#"<section id="live" data-refresh-seconds="5">"#);
        if let Some(unread) = unread {
            let _ = write!(
                out,
                r#"<p id="store-unreadable" class="bad">The store could not be read since {}: {}. The counts below are the last ones read.</p>"#,
                unread.since.format("%H:%M:%S UTC"),
                esc(&unread.error)
            );
        }
        let _ = write!(
            out,
            r#"<p id="as-of" class="muted">Counts as of {} (read in {} ms).</p>"#,
            self.read_at.format("%H:%M:%S UTC"),
            self.took.as_millis()
        );
        out.push_str("<h2>What holds publication back</h2>");
        if self.held_back.is_empty() {
            out.push_str(r#"<p id="held-back" class="ok">Nothing: every waiting event can be claimed now.</p>"#);
        } else {
            out.push_str(r#"<ul id="held-back">"#);
            for line in &self.held_back {
                let _ = write!(out, "<li>{}</li>", esc(line));
            }
            out.push_str("</ul>");
        }
        out.push_str(&self.charts(history));
        out.push_str("<h2>Event types</h2>");
        out.push_str(&self.event_types(base));
        out.push_str("<h2>Relays</h2>");
        out.push_str(&self.relays());
        if !self.blocked.is_empty() {
            out.push_str("<h2>Blocked keys</h2>");
            let rows = self
                .blocked
                .iter()
                .map(|key| {
                    vec![
                        esc(&key.partition_key),
                        format!(
                            r#"<a href="{base}/events/{id}">{id}</a>"#,
                            id = key.blocking_event_id
                        ),
                        key.backlog.to_string(),
                    ]
                })
                .collect::<Vec<_>>();
            out.push_str(&table(
                "blocked-keys",
                &["key", "blocked by", "waiting"],
                &rows,
            ));
        }
        out.push_str("</section>");
        out
    }

    fn event_types(&self, base: &str) -> String {
        if self.stats.is_empty() {
            return r#"<p id="event-types" class="muted">No events waiting, in flight or failed.</p>"#.into();
        }
        let cell = |s: &EventTypeStats, state: &str, n: u64| {
            format!(
                r#"<span data-type="{}" data-state="{state}">{n}</span>"#,
                esc(&s.event_type)
            )
        };
        let rows = self
            .stats
            .iter()
            .map(|s| {
                let failed = if s.failed > 0 {
                    format!(
                        r#"<a class="bad" href="{base}/failed?type={}">{}</a>"#,
                        url_value(&s.event_type),
                        cell(s, "failed", s.failed)
                    )
                } else {
                    cell(s, "failed", 0)
                };
                vec![
                    esc(&s.event_type),
                    cell(s, "claimable", s.claimable),
                    s.oldest_claimable_age
                        .map(|a| age(a.as_secs_f64()))
                        .unwrap_or_else(|| "–".into()),
                    cell(s, "parked", s.parked),
                    cell(s, "blocked", s.blocked),
                    cell(s, "in_flight", s.in_flight),
                    failed,
                ]
            })
            .collect::<Vec<_>>();
        table(
            "event-types",
            &[
                "type",
                "claimable",
                "oldest claimable",
                "parked (delayed)",
                "blocked",
                "in flight",
                "failed",
            ],
            &rows,
        )
    }

    fn relays(&self) -> String {
        if self.relays.is_empty() {
            return r#"<p id="relays" class="bad">No relay has reported: is one running?</p>"#
                .into();
        }
        let now = Utc::now();
        let rows = self
            .relays
            .iter()
            .map(|relay| {
                let outage = relay.outage.as_ref().map_or_else(
                    || "–".to_string(),
                    |o| {
                        format!(
                            r#"<span class="bad">{} paused for {}: {}</span>"#,
                            esc(&o.destination),
                            age(((now - o.since).num_milliseconds().max(0) as f64) / 1000.0),
                            esc(&o.reason)
                        )
                    },
                );
                vec![
                    esc(&relay.relay),
                    format!("{} ago", age(render::silent_for(relay, now))),
                    format!("{} ms", relay.clock_skew.num_milliseconds()),
                    outage,
                ]
            })
            .collect::<Vec<_>>();
        table(
            "relays",
            &["relay", "last heartbeat", "clock skew", "publisher outage"],
            &rows,
        )
    }

    fn charts(&self, history: &[Sample]) -> String {
        let now = Utc::now();
        // The last hour once there is an hour of samples; until then the
        // samples there are, over at least a minute.
        let kept = history
            .first()
            .map_or(0.0, |s| ((now - s.at).num_seconds().max(0)) as f64);
        let span = kept.clamp(60.0, WINDOW.as_secs_f64());
        let ago = |s: &Sample| ((now - s.at).num_milliseconds().max(0) as f64) / 1000.0;
        let line =
            |f: fn(&Sample) -> f64| history.iter().map(|s| (ago(s), f(s))).collect::<Vec<_>>();
        let failures = samples::failures_per_minute(history, now);
        format!(
            r#"<div class="charts">{}{}{}{}</div>"#,
            chart::svg(
                "chart-backlog",
                "Backlog (claimable, parked, blocked)",
                "events",
                Shape::Line,
                &line(|s| s.backlog as f64),
                span
            ),
            chart::svg(
                "chart-oldest",
                "Age of the oldest claimable event",
                "s",
                Shape::Line,
                &line(|s| s.oldest_age),
                span
            ),
            chart::svg(
                "chart-published",
                "Published per second",
                "events/s",
                Shape::Line,
                &samples::published_per_second(history, now),
                span
            ),
            chart::svg(
                "chart-failures",
                "Failures per minute",
                "events",
                Shape::Bars,
                &failures,
                span
            ),
        )
    }
}
