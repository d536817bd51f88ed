//! Where events go: a topic ARN per event type.

use std::collections::HashMap;

/// Chooses the topic ARN for an event type: one default topic, and
/// overrides per event type.
///
/// A topic whose name ends in `.fifo` is a FIFO topic (AWS requires the
/// suffix): its messages carry `MessageGroupId` = the event's partition key
/// and `MessageDeduplicationId` = its event id.
#[derive(Clone, Debug)]
pub struct TopicRouter {
    default_topic: String,
    overrides: HashMap<String, String>,
}

impl TopicRouter {
    /// Every event type to `topic_arn` unless routed elsewhere.
    pub fn to(topic_arn: impl Into<String>) -> Self {
        Self {
            default_topic: topic_arn.into(),
            overrides: HashMap::new(),
        }
    }

    /// Sends `event_type` to `topic_arn` instead.
    pub fn route(mut self, event_type: impl Into<String>, topic_arn: impl Into<String>) -> Self {
        self.overrides.insert(event_type.into(), topic_arn.into());
        self
    }

    /// The topic ARN for `event_type`.
    pub fn topic_for(&self, event_type: &str) -> &str {
        self.overrides
            .get(event_type)
            .map(String::as_str)
            .unwrap_or(&self.default_topic)
    }

    /// The routing in a few words, for operators: the default topic.
    pub(crate) fn describe(&self) -> String {
        match self.overrides.len() {
            0 => self.default_topic.clone(),
            n => format!("{} ({n} event types routed elsewhere)", self.default_topic),
        }
    }
}

/// True for a FIFO topic's (or queue's) ARN or URL.
pub(crate) fn is_fifo(topic_arn: &str) -> bool {
    topic_arn.ends_with(".fifo")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_win_and_fifo_is_read_from_the_name() {
        let router = TopicRouter::to("arn:aws:sns:eu-west-1:1:all")
            .route("invoice.paid", "arn:aws:sns:eu-west-1:1:billing.fifo");
        assert_eq!(
            router.topic_for("user.created"),
            "arn:aws:sns:eu-west-1:1:all"
        );
        assert!(is_fifo(router.topic_for("invoice.paid")));
        assert!(!is_fifo(router.topic_for("user.created")));
    }
}
