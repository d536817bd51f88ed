//! Event headers: tracing and correlation context plus free key/values.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Context that travels with an event from enqueue, through the broker, into
/// the consumer's span.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Headers {
    /// Groups every event caused by one user request or job.
    pub correlation_id: Option<String>,
    /// The id of the message or command that caused this event.
    pub causation_id: Option<String>,
    /// W3C trace context (`00-<trace-id>-<span-id>-<flags>`).
    pub traceparent: Option<String>,
    /// Free key/values; adapters map them onto broker headers/attributes.
    pub extra: BTreeMap<String, String>,
}

impl Headers {
    /// Header names used when the well-known fields are flattened onto a broker.
    pub const CORRELATION_ID: &'static str = "correlation_id";
    /// See [`Headers::CORRELATION_ID`].
    pub const CAUSATION_ID: &'static str = "causation_id";
    /// See [`Headers::CORRELATION_ID`].
    pub const TRACEPARENT: &'static str = "traceparent";

    /// All headers as `(name, value)` pairs, well-known ones first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        [
            (Self::CORRELATION_ID, self.correlation_id.as_deref()),
            (Self::CAUSATION_ID, self.causation_id.as_deref()),
            (Self::TRACEPARENT, self.traceparent.as_deref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .chain(self.extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Rebuilds headers from flattened pairs (the inverse of [`Headers::iter`]).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut headers = Self::default();
        for (k, v) in pairs {
            match k {
                Self::CORRELATION_ID => headers.correlation_id = Some(v.to_owned()),
                Self::CAUSATION_ID => headers.causation_id = Some(v.to_owned()),
                Self::TRACEPARENT => headers.traceparent = Some(v.to_owned()),
                _ => {
                    headers.extra.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        headers
    }

    /// Bytes these headers occupy (names plus values), for size limits.
    pub fn encoded_len(&self) -> usize {
        self.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattening_round_trips() {
        let mut h = Headers {
            correlation_id: Some("c1".into()),
            causation_id: None,
            traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
            extra: BTreeMap::new(),
        };
        h.extra.insert("tenant".into(), "acme".into());
        let pairs: Vec<_> = h.iter().collect();
        assert_eq!(pairs.len(), 3);
        assert_eq!(Headers::from_pairs(pairs), h);
    }
}
