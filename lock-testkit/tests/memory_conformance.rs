//! The conformance suite against the in-memory backend: every client is a
//! handle on the same store.

use lock_core::MemoryLock;
use lock_testkit::conformance::Harness;

async fn harness() -> Harness {
    let store = MemoryLock::new();
    Harness::of(async || store.clone()).await
}

lock_testkit::conformance_suite!(harness());
