//! The event model.

mod headers;
mod id;
mod limits;
mod new_event;
mod payload;
mod raw;
mod stored;
mod typed;
pub mod wire;

pub use headers::Headers;
pub use id::EventId;
pub use limits::{EventLimits, InvalidEvent};
pub use new_event::{NewEvent, NewEventBuilder};
pub use payload::Payload;
pub use raw::{RawEvent, UnreadableEvent};
pub use stored::StoredEvent;
pub use typed::TypedEvent;
