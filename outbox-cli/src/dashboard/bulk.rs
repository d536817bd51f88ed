//! Bulk actions by filter. Counted first (by the store from its
//! failed-events indexes, or by reading them where the filter names error
//! text or an age), confirmed, then run in the background a chunk at a
//! time, only on events up to the newest one counted: an event that fails
//! after the operator confirmed is not swept up unseen. Each chunk is one
//! `requeue_each`/`skip_each` (set-based on PostgreSQL). A job's page shows
//! how far it got and refreshes itself until it is done.

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use outbox_core::store::{FailedCount, FailedEvent, OperatorAction, OutboxAdmin};

use super::failed::{self, Filter};
use super::html::esc;
use crate::store::Store;

/// Finished jobs kept for their pages.
const KEPT: usize = 20;
/// Errors a job lists (it counts them all).
const ERRORS_LISTED: usize = 20;

/// What a bulk action does to each event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Back to pending, a fresh attempt budget.
    Requeue,
    /// Stays failed; its key no longer blocked.
    Skip,
}

impl Action {
    /// The action a form names.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "requeue" => Some(Self::Requeue),
            "skip" => Some(Self::Skip),
            _ => None,
        }
    }

    /// Its name in forms and pages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Requeue => "requeue",
            Self::Skip => "skip",
        }
    }

    /// Its name at the start of a sentence.
    pub fn title(self) -> &'static str {
        match self {
            Self::Requeue => "Requeue",
            Self::Skip => "Skip",
        }
    }
}

/// How many failed events `filter` matches now (not superseded), and the
/// newest one's sequence.
pub async fn count(admin: &dyn OutboxAdmin, filter: &Filter) -> Result<FailedCount, String> {
    let min_age = filter.min_age()?;
    if filter.error.is_empty() && min_age.is_none() {
        let page = filter.page(None, 0);
        return admin.count_failed(&page).await.map_err(|e| e.to_string());
    }
    let mut counted = FailedCount::default();
    each_chunk(admin, filter, i64::MAX, |chunk| {
        counted.count += chunk.len() as u64;
        if let Some(last) = chunk.last() {
            counted.last_sequence = Some(last.event.sequence);
        }
        async { Ok(()) }
    })
    .await?;
    Ok(counted)
}

/// Calls `act` on the failed events `filter` matches, not superseded, up
/// to sequence `through`, in sequence order, a chunk of the store's at a
/// time (never the whole list in memory); stops at `act`'s first error.
async fn each_chunk<F, Fut>(
    admin: &dyn OutboxAdmin,
    filter: &Filter,
    through: i64,
    mut act: F,
) -> Result<(), String>
where
    F: FnMut(Vec<&FailedEvent>) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let min_age = filter.min_age()?;
    let mut after = None;
    loop {
        let found = failed::find(admin, filter, min_age, after, usize::MAX)
            .await
            .map_err(|e| e.to_string())?;
        let chunk = found
            .matching
            .iter()
            .filter(|f| f.event.sequence <= through && f.superseded_by.is_none())
            .collect::<Vec<_>>();
        if !chunk.is_empty() {
            act(chunk).await?;
        }
        match found.next_after {
            Some(next) if next < through => after = Some(next),
            _ => return Ok(()),
        }
    }
}

/// One bulk action, running or done.
pub struct Job {
    /// Its number, in its page's address.
    pub id: u64,
    action: Action,
    described: String,
    counted: u64,
    operator: String,
    started: Instant,
    progress: Mutex<Progress>,
}

#[derive(Default)]
struct Progress {
    done: u64,
    refused: u64,
    errors: Vec<String>,
    finished: Option<std::time::Duration>,
    stopped_by: Option<String>,
}

impl Job {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its page's main part: refreshed in place (`#live`) until it is done.
    pub fn render(&self, base: &str) -> String {
        let p = self.progress();
        let state = if p.finished.is_some() {
            "finished"
        } else {
            "running"
        };
        let mut out = format!(
            r#"<h2>Bulk {action} #{id}</h2><p>{action} of the {counted} failed events matching {described} (counted before the confirmation), by {operator}.</p>"#,
            action = self.action.name(),
            id = self.id,
            counted = self.counted,
            described = self.described,
            operator = esc(&self.operator),
        );
        let refresh = if p.finished.is_some() {
            String::new()
        } else {
            r#" data-refresh-seconds="1""#.into()
        };
        let _ = write!(
            out,
            r#"<div id="live"{refresh}><p id="bulk-progress" data-state="{state}" data-done="{done}" data-refused="{refused}">{state}: {done} done, {refused} refused, {elapsed:.1} s"#,
            done = p.done,
            refused = p.refused,
            elapsed = p.finished.unwrap_or(self.started.elapsed()).as_secs_f64(),
        );
        if let Some(reason) = &p.stopped_by {
            let _ = write!(
                out,
                r#"; stopped: <span class="bad">{}</span>"#,
                esc(reason)
            );
        }
        out.push_str("</p>");
        for error in &p.errors {
            let _ = write!(out, r#"<p class="bad">{}</p>"#, esc(error));
        }
        if p.refused as usize > p.errors.len() {
            let _ = write!(
                out,
                "<p>… and {} more refusals.</p>",
                p.refused as usize - p.errors.len()
            );
        }
        let _ = write!(
            out,
            r#"</div><p><a href="{base}/failed">Back to failed events</a></p>"#
        );
        out
    }
}

/// The jobs started by this dashboard: the running ones and the last
/// [`KEPT`] finished.
#[derive(Default)]
pub struct Jobs {
    next_id: AtomicU64,
    jobs: Mutex<VecDeque<Arc<Job>>>,
}

/// A confirmed bulk action, ready to start.
pub struct Confirmed {
    /// What it does.
    pub action: Action,
    /// What it applies to.
    pub filter: Filter,
    /// The newest sequence counted: nothing after it is touched.
    pub through: i64,
    /// How many were counted.
    pub counted: u64,
    /// Who and why.
    pub operator: OperatorAction,
}

impl Jobs {
    /// Starts `confirmed` on `store` in the background; its job.
    pub fn start(&self, store: Store, confirmed: Confirmed) -> Arc<Job> {
        let job = Arc::new(Job {
            id: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            action: confirmed.action,
            described: confirmed.filter.describe(),
            counted: confirmed.counted,
            operator: confirmed.operator.operator.clone(),
            started: Instant::now(),
            progress: Mutex::default(),
        });
        {
            let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.push_back(job.clone());
            while jobs.len() > KEPT {
                let Some(oldest) = jobs.front() else { break };
                if oldest.progress().finished.is_none() {
                    break;
                }
                jobs.pop_front();
            }
        }
        let running = job.clone();
        tokio::spawn(async move {
            let admin = store.admin();
            let Confirmed {
                action,
                filter,
                through,
                operator,
                ..
            } = confirmed;
            let result = each_chunk(admin, &filter, through, |chunk| {
                let ids = chunk
                    .iter()
                    .map(|f| f.event.event.event_id)
                    .collect::<Vec<_>>();
                let (running, operator) = (&running, &operator);
                async move {
                    let acted = match action {
                        Action::Requeue => admin.requeue_each(&ids, operator).await,
                        Action::Skip => admin.skip_each(&ids, operator).await,
                    };
                    let acted = acted
                        .map_err(|e| e.to_string())?
                        .into_iter()
                        .collect::<std::collections::HashSet<_>>();
                    let mut p = running.progress();
                    p.done += acted.len() as u64;
                    for id in ids.iter().filter(|id| !acted.contains(id)) {
                        p.refused += 1;
                        if p.errors.len() < ERRORS_LISTED {
                            p.errors
                                .push(format!("{id}: no longer failed (acted on meanwhile?)"));
                        }
                    }
                    Ok(())
                }
            })
            .await;
            let mut p = running.progress();
            p.stopped_by = result.err();
            p.finished = Some(running.started.elapsed());
        });
        job
    }

    /// Job `id`, if it is kept.
    pub fn get(&self, id: u64) -> Option<Arc<Job>> {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter().find(|job| job.id == id).cloned()
    }
}
