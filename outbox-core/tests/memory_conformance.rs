//! Every conformance suite, run on the in-memory backends.

use std::sync::Arc;

use outbox_core::ManualClock;
use outbox_core::memory::MemoryStore;
use outbox_core::testing::MemoryInboxHarness;

async fn memory_store(clock: ManualClock) -> Arc<MemoryStore> {
    Arc::new(MemoryStore::with_clock(Arc::new(clock)))
}

async fn memory_inbox(clock: ManualClock) -> Arc<MemoryInboxHarness> {
    Arc::new(MemoryInboxHarness::new(clock))
}

mod store {
    outbox_core::store_conformance_tests!(super::memory_store);

    outbox_core::commit_order_conformance_tests!(super::memory_store);
}

mod relay {
    outbox_core::relay_conformance_tests!(super::memory_store);
}

mod failure {
    outbox_core::failure_conformance_tests!(super::memory_store);
}

mod inbox {
    outbox_core::inbox_conformance_tests!(super::memory_inbox);
}

mod publisher {
    outbox_core::publisher_conformance_tests!(outbox_core::testing::RecordingHarness::default());
}
