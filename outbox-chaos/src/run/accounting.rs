//! What a chaos or soak run adds up at its end: every committed event
//! found (or not) at the broker and in the consumer's effects, with the
//! duplicates and order violations.

use super::*;

pub(crate) struct Accounting {
    pub(crate) published_distinct: usize,
    pub(crate) broker_duplicates: usize,
    pub(crate) applied_distinct: usize,
    pub(crate) applied_twice: usize,
    pub(crate) lost: usize,
    pub(crate) order_violations: usize,
    pub(crate) failed_or_parked: u64,
}

impl Accounting {
    /// The rows every run prints: what reached the broker and the handler.
    pub(crate) fn print_delivery_rows(&self) {
        println!(
            "| published (distinct at the broker) | {} |",
            self.published_distinct
        );
        println!("| duplicates at the broker | {} |", self.broker_duplicates);
        println!("| applied once | {} |", self.applied_distinct);
        println!("| applied twice or more | {} |", self.applied_twice);
        println!("| lost (committed, never applied) | {} |", self.lost);
        println!(
            "| per-key order violations at the handler | {} |",
            self.order_violations
        );
        println!("| failed or parked | {} |", self.failed_or_parked);
    }
}

pub(crate) async fn account(
    pool: &sqlx::PgPool,
    store: &PgStore,
    broker: &mut Broker,
    committed: &Committed,
) -> Result<Accounting, Error> {
    let (published_distinct, broker_entries) = broker.census().await?;

    // The handler: effects in commit order.
    let rows = sqlx::query(&format!(
        "SELECT partition_key, event_id FROM {EFFECTS} ORDER BY seq"
    ))
    .fetch_all(pool)
    .await?;
    let mut applied: HashMap<String, Vec<uuid::Uuid>> = HashMap::new();
    let mut distinct = HashSet::new();
    for row in &rows {
        let key: String = row.get(0);
        let id: uuid::Uuid = row.get(1);
        distinct.insert(id);
        applied.entry(key).or_default().push(id);
    }
    let mut lost = 0;
    let mut violations = 0;
    for (key, sent) in &committed.by_key {
        let position: HashMap<uuid::Uuid, usize> = sent
            .iter()
            .enumerate()
            .map(|(i, id)| (*id.as_uuid(), i))
            .collect();
        lost += sent
            .iter()
            .filter(|id| !distinct.contains(id.as_uuid()))
            .count();
        let mut highest: Option<usize> = None;
        for id in applied.get(key).into_iter().flatten() {
            let Some(&at) = position.get(id) else {
                continue;
            };
            if highest.is_some_and(|h| at < h) {
                violations += 1;
            }
            highest = Some(highest.map_or(at, |h| h.max(at)));
        }
    }
    let failed_or_parked = store
        .stats()
        .await?
        .iter()
        .map(|s| s.failed + s.parked)
        .sum();
    Ok(Accounting {
        published_distinct,
        broker_duplicates: broker_entries - published_distinct,
        applied_distinct: distinct.len(),
        applied_twice: rows.len() - distinct.len(),
        lost,
        order_violations: violations,
        failed_or_parked,
    })
}

/// Every entry of the stream: (distinct event ids, entries).
pub(super) async fn redis_census(redis: &mut PrivateRedis) -> Result<(usize, usize), Error> {
    let mut seen = HashSet::new();
    let mut entries = 0usize;
    every_stream_entry(&redis.url(), |entry| {
        entries += 1;
        if let Some(id) = entry.get::<String>("event_id") {
            seen.insert(id);
        }
    })
    .await?;
    Ok((seen.len(), entries))
}

/// Reads the whole stream, oldest first, in pages, handing `each` every
/// entry once.
pub(crate) async fn every_stream_entry(
    url: &str,
    mut each: impl FnMut(&redis::streams::StreamId),
) -> Result<(), Error> {
    let client = redis::Client::open(url)?;
    let mut connection = client.get_multiplexed_async_connection().await?;
    let mut from = "-".to_owned();
    loop {
        let reply: redis::streams::StreamRangeReply =
            connection.xrange_count(STREAM, &from, "+", 5_000).await?;
        let fresh: Vec<_> = reply.ids.into_iter().filter(|e| e.id != from).collect();
        let Some(last) = fresh.last() else {
            return Ok(());
        };
        fresh.iter().for_each(&mut each);
        from = last.id.clone();
    }
}

/// Every message of the topic, read from the beginning of each partition
/// up to its high watermark: (distinct event ids, messages).
pub(super) async fn kafka_census(kafka: &mut PrivateKafka) -> Result<(usize, usize), Error> {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message};
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka.bootstrap())
        .set("group.id", "chaos-census")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    let mut remaining = 0i64;
    for partition in 0..KAFKA_PARTITIONS {
        assignment.add_partition_offset(KAFKA_TOPIC, partition, rdkafka::Offset::Beginning)?;
        let (low, high) =
            consumer.fetch_watermarks(KAFKA_TOPIC, partition, Duration::from_secs(10))?;
        remaining += high - low;
    }
    consumer.assign(&assignment)?;
    let mut seen = HashSet::new();
    let mut entries = 0usize;
    // Read past the watermarks until the topic is quiet: a watermark read
    // before the assignment may lag the log by a message.
    loop {
        let quiet = if remaining > 0 { 30 } else { 3 };
        let message = match tokio::time::timeout(Duration::from_secs(quiet), consumer.recv()).await
        {
            Ok(message) => message?,
            Err(_) if remaining <= 0 => break,
            Err(_) => {
                return Err(format!("the census stalled with {remaining} messages unread").into());
            }
        };
        remaining -= 1;
        entries += 1;
        let id = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == outbox_kafka::headers::names::EVENT_ID)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        if let Some(id) = id {
            seen.insert(id);
        }
    }
    Ok((seen.len(), entries))
}
