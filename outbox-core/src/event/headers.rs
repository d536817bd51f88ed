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

    /// The headers as one flat JSON object of string values
    /// (`{"correlation_id": "c1", "tenant": "acme"}`): how stores keep them,
    /// and what a producer in another language writes.
    pub fn to_flat_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .iter()
            .map(|(k, v)| (k.to_owned(), serde_json::Value::String(v.to_owned())))
            .collect();
        serde_json::Value::Object(map).to_string()
    }

    /// Reads headers a store kept: a flat JSON object of string values
    /// ([`Headers::to_flat_json`]), or the nested form earlier versions
    /// wrote (`{"correlation_id": …, "extra": {…}}`). Anything else is an
    /// error naming what is wrong; nothing is dropped silently.
    pub fn from_flat_json(text: &str) -> Result<Self, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("headers are not JSON: {e}"))?;
        let serde_json::Value::Object(map) = value else {
            return Err(format!("headers must be a JSON object, found {text}"));
        };
        let mut pairs: Vec<(String, String)> = Vec::with_capacity(map.len());
        for (name, value) in map {
            match value {
                serde_json::Value::String(v) => pairs.push((name, v)),
                serde_json::Value::Null => {}
                serde_json::Value::Object(extra) if name == "extra" => {
                    for (k, v) in extra {
                        match v {
                            serde_json::Value::String(v) => pairs.push((k, v)),
                            other => {
                                return Err(format!("header {k:?} is not a string: {other}"));
                            }
                        }
                    }
                }
                other => return Err(format!("header {name:?} is not a string: {other}")),
            }
        }
        Ok(Self::from_pairs(
            pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ))
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

    #[test]
    fn flat_json_round_trips_and_reads_the_nested_form() {
        let mut h = Headers {
            correlation_id: Some("c1".into()),
            ..Headers::default()
        };
        h.extra.insert("tenant".into(), "acme".into());
        let flat = h.to_flat_json();
        assert_eq!(flat, r#"{"correlation_id":"c1","tenant":"acme"}"#);
        assert_eq!(Headers::from_flat_json(&flat).unwrap(), h);
        let nested = r#"{"correlation_id":"c1","causation_id":null,"traceparent":null,"extra":{"tenant":"acme"}}"#;
        assert_eq!(Headers::from_flat_json(nested).unwrap(), h);
        assert_eq!(Headers::from_flat_json("{}").unwrap(), Headers::default());
    }

    #[test]
    fn flat_json_names_what_it_cannot_read() {
        assert!(
            Headers::from_flat_json("[]")
                .unwrap_err()
                .contains("object")
        );
        let err = Headers::from_flat_json(r#"{"traceparent": 5}"#).unwrap_err();
        assert!(err.contains("traceparent"), "{err}");
    }
}
