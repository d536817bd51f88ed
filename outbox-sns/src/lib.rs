#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]

pub mod attributes;
mod config;
pub mod consumer;
pub mod dead_letters;
mod error;
mod message;
mod publisher;
mod settle;
mod visibility;

pub use config::TopicRouter;
pub use consumer::{
    ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError, SqsConsumer, SqsCounts,
};
pub use dead_letters::{DeadLetterError, SqsDeadLetters};
pub use error::{classify_code, classify_sdk_error};
pub use message::{DecodeError, SqsEvent};
pub use publisher::SnsPublisher;
/// The AWS SDK crates this adapter was built against (`SdkConfig` is
/// `aws_types::SdkConfig`).
pub use {aws_sdk_sns, aws_sdk_sqs, aws_types};
