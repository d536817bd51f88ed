//! The orchestrator: servers, producer, relay and consumer processes, the
//! fault schedule, and the final accounting.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::policy::{RandomSource, SplitMix64};
use outbox_core::store::OutboxAdmin;
use outbox_core::{EventId, NewEvent, OutboxWriter};
use outbox_sqlx::StoreConfig;
use outbox_sqlx::postgres::PgStore;
use redis::AsyncCommands;
use sqlx::Row;

use crate::Error;
use crate::cluster::{PrivatePg, PrivateRedis};
use crate::roles::{EFFECTS, EFFECTS_SCHEMA, KAFKA_PARTITIONS, KAFKA_TOPIC, STREAM};
use outbox_kafka::testing::PrivateBroker as PrivateKafka;
use outbox_sqlx::postgres::EffectLog;

mod accounting;
pub(crate) use accounting::*;

/// How big a run is, and how long its outages last.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    events: usize,
    keys: usize,
    relays: usize,
    kafka: bool,
    redis_outage: Duration,
    database_down: Duration,
    produce_rate: f64,
}

impl Settings {
    /// `--events N`, `--redis-outage-secs S` (or `--broker-outage-secs`),
    /// `--database-down-secs S`, `--kafka` (Kafka as the broker instead of
    /// Redis), `--full` (50,000 events, 10 s broker outage, 15 s database
    /// down).
    pub(crate) fn from_args(args: &[String]) -> Self {
        let mut settings = Self {
            events: 5_000,
            keys: 200,
            relays: 4,
            kafka: false,
            redis_outage: Duration::from_secs(4),
            database_down: Duration::from_secs(5),
            produce_rate: 250.0,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || -> u64 {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{arg} needs a number"))
            };
            match arg.as_str() {
                "--events" => settings.events = value() as usize,
                "--redis-outage-secs" | "--broker-outage-secs" => {
                    settings.redis_outage = Duration::from_secs(value())
                }
                "--kafka" => settings.kafka = true,
                "--database-down-secs" => settings.database_down = Duration::from_secs(value()),
                "--full" => {
                    settings.events = 50_000;
                    settings.redis_outage = Duration::from_secs(10);
                    settings.database_down = Duration::from_secs(15);
                    settings.produce_rate = 1_000.0;
                }
                other => panic!("unknown argument {other}"),
            }
        }
        settings
    }
}

/// The run's child processes: relays and one consumer, each given the
/// database's and the broker's URLs.
pub(crate) struct Processes {
    /// The relays, shared with the task that kills them.
    pub(crate) relays: Arc<Mutex<Vec<Role>>>,
    /// The consumer (`c1`).
    pub(crate) consumer: Role,
}

impl Processes {
    pub(crate) fn start(database_url: &str, broker_url: &str, relays: usize) -> Self {
        let role = |kind: &str, name: String| {
            Role::start(vec![
                kind.into(),
                database_url.into(),
                broker_url.into(),
                name,
            ])
        };
        let relays = (0..relays).map(|i| role("relay", format!("relay-{i}")));
        Self {
            relays: Arc::new(Mutex::new(relays.collect())),
            consumer: role("consume", "c1".into()),
        }
    }

    /// Kills every process, then accounts for what was `committed`.
    pub(crate) async fn kill_and_account(
        &mut self,
        committed: &Mutex<Committed>,
        (pool, store): (&sqlx::PgPool, &PgStore),
        broker: &mut Broker,
    ) -> Result<(Committed, Accounting), Error> {
        self.relays
            .lock()
            .expect("relays")
            .iter_mut()
            .for_each(Role::kill);
        self.consumer.kill();
        let committed = std::mem::take(&mut *committed.lock().expect("committed"));
        let report = account(pool, store, broker, &committed).await?;
        Ok((committed, report))
    }
}

/// A child process of this binary in one role, restartable.
pub(crate) struct Role {
    args: Vec<String>,
    child: Option<Child>,
}

impl Role {
    pub(crate) fn start(args: Vec<String>) -> Self {
        let mut role = Self { args, child: None };
        role.spawn();
        role
    }

    fn spawn(&mut self) {
        let child = Command::new(std::env::current_exe().expect("own path"))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a role process");
        self.child = Some(child);
    }

    /// SIGKILL, then a new process in the same role (same name).
    pub(crate) fn kill_and_restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A deploy: SIGTERM (the process drains its batch and exits; SIGKILL
    /// after `grace`), then a new process in the same role.
    pub(crate) fn terminate_and_restart(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            signal(&child, "-TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.spawn();
    }

    /// SIGSTOP (a process paused: a long GC, a frozen VM) or SIGCONT.
    pub(crate) fn pause(&self, paused: bool) {
        if let Some(child) = &self.child {
            signal(child, if paused { "-STOP" } else { "-CONT" });
        }
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn signal(child: &Child, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status();
}

impl Drop for Role {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The run's broker: a private redis-server (stopped = killed, its AOF
/// keeps what it acknowledged) or a private tansu behind a cuttable proxy
/// (stopped = every connection cut and refused).
pub(crate) enum Broker {
    Redis(PrivateRedis),
    Kafka(PrivateKafka),
}

impl Broker {
    async fn start(kafka: bool) -> Result<Self, Error> {
        if !kafka {
            return Ok(Self::Redis(PrivateRedis::start()));
        }
        let broker = PrivateKafka::start().await;
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", broker.bootstrap())
                .create()?;
        let topic = rdkafka::admin::NewTopic::new(
            KAFKA_TOPIC,
            KAFKA_PARTITIONS,
            rdkafka::admin::TopicReplication::Fixed(1),
        );
        for result in admin
            .create_topics(
                &[topic],
                &rdkafka::admin::AdminOptions::new()
                    .operation_timeout(Some(Duration::from_secs(10))),
            )
            .await?
        {
            result.map_err(|(topic, e)| format!("creating {topic}: {e}"))?;
        }
        Ok(Self::Kafka(broker))
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Redis(_) => "Redis",
            Self::Kafka(_) => "Kafka",
        }
    }

    /// What the role processes are given.
    fn url(&self) -> String {
        match self {
            Self::Redis(redis) => redis.url(),
            Self::Kafka(kafka) => format!("kafka://{}", kafka.bootstrap()),
        }
    }

    pub(crate) fn stop(&mut self) {
        match self {
            Self::Redis(redis) => redis.kill(),
            Self::Kafka(kafka) => kafka.cut(),
        }
    }

    pub(crate) fn resume(&mut self) {
        match self {
            Self::Redis(redis) => redis.restart(),
            Self::Kafka(kafka) => kafka.restore(),
        }
    }

    /// Every message the broker holds: (distinct event ids, messages).
    pub(crate) async fn census(&mut self) -> Result<(usize, usize), Error> {
        match self {
            Self::Redis(redis) => redis_census(redis).await,
            Self::Kafka(kafka) => kafka_census(kafka).await,
        }
    }
}

/// What the producer committed, per key in order.
#[derive(Default)]
pub(crate) struct Committed {
    pub(crate) by_key: HashMap<String, Vec<EventId>>,
    pub(crate) total: usize,
}

pub(crate) async fn run(settings: Settings) -> Result<(), Error> {
    let started = Instant::now();
    let pg = PrivatePg::start(&["max_connections = 100"]);
    pg.psql("postgres", "CREATE DATABASE chaos");
    let url = pg.url("chaos");
    let mut broker = Broker::start(settings.kafka).await?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&url)
        .await?;
    let store = Arc::new(PgStore::new(pool.clone(), StoreConfig::default()));
    store.migrate().await?;
    EffectLog::create(&pool, EFFECTS_SCHEMA).await?;
    let broker_name = broker.name();
    println!(
        "# outbox-chaos: {} events over {} keys, {} relays SIGKILLed every 1-3 s, {broker_name} down {:?}, PostgreSQL restarted fast and down {:?}, consumer killed once, {broker_name} blip",
        settings.events,
        settings.keys,
        settings.relays,
        settings.redis_outage,
        settings.database_down
    );

    let broker_url = broker.url();
    let mut processes = Processes::start(&url, &broker_url, settings.relays);

    let committed = Arc::new(Mutex::new(Committed::default()));
    let producer = tokio::spawn(produce(store.clone(), settings.clone(), committed.clone()));
    let faults_done = outbox_core::CancellationToken::new();
    let killer = tokio::spawn(kill_relays(processes.relays.clone(), faults_done.clone()));

    // The fault schedule.
    let step = Duration::from_secs(3);
    tokio::time::sleep(step).await;
    println!(
        "  .. {:>5.1} s  {} stopped for {:?}",
        started.elapsed().as_secs_f64(),
        broker.name(),
        settings.redis_outage
    );
    broker.stop();
    tokio::time::sleep(settings.redis_outage).await;
    broker.resume();
    tokio::time::sleep(step).await;
    println!(
        "  .. {:>5.1} s  PostgreSQL restarted (pg_ctl restart -m fast)",
        started.elapsed().as_secs_f64()
    );
    pg.restart_fast();
    tokio::time::sleep(step).await;
    println!(
        "  .. {:>5.1} s  consumer SIGKILLed, restarted under the same name",
        started.elapsed().as_secs_f64()
    );
    processes.consumer.kill_and_restart();
    tokio::time::sleep(step).await;
    println!(
        "  .. {:>5.1} s  {} blip (0.5 s)",
        started.elapsed().as_secs_f64(),
        broker.name()
    );
    broker.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.resume();
    tokio::time::sleep(step).await;
    println!(
        "  .. {:>5.1} s  PostgreSQL down for {:?}",
        started.elapsed().as_secs_f64(),
        settings.database_down
    );
    pg.stop();
    tokio::time::sleep(settings.database_down).await;
    pg.resume();
    producer.await??;
    faults_done.cancel();
    let kills = killer.await?;
    let last_fault = Instant::now();
    println!(
        "  .. {:>5.1} s  producer done; faults over ({kills} relay kills)",
        started.elapsed().as_secs_f64()
    );

    // Drain: every committed event applied, or give up.
    let total = committed.lock().expect("committed").total;
    let drained = tokio::time::timeout(Duration::from_secs(180), async {
        loop {
            let applied: i64 =
                sqlx::query_scalar(&format!("SELECT count(DISTINCT event_id) FROM {EFFECTS}"))
                    .fetch_one(&pool)
                    .await
                    .unwrap_or(0);
            if applied as usize >= total {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let drain_time = last_fault.elapsed();
    // Let in-flight duplicates land before counting them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (committed, report) = processes
        .kill_and_account(&committed, (&pool, &store), &mut broker)
        .await?;
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    println!("| events committed | {} |", committed.total);
    report.print_delivery_rows();
    println!("| relay processes SIGKILLed | {kills} |");
    println!(
        "| drain time after the last fault and the last commit | {:.1} s{} |",
        drain_time.as_secs_f64(),
        if drained.is_err() { " (gave up)" } else { "" }
    );
    println!("| whole run | {:.1} s |", started.elapsed().as_secs_f64());
    let clean = report.lost == 0
        && report.applied_twice == 0
        && report.order_violations == 0
        && report.failed_or_parked == 0
        && drained.is_ok();
    if clean {
        println!("\nchaos: nothing lost, nothing applied twice, every key in order");
        Ok(())
    } else {
        Err("chaos: a promise was broken (see the table)".into())
    }
}

/// Enqueues `events` over `keys` in transactions of 10 at `produce_rate`,
/// retrying a batch through database outages (same ids: a commit whose
/// reply was lost comes back as already there).
async fn produce(
    store: Arc<PgStore>,
    settings: Settings,
    committed: Arc<Mutex<Committed>>,
) -> Result<(), Error> {
    let started = Instant::now();
    let mut seq = vec![0u64; settings.keys];
    let mut n = 0usize;
    while n < settings.events {
        let batch: Vec<NewEvent> = (n..(n + 10).min(settings.events))
            .map(|i| {
                let key = i % settings.keys;
                seq[key] += 1;
                NewEvent::builder("invoice.paid", "invoice", format!("inv-{i}"))
                    .event_id(EventId::random())
                    .partition_key(format!("k{key}"))
                    .payload(&serde_json::json!({ "key": key, "seq": seq[key] }))
                    .build()
                    .expect("a valid event")
            })
            .collect();
        loop {
            match OutboxWriter::enqueue(&*store, &batch).await {
                Ok(_) => break,
                Err(error) if error.is_retryable() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
        {
            let mut committed = committed.lock().expect("committed");
            for event in &batch {
                committed
                    .by_key
                    .entry(event.partition_key.clone())
                    .or_default()
                    .push(event.event_id);
            }
            committed.total += batch.len();
        }
        n += batch.len();
        let due = started + Duration::from_secs_f64(n as f64 / settings.produce_rate);
        tokio::time::sleep_until(due.into()).await;
    }
    Ok(())
}

/// SIGKILLs a random relay every 1–3 s and starts it again; returns the kills.
async fn kill_relays(relays: Arc<Mutex<Vec<Role>>>, done: outbox_core::CancellationToken) -> u64 {
    let random = SplitMix64::from_entropy();
    let mut kills = 0;
    loop {
        let pause = Duration::from_secs_f64(1.0 + 2.0 * random.next_unit());
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = done.cancelled() => return kills,
        }
        let mut relays = relays.lock().expect("relays");
        let victim = (random.next_unit() * relays.len() as f64) as usize % relays.len();
        relays[victim].kill_and_restart();
        kills += 1;
    }
}
