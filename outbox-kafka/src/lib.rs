#![doc = include_str!("../README.md")]
// docs.rs builds with `--cfg outbox_docsrs` (see Cargo.toml) on nightly,
// where each feature-gated item shows the feature it needs. Not `docsrs`:
// `RUSTDOCFLAGS="--cfg docsrs" cargo +stable doc` must build too.
#![cfg_attr(outbox_docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod config;
pub mod consumer;
mod context;
pub mod dead_letters;
mod delivery_wait;
mod error;
pub mod headers;
mod key_runs;
mod publisher;
#[cfg(feature = "testing")]
#[cfg_attr(outbox_docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use config::{KafkaPublisherConfig, TopicRouter};
pub use consumer::{
    CommitWatch, ConsumerError, ConsumerReport, Handler, HandlerError, KafkaConsumer,
    KafkaConsumerConfig, KafkaCounts, KafkaEvent, SHUTDOWN_COMMIT_LIMIT,
};
pub use context::BrokerHealth;
pub use dead_letters::{DeadLetterError, KafkaDeadLetters};
pub use publisher::KafkaPublisher;
/// The `rdkafka` crate this adapter was built against.
pub use rdkafka;
