//! Shared by the live SNS/SQS tests: the emulator (`scripts/sns.sh`), queues
//! and topics of a test's own, and a proxy that injects faults.
#![allow(dead_code)]

pub mod end_to_end;
pub mod proxy;

use std::time::Duration;

use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_sns::config::BehaviorVersion;
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_types::SdkConfig;
use aws_types::region::Region;
use aws_types::sdk_config::{RetryConfig, TimeoutConfig};
use outbox_core::testing::ReceivedEvent;
use outbox_sns::SqsEvent;

/// The emulator's endpoint (`OUTBOX_SNS_ENDPOINT` overrides).
pub fn endpoint() -> String {
    std::env::var("OUTBOX_SNS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// An SdkConfig for `endpoint` with the SDK's own retries off (so a test
/// sees how the adapter classifies each failure) and short timeouts.
pub fn sdk_config(endpoint: &str) -> SdkConfig {
    SdkConfig::builder()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "outbox-tests",
        )))
        .behavior_version(BehaviorVersion::latest())
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_timeout(Duration::from_secs(25))
                .build(),
        )
        .build()
}

/// A unique name per test, so tests never share topics or queues.
pub fn unique(stem: &str) -> String {
    format!(
        "{stem}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// SNS and SQS clients on the emulator; an unreachable emulator fails the
/// test (CI or not) with how to start it.
pub struct Aws {
    pub config: SdkConfig,
    pub sns: aws_sdk_sns::Client,
    pub sqs: aws_sdk_sqs::Client,
}

/// A queue subscribed to a topic.
pub struct Subscribed {
    pub topic_arn: String,
    pub queue_url: String,
}

impl Aws {
    pub async fn connect() -> Self {
        Self::connect_to(&endpoint()).await
    }

    pub async fn connect_to(endpoint: &str) -> Self {
        let config = sdk_config(endpoint);
        let aws = Self {
            sns: aws_sdk_sns::Client::new(&config),
            sqs: aws_sdk_sqs::Client::new(&config),
            config,
        };
        if let Err(e) = aws.sns.list_topics().send().await {
            panic!(
                "SNS/SQS emulator unreachable at {endpoint}: {e:?} (start it with scripts/sns.sh)"
            );
        }
        aws
    }

    /// The ARN the emulator gives a topic named `name` (it exists or not).
    pub fn topic_arn(name: &str) -> String {
        format!("arn:aws:sns:us-east-1:123456789012:{name}")
    }

    pub async fn create_topic(&self, name: &str) -> String {
        let mut create = self.sns.create_topic().name(name);
        if name.ends_with(".fifo") {
            create = create.attributes("FifoTopic", "true");
        }
        create.send().await.unwrap().topic_arn.unwrap()
    }

    /// Creates a queue; returns its URL.
    pub async fn create_queue(&self, name: &str) -> String {
        let mut create = self.sqs.create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        create.send().await.unwrap().queue_url.unwrap()
    }

    pub async fn queue_arn(&self, url: &str) -> String {
        self.sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap()[&QueueAttributeName::QueueArn]
            .clone()
    }

    pub async fn subscribe(&self, topic_arn: &str, queue_url: &str, raw: bool) {
        let queue_arn = self.queue_arn(queue_url).await;
        self.sns
            .subscribe()
            .topic_arn(topic_arn)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", if raw { "true" } else { "false" })
            .send()
            .await
            .unwrap();
    }

    /// A new topic (FIFO when `fifo`) with a new queue subscribed.
    pub async fn topic_with_queue(&self, stem: &str, fifo: bool, raw: bool) -> Subscribed {
        let suffix = if fifo { ".fifo" } else { "" };
        let topic_arn = self
            .create_topic(&format!("{}{suffix}", unique(stem)))
            .await;
        let queue_url = self
            .create_queue(&format!("{}{suffix}", unique(&format!("{stem}-q"))))
            .await;
        self.subscribe(&topic_arn, &queue_url, raw).await;
        Subscribed {
            topic_arn,
            queue_url,
        }
    }

    /// Receives (and deletes) `n` messages, in the order SQS returns them,
    /// within 30 s.
    pub async fn drain(&self, queue_url: &str, n: usize) -> Vec<aws_sdk_sqs::types::Message> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} of {n} messages arrived",
                out.len()
            );
            let received = self
                .sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .unwrap();
            for message in received.messages.unwrap_or_default() {
                self.sqs
                    .delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .unwrap();
                out.push(message);
            }
        }
        out
    }

    /// How many messages are waiting, visible or not.
    pub async fn depth(&self, queue_url: &str) -> usize {
        let attributes = self
            .sqs
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
        [
            QueueAttributeName::ApproximateNumberOfMessages,
            QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
        ]
        .iter()
        .map(|k| attributes[k].parse::<usize>().unwrap())
        .sum()
    }
}

/// What the suites compare: a received message decoded as a consumer
/// would, with the envelope read raw, by the attribute names it carries.
pub fn received(message: &aws_sdk_sqs::types::Message) -> ReceivedEvent {
    let event = SqsEvent::decode(message).unwrap();
    let mut headers: Vec<(String, String)> = event
        .headers
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    headers.sort();
    let (envelope, _) = ReceivedEvent::split_envelope(raw_attributes(message));
    ReceivedEvent {
        event_id: event.event_id,
        event_type: event.event_type,
        partition_key: event.partition_key,
        payload: event.payload.into_bytes(),
        headers,
        envelope,
    }
}

/// The attributes as delivered: SQS message attributes (raw delivery) or
/// the SNS envelope's `MessageAttributes`.
pub fn raw_attributes(message: &aws_sdk_sqs::types::Message) -> Vec<(String, String)> {
    if let Some(attributes) = message.message_attributes().filter(|a| !a.is_empty()) {
        return attributes
            .iter()
            .map(|(k, v)| (k.clone(), v.string_value().unwrap_or_default().to_owned()))
            .collect();
    }
    let body: serde_json::Value = serde_json::from_str(message.body().unwrap_or_default()).unwrap();
    body["MessageAttributes"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                v["Value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// A moto server of the test's own on a spare port, to stop and start.
/// It keeps nothing across a restart: the test recreates what it needs.
pub struct OwnEmulator {
    pub port: u16,
    child: Option<tokio::process::Child>,
}

impl OwnEmulator {
    pub async fn start() -> Self {
        let port = {
            let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            socket.local_addr().unwrap().port()
        };
        let mut own = Self { port, child: None };
        own.spawn().await;
        own
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let path_file = concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/moto-path");
        let binary = std::fs::read_to_string(path_file)
            .unwrap_or_else(|e| panic!("{path_file}: {e} (run scripts/sns.sh)"));
        let child = tokio::process::Command::new(binary.trim())
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("moto_server starts");
        self.child = Some(child);
        let probe = aws_sdk_sns::Client::new(&sdk_config(&self.endpoint()));
        for _ in 0..200 {
            if probe.list_topics().send().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("moto_server did not start on port {}", self.port);
    }

    /// Kills the server (as a crash would).
    pub async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.unwrap();
        }
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        self.spawn().await;
    }
}
