#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod config;
mod context;
mod error;
pub mod headers;
mod publisher;

pub use config::{KafkaPublisherConfig, TopicRouter};
pub use context::BrokerHealth;
pub use publisher::KafkaPublisher;
