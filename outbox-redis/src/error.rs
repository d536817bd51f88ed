//! Classifies Redis errors into the relay's classes.

use outbox_core::ErrorClass;
use redis::RedisError;

/// A connection-level failure: the broker is unreachable or failing over.
/// A timeout is one too: no reply within the response timeout to a whole
/// batch's script is the server's state (paused, swapping, a long command
/// ahead), never one event's, so the relay pauses and burns no attempt
/// rather than retrying each event towards `failed`.
pub(crate) fn classify(error: &RedisError) -> ErrorClass {
    if error.is_timeout()
        || error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_unrecoverable_error()
    {
        return ErrorClass::Outage;
    }
    classify_code(error.code().unwrap_or(""))
}

pub(crate) fn classify_code(code: &str) -> ErrorClass {
    match code {
        // The server is starting, failing over or has no master.
        "LOADING" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY" => ErrorClass::Outage,
        // Configuration or server state, not the event (DESIGN.md §6): a
        // stream key holding another type, a full server, a user without
        // the right fail every event of the destination alike, so the relay
        // pauses instead of dead-lettering the backlog one by one.
        "OOM" | "WRONGTYPE" | "NOPERM" | "NOAUTH" | "WRONGPASS" => ErrorClass::Outage,
        // The server cannot persist (a failed AOF write or RDB save) and
        // refuses every write until it can.
        "MISCONF" => ErrorClass::Outage,
        "TRYAGAIN" | "BUSY" => ErrorClass::Transient,
        _ => ErrorClass::Transient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        assert_eq!(classify_code("OOM"), ErrorClass::Outage);
        assert_eq!(classify_code("WRONGTYPE"), ErrorClass::Outage);
        assert_eq!(classify_code("NOPERM"), ErrorClass::Outage);
        assert_eq!(classify_code("LOADING"), ErrorClass::Outage);
        assert_eq!(classify_code("CLUSTERDOWN"), ErrorClass::Outage);
        assert_eq!(classify_code("MISCONF"), ErrorClass::Outage);
        assert_eq!(classify_code("TRYAGAIN"), ErrorClass::Transient);
    }
}
