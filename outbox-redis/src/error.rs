//! Classifies Redis errors per DESIGN.md §6.

use outbox_core::ErrorClass;
use redis::RedisError;

/// A connection-level failure: the broker is unreachable or failing over.
pub(crate) fn classify(error: &RedisError) -> ErrorClass {
    if error.is_timeout() {
        return ErrorClass::Transient;
    }
    if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        return ErrorClass::Outage;
    }
    classify_code(error.code().unwrap_or(""))
}

fn classify_code(code: &str) -> ErrorClass {
    match code {
        // The server is starting, failing over or has no master.
        "LOADING" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" => ErrorClass::Outage,
        // Out of memory and wrong key type will not fix themselves for this event.
        "OOM" | "WRONGTYPE" => ErrorClass::Permanent,
        "TRYAGAIN" | "BUSY" => ErrorClass::Transient,
        _ => ErrorClass::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        assert_eq!(classify_code("OOM"), ErrorClass::Permanent);
        assert_eq!(classify_code("WRONGTYPE"), ErrorClass::Permanent);
        assert_eq!(classify_code("LOADING"), ErrorClass::Outage);
        assert_eq!(classify_code("CLUSTERDOWN"), ErrorClass::Outage);
        assert_eq!(classify_code("TRYAGAIN"), ErrorClass::Transient);
    }
}
