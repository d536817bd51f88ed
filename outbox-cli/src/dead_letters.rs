//! `outbox dead-letters`: a consumer's dead letters on Redis, Kafka or SQS,
//! through each adapter's own reader, printed as one model
//! ([`outbox_core::dead_letter::DeadLetter`]).

use std::time::Duration;

use outbox_core::dead_letter::{DeadLetter, DeadLetterQueue, check_attribution};
use outbox_kafka::KafkaDeadLetters;
use outbox_redis::RedisDeadLetters;
use outbox_sns::SqsDeadLetters;
use serde_json::{Value, json};

use crate::args::{DeadLetterAction, Output};
use crate::daemon::redacted;
use crate::error::CliError;

/// The dead letters of one source, on its broker.
pub enum DeadLetters {
    Redis(RedisDeadLetters),
    Kafka(KafkaDeadLetters),
    Sqs(SqsDeadLetters),
}

impl DeadLetters {
    /// Connects to `broker` (see the command's help) for `source`'s dead
    /// letters.
    pub async fn open(broker: &str, source: &str, suffix: Option<&str>) -> Result<Self, CliError> {
        if source.trim().is_empty() {
            return Err(CliError::usage(
                "--source must name a stream, topic or queue",
            ));
        }
        if broker.starts_with("redis://") || broker.starts_with("rediss://") {
            let client = outbox_redis::redis::Client::open(broker)
                .map_err(|e| CliError::usage(format!("--broker: {e}")))?;
            let connection =
                tokio::time::timeout(Duration::from_secs(10), client.get_connection_manager())
                    .await
                    .map_err(|_| {
                        CliError::failure(format!("cannot reach Redis at {}", redacted(broker)))
                    })?
                    .map_err(|e| CliError::failure(format!("cannot reach Redis: {e}")))?;
            return Ok(Self::Redis(RedisDeadLetters::new(
                connection,
                source,
                suffix.unwrap_or(":dead"),
            )));
        }
        if let Some(bootstrap) = broker.strip_prefix("kafka://") {
            if bootstrap.is_empty() {
                return Err(CliError::usage("--broker kafka:// needs HOST:PORT"));
            }
            return Ok(Self::Kafka(KafkaDeadLetters::new(
                bootstrap.trim_end_matches('/'),
                source,
                suffix.unwrap_or(".dlq"),
            )));
        }
        if broker == "sqs" || broker == "sqs://" {
            if suffix.is_some() {
                return Err(CliError::usage(
                    "--suffix is for Redis and Kafka; on SQS --source is the dead-letter queue's URL",
                ));
            }
            let config = crate::aws::sdk_config("--broker sqs", "SQS", None, None)?;
            let client = outbox_sns::aws_sdk_sqs::Client::new(&config);
            return Ok(Self::Sqs(SqsDeadLetters::new(client, source)));
        }
        Err(CliError::usage(format!(
            "--broker {}: expected redis://…, kafka://HOST:PORT or sqs",
            redacted(broker)
        )))
    }

    /// Runs `action` and prints its answer.
    pub async fn run(&self, action: DeadLetterAction, output: Output) -> Result<(), CliError> {
        match self {
            Self::Redis(queue) => run_on(queue, action, output).await,
            Self::Kafka(queue) => run_on(queue, action, output).await,
            Self::Sqs(_) if matches!(&action, DeadLetterAction::List { after: Some(_), .. }) => {
                Err(CliError::usage(
                    "--after: SQS has no order to page by; raise --limit instead",
                ))
            }
            Self::Sqs(queue) => run_on(queue, action, output).await,
        }
    }
}

/// Runs `action` on `queue` and prints its answer.
async fn run_on<Q: DeadLetterQueue>(
    queue: &Q,
    action: DeadLetterAction,
    output: Output,
) -> Result<(), CliError> {
    let failed = |error: Q::Error| CliError::failure(error);
    match action {
        DeadLetterAction::List { limit, after } => {
            let listed = queue.list(after.as_deref(), limit).await.map_err(failed)?;
            if output == Output::Json {
                let list: Vec<Value> = listed.iter().map(|d| json_of(d, false)).collect();
                println!("{}", Value::Array(list));
                return Ok(());
            }
            if listed.is_empty() {
                println!("no dead letters in {}", queue.location());
            }
            for dead in &listed {
                println!("{}", summary_line(dead));
            }
            Ok(())
        }
        DeadLetterAction::Show { id, payload } => {
            let Some(dead) = queue.get(&id).await.map_err(failed)? else {
                return Err(CliError::failure(format!(
                    "no dead letter {id} in {}",
                    queue.location()
                )));
            };
            if output == Output::Json {
                println!("{}", json_of(&dead, payload));
            } else {
                print!("{}", detail_text(&dead, payload));
            }
            Ok(())
        }
        DeadLetterAction::Replay {
            id,
            reason,
            operator,
        } => {
            // A missing attribution is the command line's fault, asked
            // before the broker is.
            check_attribution(&operator, &reason).map_err(CliError::usage)?;
            let replay = queue
                .replay(&id, &operator, &reason)
                .await
                .map_err(failed)?;
            if output == Output::Json {
                println!("{}", json!({"id": id, "replay": replay}));
            } else {
                println!(
                    "replayed {id} as {} by {} ({})",
                    replay.new_id, replay.operator, replay.reason
                );
            }
            Ok(())
        }
    }
}

fn json_of(dead: &DeadLetter, payload: bool) -> Value {
    let mut value = serde_json::to_value(dead).expect("a dead letter serializes");
    if payload {
        value["payload"] = Value::String(String::from_utf8_lossy(&dead.payload).into_owned());
    }
    value
}

fn summary_line(dead: &DeadLetter) -> String {
    let at = dead.dead_lettered_at.map_or_else(
        || "-".to_owned(),
        |t| t.format("%Y-%m-%d %H:%M:%S").to_string(),
    );
    let replayed = dead.replayed.as_ref().map_or_else(String::new, |r| {
        format!(
            "  REPLAYED by {} at {}",
            r.operator,
            r.at.format("%Y-%m-%d %H:%M:%S")
        )
    });
    format!(
        "{}  {at}  {}  key {:?}  event {}  {}{replayed}",
        dead.id,
        dead.event_type
            .as_deref()
            .unwrap_or("(not an outbox event)"),
        dead.partition_key.as_deref().unwrap_or(""),
        dead.event_id.as_deref().unwrap_or("-"),
        first_line(&dead.error),
    )
}

fn detail_text(dead: &DeadLetter, payload: bool) -> String {
    let mut text = String::new();
    let mut line = |name: &str, value: &str| text.push_str(&format!("{name:<17} {value}\n"));
    line("dead letter", &dead.id);
    line("source", &dead.source);
    line("error", &dead.error);
    if let Some(n) = dead.deliveries {
        line("deliveries", &n.to_string());
    }
    if let Some(at) = dead.dead_lettered_at {
        line("dead-lettered at", &at.to_rfc3339());
    }
    line("event id", dead.event_id.as_deref().unwrap_or("-"));
    line("event type", dead.event_type.as_deref().unwrap_or("-"));
    line(
        "partition key",
        dead.partition_key.as_deref().unwrap_or("-"),
    );
    match &dead.replayed {
        Some(r) => line(
            "replayed",
            &format!(
                "by {} at {} as {}: {}",
                r.operator,
                r.at.to_rfc3339(),
                r.new_id,
                r.reason
            ),
        ),
        None => line("replayed", "no"),
    }
    for (name, value) in &dead.headers {
        line(&format!("header {name}"), value);
    }
    if payload {
        line("payload", &String::from_utf8_lossy(&dead.payload));
    } else {
        line(
            "payload",
            &format!("{} bytes (--payload prints it)", dead.payload.len()),
        );
    }
    text
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or("")
}
