//! Classifies librdkafka errors into the relay's classes.

use outbox_core::ErrorClass;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The class of a produce failure. `brokers_down` is the client's latest
/// global state: a delivery that timed out while every broker was down is an
/// outage, not a problem with that message.
pub(crate) fn classify(error: &KafkaError, brokers_down: bool) -> ErrorClass {
    use RDKafkaErrorCode as C;
    match error.rdkafka_error_code() {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::MessageBatchTooLarge
            | C::UnsupportedForMessageFormat,
        ) => ErrorClass::Permanent,
        // Configuration, not the event (DESIGN.md §6): every event of the
        // destination fails alike until someone creates the topic, grants
        // the right or fixes the name, so the relay pauses and burns no
        // attempts instead of dead-lettering the backlog one by one.
        Some(
            C::UnknownTopicOrPartition
            | C::UnknownTopic
            | C::UnknownPartition
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::TransactionalIdAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::InvalidTopic,
        ) => ErrorClass::Outage,
        Some(C::AllBrokersDown | C::BrokerTransportFailure | C::Resolve) => ErrorClass::Outage,
        // The producer instance is unusable (it is replaced); the event is fine.
        Some(code) if producer_is_broken(code) => ErrorClass::Outage,
        Some(C::MessageTimedOut | C::RequestTimedOut | C::PurgeQueue | C::PurgeInflight)
            if brokers_down =>
        {
            ErrorClass::Outage
        }
        _ => ErrorClass::Transient,
    }
}

/// Errors after which an idempotent producer instance cannot send again.
pub(crate) fn producer_is_broken(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::GaplessGuarantee
            | C::ProducerFenced
            | C::InvalidProducerEpoch
            | C::OutOfOrderSequenceNumber
            | C::UnknownProducerId
            | C::InvalidProducerIdMapping
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produce(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MessageProduction(code)
    }

    #[test]
    fn codes_map_to_classes() {
        use RDKafkaErrorCode as C;
        assert_eq!(
            classify(&produce(C::MessageSizeTooLarge), false),
            ErrorClass::Permanent
        );
        for configuration in [
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::TopicAuthorizationFailed,
            C::InvalidTopic,
        ] {
            assert_eq!(
                classify(&produce(configuration), false),
                ErrorClass::Outage,
                "{configuration:?} is the destination's configuration, not the event"
            );
        }
        let cases = [
            (C::InvalidRecord, false, ErrorClass::Permanent),
            (C::RequestTimedOut, false, ErrorClass::Transient),
            (C::LeaderNotAvailable, false, ErrorClass::Transient),
            (C::QueueFull, false, ErrorClass::Transient),
            (C::AllBrokersDown, false, ErrorClass::Outage),
            (C::BrokerTransportFailure, false, ErrorClass::Outage),
            // A message timed out while every broker is down: an outage;
            // while one answers: transient.
            (C::MessageTimedOut, true, ErrorClass::Outage),
            (C::MessageTimedOut, false, ErrorClass::Transient),
        ];
        for (code, brokers_down, class) in cases {
            assert_eq!(
                classify(&produce(code), brokers_down),
                class,
                "{code:?} (brokers down: {brokers_down})"
            );
        }
    }
}
