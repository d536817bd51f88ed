//! The event payload: JSON text, kept exactly as serialized at enqueue.

use serde::{Deserialize, Serialize};

use super::InvalidEvent;

/// JSON text of the facts true at commit time.
///
/// Kept as text rather than a parsed tree so the relay hands publishers the
/// exact bytes that were stored, without re-serializing per attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Payload(String);

impl Payload {
    /// Serializes `value` to JSON.
    pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> Result<Self, InvalidEvent> {
        serde_json::to_string(value)
            .map(Self)
            .map_err(|e| InvalidEvent::PayloadNotJson(e.to_string()))
    }

    /// Accepts JSON text after checking that it parses.
    pub fn from_json_text(text: impl Into<String>) -> Result<Self, InvalidEvent> {
        let text = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|e| InvalidEvent::PayloadNotJson(e.to_string()))?;
        Ok(Self(text))
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The JSON bytes as stored and published.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for an empty text (never produced by the constructors).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Deserializes the payload into `T`.
    pub fn deserialize<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// True when a JSON string inside holds U+0000, which PostgreSQL `jsonb`
    /// cannot store. Stores that cannot hold it reject the event at enqueue.
    pub fn contains_nul_char(&self) -> bool {
        // serde_json always escapes U+0000 as `\u0000`; a raw NUL byte cannot
        // appear in valid JSON text. Count preceding backslashes so `\\u0000`
        // (a literal backslash followed by "u0000") is not mistaken for it.
        let bytes = self.0.as_bytes();
        let needle = b"u0000";
        let mut i = 0;
        while let Some(pos) = find(&bytes[i..], needle) {
            let at = i + pos;
            let mut backslashes = 0;
            while at > backslashes && bytes[at - backslashes - 1] == b'\\' {
                backslashes += 1;
            }
            if backslashes % 2 == 1 {
                return true;
            }
            i = at + 1;
        }
        false
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_text_that_is_not_json() {
        assert!(matches!(
            Payload::from_json_text("{not json"),
            Err(InvalidEvent::PayloadNotJson(_))
        ));
        assert!(Payload::from_json_text(r#"{"a":1}"#).is_ok());
    }

    #[test]
    fn finds_escaped_nul_but_not_escaped_backslash() {
        let nul = Payload::from_serialize(&serde_json::json!({"a": "x\u{0}y"})).unwrap();
        assert!(nul.contains_nul_char());
        let literal = Payload::from_json_text(r#"{"a":"\\u0000"}"#).unwrap();
        assert!(!literal.contains_nul_char());
        let both = Payload::from_json_text(r#"{"a":"\\\u0000"}"#).unwrap();
        assert!(both.contains_nul_char());
    }
}
