//! Macros that turn the suites into named `#[tokio::test]`s.

/// Generates one `#[tokio::test]` per store-suite function, calling each with
/// `$factory` (an expression of a type implementing
/// [`StoreFactory`](crate::testing::StoreFactory)).
#[macro_export]
macro_rules! store_conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(store_suite, $factory;
            duplicate_enqueue_is_reported_noop,
            every_field_comes_back_enqueued_alone_or_in_a_batch,
            invalid_events_are_refused_atomically,
            claims_are_exclusive_under_concurrency,
            per_key_claims_are_ordered_prefixes,
            lease_expiry_makes_events_claimable_again,
            a_dead_relays_keys_come_back_in_one_claim,
            a_hot_keys_backlog_holds_no_other_key,
            stale_settlements_are_fenced,
            backoff_honours_available_at,
            delayed_events_wait,
            skip_policy_lets_the_key_continue,
            failed_events_page_by_type_key_and_sequence,
            block_policy_parks_the_key_until_an_operator_acts,
            parked_events_come_back_with_every_operator_action,
            requeue_appends_history,
            supersede_takes_the_place_of_the_failed_event,
            operators_act_on_many_failed_events_at_once,
            crash_loops_end_in_failed,
            release_burns_no_attempt,
            purge_never_touches_unpublished_rows,
            purge_empties_the_history_while_it_returns_batch_size,
            stats_report_lag_and_parked_events,
            status_adds_up,
            heartbeats_report_liveness,
            heartbeats_record_publisher_outages,
        );
    };
}

/// Generates the store-suite tests that need open write transactions
/// ([`BeginWrite`](crate::testing::BeginWrite)): commit order, late
/// committers, strangers' transactions.
#[macro_export]
macro_rules! commit_order_conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(store_suite, $factory;
            late_committers_are_never_skipped,
            order_is_commit_order,
            strangers_never_hold_publication,
        );
    };
}

/// Generates one `#[tokio::test]` per failure-suite function (the store
/// must implement [`FaultSeams`](crate::testing::FaultSeams)).
#[macro_export]
macro_rules! failure_conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(failure_suite, $factory;
            leases_and_delays_follow_store_time,
            a_host_clock_stepping_back_changes_nothing,
            unreadable_rows_fail_alone,
            crashes_are_blamed_on_the_event_that_caused_them,
            concurrent_duplicate_ids_are_reported,
            slow_settlements_never_block_producers,
        );
    };
}

/// Generates one `#[tokio::test]` per relay-suite function.
#[macro_export]
macro_rules! relay_conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(relay_suite, $factory;
            per_key_order_with_four_relays,
            few_keys_drain_without_idle_waits,
            outage_burns_no_attempts,
            crash_after_publish_before_ack_is_absorbed_by_the_inbox,
            lease_expiry_mid_publish_fences_the_stale_ack,
            attempts_cap_moves_to_failed,
            poison_skip_and_block,
            crash_loop_ends_in_failed,
            publish_timeout_is_a_transient_failure,
            backoff_holds_the_key_back,
            shutdown_drains_the_batch_in_flight,
            shutdown_drain_timeout_releases_leases,
        );
    };
}

/// Generates one `#[tokio::test]` per inbox-suite function.
#[macro_export]
macro_rules! inbox_conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_tests!(inbox_suite, $factory;
            claims_once_per_consumer,
            rollback_drops_claim_and_effect,
            redeliveries_apply_once,
            concurrent_deliveries_apply_once,
            purge_respects_the_window,
        );
    };
}

/// Generates one `#[tokio::test]` per publisher-suite function. `$harness`
/// is an expression (it may `.await`) building a fresh
/// [`PublisherHarness`](crate::testing::PublisherHarness) for each test.
#[macro_export]
macro_rules! publisher_conformance_tests {
    ($harness:expr) => {
        $crate::__publisher_conformance_tests!($harness;
            round_trips_every_field,
            keeps_order_within_a_key,
            empty_batch_is_a_noop,
            unreachable_broker_is_an_outage,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __publisher_conformance_tests {
    ($harness:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $harness;
                $crate::testing::publisher_suite::$name(&harness).await;
            }
        )+
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($suite:ident, $factory:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::testing::$suite::$name(&$factory).await;
            }
        )+
    };
}
