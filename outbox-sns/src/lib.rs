#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod attributes;
mod config;
pub mod consumer;
mod error;
mod message;
mod publisher;
mod visibility;

pub use config::TopicRouter;
pub use consumer::{
    ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError, SqsConsumer,
};
pub use error::{classify_code, classify_sdk_error};
pub use message::{DecodeError, SqsEvent};
pub use publisher::SnsPublisher;
