#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
pub mod consumer;
mod context;
mod delivery_wait;
mod error;
pub mod headers;
mod key_runs;
mod publisher;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{KafkaPublisherConfig, TopicRouter};
pub use consumer::{
    CommitWatch, ConsumerError, ConsumerReport, Handler, HandlerError, KafkaConsumer,
    KafkaConsumerConfig, KafkaEvent, SHUTDOWN_COMMIT_LIMIT,
};
pub use context::BrokerHealth;
pub use publisher::KafkaPublisher;
/// The `rdkafka` crate this adapter was built against.
pub use rdkafka;
