//! One event's page: where it stands, every attempt in its history, its
//! payload on request, and (failed, signed in) the actions requeue, skip
//! and supersede with operator and reason.

use std::fmt::Write;

use outbox_core::EventId;
use outbox_core::store::{AttemptRecord, EventState, FailedEvent};

use super::html::{Frame, esc, table};

/// What the page shows, read from the store.
pub struct EventPage {
    /// The event.
    pub id: EventId,
    /// Where it stands.
    pub state: EventState,
    /// Its history, oldest first.
    pub history: Vec<AttemptRecord>,
    /// Its metadata and payload, when it has failed.
    pub failed: Option<FailedEvent>,
}

impl EventPage {
    /// The page's main part; the payload only when `show_payload`.
    pub fn render(&self, frame: &Frame<'_>, show_payload: bool) -> String {
        let base = frame.base;
        let id = self.id;
        let mut out = format!(
            r#"<h2>Event <code id="event-id">{id}</code></h2><p>State: <strong id="state">{}</strong> {}</p>"#,
            self.state.name(),
            esc(&state_detail(&self.state))
        );
        if let Some(failed) = &self.failed {
            let stored = &failed.event;
            let event = &stored.event;
            let mut rows = vec![
                vec!["type".into(), esc(&event.event_type)],
                vec!["key".into(), esc(&event.partition_key)],
                vec![
                    "aggregate".into(),
                    format!(
                        "{} {}",
                        esc(&event.aggregate_type),
                        esc(&event.aggregate_id)
                    ),
                ],
                vec!["created".into(), stored.created_at.to_string()],
                vec!["attempts".into(), stored.attempts.to_string()],
                vec!["payload version".into(), event.payload_version.to_string()],
            ];
            for (name, value) in event.headers.iter() {
                rows.push(vec![format!("header {}", esc(name)), esc(value)]);
            }
            out.push_str(&table("metadata", &["", ""], &rows));
            if show_payload {
                let _ = write!(
                    out,
                    r#"<h3>Payload</h3><pre id="payload">{}</pre>"#,
                    esc(event.payload.as_str())
                );
            } else {
                let _ = write!(
                    out,
                    r#"<p><a id="show-payload" href="{base}/events/{id}?payload=1">Show the payload ({} bytes)</a></p>"#,
                    event.payload.len()
                );
            }
        }
        out.push_str("<h3>History</h3>");
        let rows = self
            .history
            .iter()
            .map(|h| {
                vec![
                    h.at.to_string(),
                    format!("{:?}", h.kind),
                    esc(&h.actor),
                    h.error_class.map(|c| format!("{c:?}")).unwrap_or_default(),
                    h.attempts.to_string(),
                    format!(r#"<span class="error">{}</span>"#, esc(&h.detail)),
                ]
            })
            .collect::<Vec<_>>();
        out.push_str(&table(
            "history",
            &["at", "what", "by", "class", "attempts", "detail"],
            &rows,
        ));
        if matches!(
            self.state,
            EventState::Failed {
                superseded_by: None,
                ..
            }
        ) {
            out.push_str(&self.actions(frame));
        }
        out
    }

    fn actions(&self, frame: &Frame<'_>) -> String {
        if !frame.signed_in {
            return format!(
                r#"<p id="actions" class="muted">{}</p>"#,
                if frame.actions_enabled {
                    "Sign in to requeue, skip or supersede this event."
                } else {
                    "Read-only: no token is configured."
                }
            );
        }
        let base = frame.base;
        let id = self.id;
        let csrf = frame.csrf_field();
        let who = r#"<label>operator <input name="operator" required></label><label>reason <input name="reason" required></label>"#;
        let payload = self
            .failed
            .as_ref()
            .map(|f| esc(f.event.event.payload.as_str()))
            .unwrap_or_default();
        format!(
            r#"<h3>Actions</h3><div id="actions">
<form id="requeue" method="post" action="{base}/events/{id}/requeue">{csrf}{who}<button>Requeue</button></form>
<form id="skip" method="post" action="{base}/events/{id}/skip">{csrf}{who}<button>Skip (stop blocking its key)</button></form>
<form id="supersede" method="post" action="{base}/events/{id}/supersede">{csrf}{who}<label>new payload (JSON) <textarea name="payload" rows="4">{payload}</textarea></label><button>Supersede</button></form></div>"#
        )
    }
}

fn state_detail(state: &EventState) -> String {
    match state {
        EventState::Pending {
            available_at,
            attempts,
        } => {
            format!("(due {available_at}; {attempts} failed attempts so far)")
        }
        EventState::InFlight {
            owner,
            lease_expires_at,
        } => {
            format!("(leased to {owner} until {lease_expires_at})")
        }
        EventState::Published { published_at } => format!("(at {published_at})"),
        EventState::Failed {
            blocks_key,
            superseded_by,
        } => format!(
            "({}{})",
            if *blocks_key {
                "blocks its key"
            } else {
                "does not block its key"
            },
            superseded_by
                .map(|id| format!("; superseded by {id}"))
                .unwrap_or_default()
        ),
    }
}
