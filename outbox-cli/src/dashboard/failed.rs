//! Failed events: a filtered, paged list, and the bulk actions that apply
//! to every event a filter matches (after a count and a confirmation).

use std::fmt::Write;
use std::time::Duration;

use outbox_core::StoreError;
use outbox_core::chrono::Utc;
use outbox_core::store::{FailedCount, FailedEvent, FailedPage, OutboxAdmin};

use super::html::{Frame, age, esc, table, url_value};
use super::http::Request;

/// Failed events one list request reads at most (for filters the store
/// cannot apply: error text, age); the page links on from where it stopped.
const SCAN_AT_MOST: usize = 5_000;
/// Failed events read from the store at a time.
const CHUNK: usize = 500;
/// Rows per page.
const PAGE: usize = 50;

/// What an operator filters failed events by; empty fields match all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// The event type, exactly.
    pub event_type: String,
    /// The partition key, exactly.
    pub key: String,
    /// Text the last error contains (case-insensitive).
    pub error: String,
    /// Failed at least this long ago (`10m`, `2h`).
    pub older_than: String,
}

impl Filter {
    /// The filter a query string or form names.
    pub fn from(fields: &std::collections::HashMap<String, String>) -> Self {
        let get = |name: &str| {
            fields
                .get(name)
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        Self {
            event_type: get("type"),
            key: get("key"),
            error: get("error"),
            older_than: get("older_than"),
        }
    }

    /// The minimum age, if one is set; an error names a bad one.
    pub fn min_age(&self) -> Result<Option<Duration>, String> {
        if self.older_than.is_empty() {
            return Ok(None);
        }
        crate::duration::parse(&self.older_than)
            .map(Some)
            .map_err(|e| format!("older than: {e}"))
    }

    /// The part of the filter the store applies (type and key, from its
    /// failed-events index), after `after`.
    pub fn page(&self, after: Option<i64>, limit: usize) -> FailedPage {
        let mut page = FailedPage::first(limit);
        if !self.event_type.is_empty() {
            page = page.of_type(&self.event_type);
        }
        if !self.key.is_empty() {
            page = page.with_key(&self.key);
        }
        match after {
            Some(sequence) => page.after(sequence),
            None => page,
        }
    }

    /// Whether `failed` matches.
    pub fn matches(&self, failed: &FailedEvent, min_age: Option<Duration>) -> bool {
        let event = &failed.event.event;
        let last = failed.history.last();
        (self.event_type.is_empty() || event.event_type == self.event_type)
            && (self.key.is_empty() || event.partition_key == self.key)
            && (self.error.is_empty()
                || last
                    .is_some_and(|h| h.detail.to_lowercase().contains(&self.error.to_lowercase())))
            && min_age.is_none_or(|min| {
                let failed_at = last.map_or(failed.event.created_at, |h| h.at);
                (Utc::now() - failed_at).to_std().unwrap_or_default() >= min
            })
    }

    /// The filter as hidden form fields (for bulk actions).
    pub fn hidden_fields(&self) -> String {
        self.pairs()
            .map(|(name, value)| {
                format!(
                    r#"<input type="hidden" name="{name}" value="{}">"#,
                    esc(value)
                )
            })
            .collect()
    }

    /// The filter as a query string (for paging links).
    pub fn query(&self) -> String {
        self.pairs()
            .map(|(name, value)| format!("{name}={}&", url_value(value)))
            .collect()
    }

    fn pairs(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("type", self.event_type.as_str()),
            ("key", self.key.as_str()),
            ("error", self.error.as_str()),
            ("older_than", self.older_than.as_str()),
        ]
        .into_iter()
    }

    /// The filter in words, escaped.
    pub fn describe(&self) -> String {
        let parts = self
            .pairs()
            .filter(|(_, v)| !v.is_empty())
            .map(|(n, v)| format!("{n} = {}", esc(v)))
            .collect::<Vec<_>>();
        if parts.is_empty() {
            "every failed event".into()
        } else {
            parts.join(", ")
        }
    }
}

/// What one list request found: up to a page of matches in sequence order,
/// and where the next page starts (if there may be one).
pub struct Found {
    /// The matches, at most a page.
    pub matching: Vec<FailedEvent>,
    /// The sequence to read on from, if the store may hold more.
    pub next_after: Option<i64>,
    /// Failed events read (those the store's filters let through).
    pub read: usize,
}

/// Reads failed events after `after` until a page of them match `filter`,
/// the store has no more, or [`SCAN_AT_MOST`] were read.
pub async fn find(
    admin: &dyn OutboxAdmin,
    filter: &Filter,
    min_age: Option<Duration>,
    after: Option<i64>,
    want: usize,
) -> Result<Found, StoreError> {
    let mut found = Found {
        matching: Vec::new(),
        next_after: None,
        read: 0,
    };
    let mut cursor = after;
    loop {
        let chunk = admin.failed_page(&filter.page(cursor, CHUNK)).await?;
        let complete = chunk.len() < CHUNK;
        for failed in chunk {
            found.read += 1;
            cursor = Some(failed.event.sequence);
            if filter.matches(&failed, min_age) {
                found.matching.push(failed);
                if found.matching.len() == want {
                    found.next_after = cursor;
                    return Ok(found);
                }
            }
        }
        if complete {
            return Ok(found);
        }
        if found.read >= SCAN_AT_MOST {
            found.next_after = cursor;
            return Ok(found);
        }
    }
}

/// The list page's main part.
pub async fn list(
    frame: &Frame<'_>,
    request: &Request,
    admin: &dyn OutboxAdmin,
) -> Result<String, (&'static str, String)> {
    let filter = Filter::from(&request.query);
    let min_age = filter.min_age().map_err(|e| ("400 Bad Request", e))?;
    let after = match request.param("after") {
        "" => None,
        given => Some(given.parse::<i64>().map_err(|_| {
            (
                "400 Bad Request",
                format!("after: {given:?} is not a sequence"),
            )
        })?),
    };
    let found = find(admin, &filter, min_age, after, PAGE)
        .await
        .map_err(|e| {
            (
                "503 Service Unavailable",
                format!("The store could not answer: {e}"),
            )
        })?;
    let matching = &found.matching;
    let base = frame.base;
    let mut out = String::from("<h2>Failed events</h2>");
    let _ = write!(
        out,
        r#"<form id="filters" method="get" action="{base}/failed" class="filters">
<label>type <input name="type" value="{}"></label><label>key <input name="key" value="{}"></label>
<label>error contains <input name="error" value="{}"></label><label>failed more than <input name="older_than" placeholder="10m" value="{}"> ago</label>
<button>Filter</button></form>"#,
        esc(&filter.event_type),
        esc(&filter.key),
        esc(&filter.error),
        esc(&filter.older_than)
    );
    let _ = write!(
        out,
        r#"<p id="matching" data-count="{}">{} shown ({}), oldest first; {} failed events read."#,
        matching.len(),
        matching.len(),
        filter.describe(),
        found.read
    );
    out.push_str("</p>");
    let now = Utc::now();
    let rows = matching
        .iter()
        .map(|f| {
            let event = &f.event.event;
            let last = f.history.last();
            vec![
                format!(
                    r#"<a href="{base}/events/{id}">{id}</a>"#,
                    id = event.event_id
                ),
                esc(&event.event_type),
                esc(&event.partition_key),
                f.event.attempts.to_string(),
                last.map_or_else(String::new, |h| {
                    format!(
                        "{} ago",
                        age(((now - h.at).num_milliseconds().max(0) as f64) / 1000.0)
                    )
                }),
                format!(
                    r#"<span class="error">{}</span>"#,
                    esc(last.map_or("", |h| h.detail.as_str()))
                ),
                if f.blocks_key {
                    "blocks its key".into()
                } else {
                    String::new()
                },
            ]
        })
        .collect::<Vec<_>>();
    out.push_str(&table(
        "failed",
        &[
            "event",
            "type",
            "key",
            "attempts",
            "failed",
            "last error",
            "",
        ],
        &rows,
    ));
    let query = filter.query();
    if after.is_some() {
        let _ = write!(out, r#"<a href="{base}/failed?{query}">« first page</a> "#);
    }
    if let Some(next) = found.next_after {
        let _ = write!(
            out,
            r#"<a id="next-page" href="{base}/failed?{query}after={next}">next page »</a>"#
        );
    }
    if frame.signed_in && !matching.is_empty() {
        let _ = write!(
            out,
            r#"<h3>Act on every event this filter matches</h3><form id="bulk" method="post" action="{base}/failed/bulk">{csrf}{hidden}
<label>operator <input name="operator" required></label><label>reason <input name="reason" required></label>
<button name="action" value="requeue">Requeue all matching…</button><button name="action" value="skip">Skip all matching…</button></form>"#,
            csrf = frame.csrf_field(),
            hidden = filter.hidden_fields(),
        );
    }
    Ok(out)
}

/// The confirmation a bulk action shows first: what it will do to how
/// many, up to which sequence (what it then acts within).
pub fn confirm(
    frame: &Frame<'_>,
    filter: &Filter,
    action: super::bulk::Action,
    counted: FailedCount,
    request: &Request,
) -> String {
    let (base, query) = (frame.base, filter.query());
    let count = counted.count;
    let Some(through) = counted.last_sequence else {
        return format!(
            r#"<h2>Nothing to do</h2><p id="confirm-count" data-count="0">No failed event matches {}.</p><p><a href="{base}/failed?{query}">Back</a></p>"#,
            filter.describe()
        );
    };
    format!(
        r#"<h2>Confirm</h2><p id="confirm-count" data-count="{count}">{} {count} failed events matching {}?</p>
<p>Events that fail after this count are left alone. The action runs in the background; its page shows how far it got.</p>
<form id="confirm" method="post" action="{base}/failed/bulk">{csrf}{hidden}<input type="hidden" name="action" value="{action}">
<input type="hidden" name="operator" value="{operator}"><input type="hidden" name="reason" value="{reason}"><input type="hidden" name="count" value="{count}"><input type="hidden" name="through" value="{through}">
<button name="confirm" value="yes">Yes, {action} {count}</button> <a href="{base}/failed?{query}">Cancel</a></form>"#,
        action.title(),
        filter.describe(),
        csrf = frame.csrf_field(),
        hidden = filter.hidden_fields(),
        action = action.name(),
        operator = esc(request.field("operator")),
        reason = esc(request.field("reason")),
    )
}
