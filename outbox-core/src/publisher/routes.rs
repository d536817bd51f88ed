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

/// Declares a publisher's router over [`PrefixRoutes`]: a type named
/// `$router` whose destinations are called `$what` (`topic`, `stream`),
/// with `with_prefix`, `route`, `$for` (the destination of an event type)
/// and a `Default` of prefix `$default`. Kafka's `TopicRouter` and Redis'
/// `StreamRouter` are declared by it, so both route alike.
#[macro_export]
macro_rules! prefix_router {
    ($(#[$doc:meta])* $router:ident, $what:literal, $for:ident, default $default:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug)]
        pub struct $router {
            routes: $crate::publisher::PrefixRoutes,
        }

        impl $router {
            #[doc = concat!("Each event type to the ", $what, " `{prefix}{event_type}`.")]
            pub fn with_prefix(prefix: impl Into<String>) -> Self {
                let routes = $crate::publisher::PrefixRoutes::with_prefix(prefix);
                Self { routes }
            }

            #[doc = concat!("Sends `event_type` to the ", $what, " `destination` instead.")]
            pub fn route(
                mut self,
                event_type: impl Into<String>,
                destination: impl Into<String>,
            ) -> Self {
                self.routes.route(event_type, destination);
                self
            }

            #[doc = concat!("The ", $what, " for `event_type`.")]
            pub fn $for(&self, event_type: &str) -> String {
                self.routes.destination_for(event_type)
            }

            /// The routing in a few words, for operators: `orders.<event
            /// type>`.
            pub(crate) fn describe(&self) -> String {
                self.routes.describe()
            }
        }

        impl Default for $router {
            #[doc = concat!("Prefix `", $default, "`.")]
            fn default() -> Self {
                Self::with_prefix($default)
            }
        }
    };
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
