//! What the tests of the `distlock` binary share.

#![allow(dead_code)]

use tokio::process::Command;

/// A server URL from the environment; a missing one is a failure.
pub(crate) fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| {
        panic!("{key} is not set: start the servers with scripts/services.sh up")
    })
}

/// A lock name no other run uses.
pub(crate) fn unique(case: &str) -> String {
    format!("cli/{case}/{:016x}", rand_u64())
}

/// A random number (no extra dependency).
pub(crate) fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

/// The `distlock` binary, without a `DISTLOCK_URL` from the test's environment.
pub(crate) fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command.env_remove("DISTLOCK_URL").kill_on_drop(true);
    command
}

/// Lossy UTF-8 of a process's output.
pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
