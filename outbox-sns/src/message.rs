//! [`SqsEvent`]: an outbox event as a consumer receives it from an SQS
//! queue subscribed to the topic, in either subscription mode.
//!
//! * **Raw message delivery** (`RawMessageDelivery=true`): the body is the
//!   payload and the SNS attributes arrive as SQS message attributes.
//! * **Enveloped** (the default): the body is SNS's JSON notification; the
//!   payload is its `Message` and the attributes its `MessageAttributes`
//!   (`{"name": {"Type": "String", "Value": "…"}}`).
//!
//! A message with an `event_id` SQS attribute is raw; any other is read as
//! an envelope.

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use outbox_core::chrono::{DateTime, Utc};
use outbox_core::{EventId, Headers};

use crate::attributes::{names, read_attributes};

/// An event as a consumer reads it from SQS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqsEvent {
    /// The SQS message id.
    pub message_id: String,
    /// The event id.
    pub event_id: EventId,
    /// The event type.
    pub event_type: String,
    /// The ordering key (the message group on FIFO topics and queues).
    pub partition_key: String,
    /// The aggregate kind.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The payload schema version.
    pub payload_version: u32,
    /// The payload's JSON text.
    pub payload: String,
    /// When the event was enqueued (store time); `None` for messages
    /// written before the attribute existed.
    pub occurred_at: Option<DateTime<Utc>>,
    /// Correlation, causation, trace context and free headers.
    pub headers: Headers,
    /// How many times SQS has delivered this message (1 the first time).
    pub receive_count: u32,
}

/// Why a message is not an outbox event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("SQS message {message_id} is not an outbox event: {reason}")]
pub struct DecodeError {
    /// The SQS message id.
    pub message_id: String,
    /// What is wrong.
    pub reason: String,
}

/// How many times SQS has delivered `message` (1 when it does not say).
pub(crate) fn receive_count(message: &Message) -> u32 {
    message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

outbox_core::consumed_from_fields!(SqsEvent);

impl SqsEvent {
    /// Reads a received message, raw or enveloped.
    pub fn decode(message: &Message) -> Result<Self, DecodeError> {
        let message_id = message.message_id().unwrap_or_default().to_owned();
        let fail = |reason: String| DecodeError {
            message_id: message_id.clone(),
            reason,
        };
        let body = message.body().unwrap_or_default();
        let sqs_attributes = message.message_attributes();
        let raw = sqs_attributes.is_some_and(|a| a.contains_key(names::EVENT_ID));
        let (payload, pairs): (String, Vec<(String, String)>) = if raw {
            let pairs = sqs_attributes
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| v.string_value().map(|v| (k.clone(), v.to_owned())))
                .collect();
            (body.to_owned(), pairs)
        } else {
            envelope(body).map_err(fail)?
        };
        let read =
            read_attributes(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))).map_err(fail)?;
        let identity = |name: &str| read.identity.get(name).cloned().unwrap_or_default();
        let event_id = identity(names::EVENT_ID)
            .parse()
            .map_err(|e| fail(format!("attribute {}: {e}", names::EVENT_ID)))?;
        let payload_version = identity(names::PAYLOAD_VERSION)
            .parse()
            .map_err(|e| fail(format!("attribute {}: {e}", names::PAYLOAD_VERSION)))?;
        let event_type = identity(names::EVENT_TYPE);
        if event_type.is_empty() {
            return Err(fail(format!("attribute {} is missing", names::EVENT_TYPE)));
        }
        Ok(Self {
            message_id: message_id.clone(),
            event_id,
            event_type,
            partition_key: identity(names::PARTITION_KEY),
            aggregate_type: identity(names::AGGREGATE_TYPE),
            aggregate_id: identity(names::AGGREGATE_ID),
            payload_version,
            payload,
            occurred_at: read.occurred_at().map_err(fail)?,
            headers: read.headers,
            receive_count: receive_count(message),
        })
    }
}

/// The payload and attributes of an SNS notification envelope.
fn envelope(body: &str) -> Result<(String, Vec<(String, String)>), String> {
    let value: serde_json::Value = serde_json::from_str(body)
        .map_err(|e| format!("no event_id attribute and the body is not an SNS envelope: {e}"))?;
    let Some(payload) = value.get("Message").and_then(|m| m.as_str()) else {
        return Err("no event_id attribute and the body has no SNS `Message`".into());
    };
    let mut pairs = Vec::new();
    if let Some(attributes) = value.get("MessageAttributes").and_then(|a| a.as_object()) {
        for (name, attribute) in attributes {
            let Some(value) = attribute.get("Value").and_then(|v| v.as_str()) else {
                return Err(format!("envelope attribute {name} has no string Value"));
            };
            pairs.push((name.clone(), value.to_owned()));
        }
    }
    Ok((payload.to_owned(), pairs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_is_unwrapped() {
        let id = EventId::random();
        let body = serde_json::json!({
            "Type": "Notification",
            "Message": "{\"amount\":5}",
            "MessageAttributes": {
                "event_id": {"Type": "String", "Value": id.to_string()},
                "event_type": {"Type": "String", "Value": "invoice.paid"},
                "partition_key": {"Type": "String", "Value": "inv-1"},
                "payload_version": {"Type": "String", "Value": "2"},
                "occurred_at": {"Type": "String", "Value": "2026-12-01T05:36:23.123456Z"},
                "traceparent": {"Type": "String", "Value": "00-aa-bb-01"}
            }
        })
        .to_string();
        let message = Message::builder().message_id("m1").body(body).build();
        let event = SqsEvent::decode(&message).unwrap();
        assert_eq!(event.event_id, id);
        assert_eq!(event.payload, "{\"amount\":5}");
        assert_eq!(event.payload_version, 2);
        assert_eq!(
            event.occurred_at.unwrap().to_rfc3339(),
            "2026-12-01T05:36:23.123456+00:00"
        );
        assert_eq!(event.headers.traceparent.as_deref(), Some("00-aa-bb-01"));
    }

    #[test]
    fn a_foreign_message_is_a_decode_error() {
        let message = Message::builder().message_id("m2").body("hello").build();
        let err = SqsEvent::decode(&message).unwrap_err();
        assert!(err.reason.contains("SNS envelope"), "{err}");
    }
}
