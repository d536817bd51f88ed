//! Destinations named after event types, for publishers whose broker
//! names things (Kafka topics, Redis streams).

use std::collections::HashMap;

/// Routes an event type to `{prefix}{event_type}` unless an override names
/// another destination. Kafka's `TopicRouter` and Redis' `StreamRouter`
/// route by it.
#[derive(Clone, Debug, Default)]
pub struct PrefixRoutes {
    prefix: String,
    overrides: HashMap<String, String>,
}

impl PrefixRoutes {
    /// Destinations named `{prefix}{event_type}`.
    pub fn with_prefix(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
            overrides: HashMap::new(),
        }
    }

    /// Sends `event_type` to `destination` instead.
    pub fn route(&mut self, event_type: impl Into<String>, destination: impl Into<String>) {
        self.overrides.insert(event_type.into(), destination.into());
    }

    /// Where `event_type` goes.
    pub fn destination_for(&self, event_type: &str) -> String {
        self.overrides
            .get(event_type)
            .cloned()
            .unwrap_or_else(|| format!("{}{event_type}", self.prefix))
    }

    /// The routing in a few words, for operators: `orders.<event type>`,
    /// and how many event types go elsewhere.
    pub fn describe(&self) -> String {
        match self.overrides.len() {
            0 => format!("{}<event type>", self.prefix),
            n => format!("{}<event type> ({n} routed elsewhere)", self.prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_wins_and_the_rest_take_the_prefix() {
        let mut routes = PrefixRoutes::with_prefix("orders.");
        assert_eq!(routes.describe(), "orders.<event type>");
        routes.route("invoice.paid", "billing");
        assert_eq!(routes.destination_for("invoice.paid"), "billing");
        assert_eq!(
            routes.destination_for("order.placed"),
            "orders.order.placed"
        );
        assert_eq!(
            routes.describe(),
            "orders.<event type> (1 routed elsewhere)"
        );
    }
}
