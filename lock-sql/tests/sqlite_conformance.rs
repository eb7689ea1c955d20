//! The conformance suite against SQLite, with two independent clients
//! (separate connection pools) on one database file.

use std::sync::{Arc, OnceLock};

use lock_core::testkit::{FaultHook, Harness, taken_away};
use lock_core::{DistributedLock, LockError, async_trait};
use lock_sql::{SqliteConfig, SqliteLock};

struct SqliteHook(SqliteLock);

#[async_trait]
impl FaultHook for SqliteHook {
    async fn take_away(&self, name: &str) -> Result<(), LockError> {
        taken_away(name, self.0.force_release(name).await?)
    }

    async fn queued(&self, name: &str) -> Result<Option<usize>, LockError> {
        Ok(Some(self.0.queued(name).await? as usize))
    }
}

/// One database file for the whole test binary, so cases run concurrently
/// against the same file (as separate processes would).
fn db_dir() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("temporary directory"))
}

async fn harness() -> Harness {
    let path = db_dir().path().join("conformance.db");
    let lock = SqliteLock::open(&path, SqliteConfig::default())
        .await
        .expect("open sqlite");
    let other = SqliteLock::open(&path, SqliteConfig::default())
        .await
        .expect("open sqlite");
    Harness {
        hook: Arc::new(SqliteHook(lock.clone())),
        lock: Arc::new(lock),
        other: Arc::new(other),
    }
}

lock_core::conformance_suite!(harness());
