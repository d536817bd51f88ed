#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

mod append;
mod config;
mod connection;
pub mod consumer;
pub mod dead_letters;
mod error;
pub mod fields;
mod inbox;
mod publisher;
/// A private `redis-server` for tests (feature `testing`).
#[cfg(feature = "testing")]
pub mod testing;

pub use config::{StreamRouter, Trim};
pub use connection::{ConnectionSettings, LazyConnection};
pub use consumer::{
    ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError, RedisConsumer,
    RedisCounts,
};
pub use dead_letters::{DeadLetterError, RedisDeadLetters};
pub use fields::{DecodeError, StreamEvent};
pub use inbox::{RedisInbox, RedisInboxTx};
pub use publisher::RedisPublisher;
/// The `redis` crate this adapter was built against.
pub use redis;
