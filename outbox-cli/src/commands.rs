//! Each command, against the store the URL names.

use std::io::IsTerminal;

use outbox_core::store::{FailedEvent, OperatorAction};
use outbox_core::{EventId, NewEvent};
use serde_json::{Value, json};

use crate::args::{Cli, Command, FailedAction, Output, Repair};
use crate::error::CliError;
use crate::render;
use crate::store::{Store, Tables};

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let tables = Tables {
        schema: cli.schema.clone(),
        prefix: cli.prefix.clone(),
    };
    if let Command::Relay { config } = &cli.command {
        return crate::daemon::run(cli.url.as_deref(), &tables, config.as_deref()).await;
    }
    if let Command::DeadLetters {
        broker,
        source,
        suffix,
        action,
    } = cli.command
    {
        let dead_letters =
            crate::dead_letters::DeadLetters::open(&broker, &source, suffix.as_deref()).await?;
        return dead_letters.run(action, cli.output).await;
    }
    let Some(url) = cli.url.as_deref() else {
        return Err(CliError::usage(
            "no store URL: pass --url or set OUTBOX_URL",
        ));
    };
    let create = matches!(cli.command, Command::Migrate);
    let store = Store::open(url, &tables, create, 2).await?;
    match cli.command {
        Command::Migrate => migrate(&store, cli.output).await,
        Command::Status {
            all_tenants: Some(pattern),
            ..
        } => {
            let which = crate::tenants::Which::SchemasLike(pattern);
            crate::tenants::status(&store, &tables, which, cli.output).await
        }
        Command::Status {
            tenant_urls: Some(query),
            ..
        } => {
            let which = crate::tenants::Which::Urls(query);
            crate::tenants::status(&store, &tables, which, cli.output).await
        }
        Command::Status { .. } => status(&store, cli.output).await,
        Command::Failed { action } => failed(&store, action, cli.output).await,
        Command::Requeue(repair) => {
            let action = operator_action(&repair)?;
            store.admin().requeue(repair.id, &action).await?;
            println!("requeued {}", repair.id);
            Ok(())
        }
        Command::Skip(repair) => {
            let action = operator_action(&repair)?;
            store.admin().skip(repair.id, &action).await?;
            println!("skipped {}: its key flows again", repair.id);
            Ok(())
        }
        Command::Supersede { repair, payload } => supersede(&store, &repair, &payload).await,
        Command::Purge {
            older_than,
            batch_size,
            inbox,
        } => purge(&store, older_than, batch_size as usize, inbox).await,
        Command::Dashboard {
            listen,
            token,
            sample_every,
        } => dashboard(store, &listen, token, sample_every).await,
        Command::Relay { .. } | Command::DeadLetters { .. } => unreachable!("handled above"),
        Command::Health {
            max_age,
            relay_timeout,
            allow_blocked,
        } => health(&store, max_age, relay_timeout, allow_blocked, cli.output).await,
    }
}

fn operator_action(repair: &Repair) -> Result<OperatorAction, CliError> {
    if repair.reason.trim().is_empty() || repair.operator.trim().is_empty() {
        return Err(CliError::usage(
            "--reason and --operator must not be empty (they are kept in the event's history)",
        ));
    }
    Ok(OperatorAction::new(&repair.operator, &repair.reason))
}

/// Serves the dashboard until SIGTERM/SIGINT; says where on stdout.
async fn dashboard(
    store: Store,
    listen: &str,
    token: Option<String>,
    sample_every: std::time::Duration,
) -> Result<(), CliError> {
    if token.as_deref().is_some_and(|t| t.len() < 16) {
        return Err(CliError::usage(
            "the dashboard token must be at least 16 characters long",
        ));
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| CliError::usage(format!("--listen {listen}: {e}")))?;
    let address = listener
        .local_addr()
        .map_err(|e| CliError::failure(format!("--listen {listen}: {e}")))?;
    let settings = crate::dashboard::Settings {
        base: String::new(),
        token,
        sample_every,
        loopback_only: address.ip().is_loopback(),
        tenant: None,
    };
    let read_only = if settings.token.is_none() {
        " (read-only: no token)"
    } else {
        ""
    };
    println!("dashboard on http://{address}/{read_only}");
    let dashboard = crate::dashboard::Dashboard::start(store, settings);
    let stop = outbox_core::CancellationToken::new();
    tokio::spawn(crate::daemon::stop_on_signal(stop.clone()));
    tokio::select! {
        () = dashboard.serve(listener) => Ok(()),
        () = stop.cancelled() => Ok(()),
    }
}

/// Creates or updates the tables and says which schema version it found
/// and left; tables of another version are refused, untouched.
async fn migrate(store: &Store, output: Output) -> Result<(), CliError> {
    let migrated = store.migrate().await?;
    if output == Output::Json {
        println!(
            "{}",
            json!({
                "store": store.kind(),
                "schema_version": migrated.version,
                "found": migrated.found,
                "created": migrated.created(),
            })
        );
    } else if migrated.created() {
        println!(
            "{} outbox tables created at schema version {}",
            store.kind(),
            migrated.version
        );
    } else {
        println!(
            "{} outbox tables at schema version {}: already current",
            store.kind(),
            migrated.version
        );
    }
    Ok(())
}

/// The tables' schema version; a store without outbox tables is a
/// one-line failure that names the fix.
async fn migrated_version(store: &Store) -> Result<i32, CliError> {
    store.schema_version().await?.ok_or_else(|| {
        CliError::failure(format!(
            "no outbox tables in this {} store: not migrated (run \"outbox migrate\")",
            store.kind()
        ))
    })
}

async fn status(store: &Store, output: Output) -> Result<(), CliError> {
    let schema_version = migrated_version(store).await?;
    let admin = store.admin();
    let stats = admin.stats().await?;
    let held_back = admin.held_back().await?;
    let blocked = admin.blocked_keys().await?;
    let relays = admin.relays().await?;
    let now = chrono::Utc::now();
    let held_back_lines = render::held_back_lines(&held_back, &relays, now);
    let document = json!({
        "schema_version": schema_version,
        "event_types": stats.iter().map(render::stats).collect::<Vec<_>>(),
        "held_back": held_back_lines,
        "blocked_keys": blocked.iter().map(render::blocked_key).collect::<Vec<_>>(),
        "relays": relays.iter().map(|r| render::relay(r, now)).collect::<Vec<_>>(),
    });
    if output == Output::Json {
        println!("{document}");
        return Ok(());
    }
    println!("{} outbox, schema version {schema_version}\n", store.kind());
    println!(
        "{:<32} {:>10} {:>12} {:>8} {:>8} {:>10} {:>8}",
        "event type", "claimable", "oldest (s)", "parked", "blocked", "in flight", "failed"
    );
    for s in &stats {
        let oldest = s
            .oldest_claimable_age
            .map(|a| format!("{:.1}", a.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<32} {:>10} {:>12} {:>8} {:>8} {:>10} {:>8}",
            s.event_type, s.claimable, oldest, s.parked, s.blocked, s.in_flight, s.failed
        );
    }
    if stats.is_empty() {
        println!("(no events)");
    }
    println!();
    if held_back_lines.is_empty() {
        println!("held back: nothing");
    }
    for cause in &document["held_back"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        println!(
            "held back: {}",
            cause["detail"].as_str().unwrap_or_default()
        );
    }
    for key in &blocked {
        println!(
            "blocked key {:?}: behind failed event {} ({} waiting)",
            key.partition_key, key.blocking_event_id, key.backlog
        );
    }
    if relays.is_empty() {
        println!("relays: none has reported");
    }
    for relay in &relays {
        let paused = relay
            .outage
            .as_ref()
            .map(|o| {
                format!(
                    "; PAUSED since {}: publishing to {}: {}",
                    o.since.format("%Y-%m-%d %H:%M:%S UTC"),
                    o.destination,
                    o.reason
                )
            })
            .unwrap_or_default();
        println!(
            "relay {}: last seen {} ({:.1} s ago; clock skew {} ms){paused}",
            relay.relay,
            relay.last_seen,
            render::silent_for(relay, now),
            relay.clock_skew.num_milliseconds()
        );
    }
    Ok(())
}

async fn failed(store: &Store, action: FailedAction, output: Output) -> Result<(), CliError> {
    match action {
        FailedAction::List { limit } => {
            let failed = store.admin().failed_events(limit).await?;
            if output == Output::Json {
                let list: Vec<Value> = failed
                    .iter()
                    .map(|f| render::failed(f, render::Detail::Summary))
                    .collect();
                println!("{}", Value::Array(list));
                return Ok(());
            }
            if failed.is_empty() {
                println!("no failed events");
            }
            for f in &failed {
                println!(
                    "{}  {}  key {:?}  {} attempts{}  {}",
                    f.event.event.event_id,
                    f.event.event.event_type,
                    f.event.event.partition_key,
                    f.event.attempts,
                    if f.blocks_key { "  BLOCKS KEY" } else { "" },
                    f.history.last().map(|h| h.detail.as_str()).unwrap_or("")
                );
            }
            Ok(())
        }
        FailedAction::Show { id, payload } => {
            let found = find_failed(store, id).await?;
            let detail = if payload {
                render::Detail::WithPayload
            } else {
                render::Detail::Metadata
            };
            if output == Output::Json {
                println!("{}", render::failed(&found, detail));
            } else {
                print!("{}", render::failed_text(&found, detail));
            }
            Ok(())
        }
    }
}

/// The failed event `id`, or an error saying where it stands instead.
pub async fn find_failed(store: &Store, id: EventId) -> Result<FailedEvent, CliError> {
    if let Some(found) = store.admin().failed_event(id).await? {
        return Ok(found);
    }
    match store.admin().event_state(id).await? {
        None => Err(CliError::failure(format!("no event {id}"))),
        Some(state) => Err(CliError::failure(format!(
            "event {id} has not failed: {state:?}"
        ))),
    }
}

/// A new event that can supersede `failed`: the same type, aggregate, key,
/// payload version and headers, a new id, `payload`.
pub fn replacement_of(failed: &FailedEvent, payload: &Value) -> Result<NewEvent, CliError> {
    let old = &failed.event.event;
    NewEvent::builder(&old.event_type, &old.aggregate_type, &old.aggregate_id)
        .event_id(EventId::random())
        .partition_key(&old.partition_key)
        .payload(payload)
        .payload_version(old.payload_version)
        .headers(old.headers.clone())
        .build()
        .map_err(|e| CliError::usage(format!("the replacement is not a valid event: {e}")))
}

async fn supersede(store: &Store, repair: &Repair, payload: &str) -> Result<(), CliError> {
    let action = operator_action(repair)?;
    let payload: Value = serde_json::from_str(payload)
        .map_err(|e| CliError::usage(format!("--payload is not JSON: {e}")))?;
    let failed = find_failed(store, repair.id).await?;
    let replacement = replacement_of(&failed, &payload)?;
    let new_id = replacement.event_id;
    store
        .admin()
        .supersede(repair.id, replacement, &action)
        .await?;
    println!("superseded {} by {new_id}", repair.id);
    Ok(())
}

async fn purge(
    store: &Store,
    older_than: std::time::Duration,
    batch_size: usize,
    inbox: bool,
) -> Result<(), CliError> {
    let progress = std::io::stderr().is_terminal();
    in_batches("published events", batch_size, progress, async || {
        store.admin().purge_published(older_than, batch_size).await
    })
    .await?;
    if inbox {
        in_batches("inbox claims", batch_size, progress, async || {
            store.purge_inbox(older_than, batch_size).await
        })
        .await?;
    }
    Ok(())
}

/// Calls `purge` until it deletes fewer than `batch_size` rows, showing a
/// running count on a terminal and printing the total.
async fn in_batches(
    what: &str,
    batch_size: usize,
    progress: bool,
    mut purge: impl AsyncFnMut() -> Result<u64, outbox_core::StoreError>,
) -> Result<(), CliError> {
    let mut total = 0u64;
    loop {
        let deleted = purge().await?;
        total += deleted;
        if progress {
            eprint!("\rpurged {total} {what}");
        }
        if deleted < batch_size as u64 {
            break;
        }
    }
    if progress {
        eprintln!();
    }
    println!("purged {total} {what}");
    Ok(())
}

/// Healthy, or the first reason it is not (all reasons in JSON).
async fn health(
    store: &Store,
    max_age: std::time::Duration,
    relay_timeout: std::time::Duration,
    allow_blocked: bool,
    output: Output,
) -> Result<(), CliError> {
    migrated_version(store).await?;
    let admin = store.admin();
    let stats = admin
        .stats()
        .await
        .map_err(|e| CliError::failure(format!("store not usable: {e}")))?;
    let mut problems = Vec::new();
    for s in &stats {
        if let Some(age) = s.oldest_claimable_age.filter(|age| *age > max_age) {
            problems.push(format!(
                "{} {} events claimable, the oldest for {:.0} s (limit {} s)",
                s.claimable,
                s.event_type,
                age.as_secs_f64(),
                max_age.as_secs()
            ));
        }
    }
    let backlog: u64 = stats.iter().map(|s| s.claimable + s.in_flight).sum();
    let relays = admin.relays().await?;
    // Heartbeats are on store time; this compares them with this host's
    // clock, so a host minutes off skews the verdict by as much.
    let now = chrono::Utc::now();
    let live = relays
        .iter()
        .any(|r| render::silent_for(r, now) <= relay_timeout.as_secs_f64());
    if backlog > 0 && !live {
        problems.push(format!(
            "{backlog} events wait and no relay reported within {} s",
            relay_timeout.as_secs()
        ));
    }
    let blocked = admin.blocked_keys().await?;
    if !blocked.is_empty() && !allow_blocked {
        problems.push(format!(
            "{} keys blocked by failed events (first: {:?} behind {})",
            blocked.len(),
            blocked[0].partition_key,
            blocked[0].blocking_event_id
        ));
    }
    // A paused relay is working as designed (events are safe and wait, no
    // attempt is burned): degraded, with an exit status of its own, unless
    // something else also needs an operator.
    let degraded: Vec<String> = render::outages(&relays, now, relay_timeout.as_secs_f64())
        .iter()
        .map(|o| o["detail"].as_str().unwrap_or_default().to_owned())
        .collect();
    if output == Output::Json {
        println!(
            "{}",
            json!({
                "healthy": problems.is_empty() && degraded.is_empty(),
                "degraded": !degraded.is_empty(),
                "problems": problems,
                "outages": degraded,
            })
        );
    }
    match (problems.first(), degraded.first()) {
        (None, None) => {
            if output == Output::Text {
                println!("healthy");
            }
            Ok(())
        }
        (None, Some(outage)) => Err(CliError::degraded(format!("degraded: {outage}"))),
        (Some(first), None) => Err(CliError::failure(format!("unhealthy: {first}"))),
        (Some(first), Some(outage)) => Err(CliError::failure(format!(
            "unhealthy: {first}; degraded: {outage}"
        ))),
    }
}
