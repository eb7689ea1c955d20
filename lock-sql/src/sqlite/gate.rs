//! SQLite has one writer per file. Writers of one process that contend for
//! it inside SQLite poll its busy handler with sleeps of up to 100 ms,
//! whoever asked first; a renewal stuck behind a crowd of acquisitions that
//! way can miss its lease. So the writers of a process take turns here
//! first, before they take a pooled connection, and renewals and releases
//! (the batches that keep held leases alive or free them) go ahead of
//! acquisitions: they wait for the current writer and at most one queued
//! acquisition, never for the whole queue. Other processes still meet at
//! SQLite's own lock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Mutex as AsyncMutex, MutexGuard};

/// The write turns of one database file in this process.
#[derive(Debug, Default)]
pub(crate) struct WriteGate {
    /// Acquisitions queue here, so that one at most waits at `turn`.
    acquisitions: AsyncMutex<()>,
    /// The turn to write, FIFO.
    turn: AsyncMutex<()>,
}

/// A turn to write; the next writer goes when it is dropped.
pub(crate) struct Turn<'a> {
    _queue: Option<MutexGuard<'a, ()>>,
    _turn: MutexGuard<'a, ()>,
}

impl WriteGate {
    /// A turn for an acquisition (or another write that can wait).
    pub(crate) async fn acquisition(&self) -> Turn<'_> {
        let queue = self.acquisitions.lock().await;
        let turn = self.turn.lock().await;
        Turn {
            _queue: Some(queue),
            _turn: turn,
        }
    }

    /// A turn for a batch of renewals or releases: ahead of acquisitions.
    pub(crate) async fn urgent(&self) -> Turn<'_> {
        Turn {
            _queue: None,
            _turn: self.turn.lock().await,
        }
    }
}

/// The gate of the file at `path`, shared by every `SqliteLock` on it in
/// this process.
pub(crate) fn gate_for(path: &Path) -> Arc<WriteGate> {
    static GATES: OnceLock<Mutex<HashMap<PathBuf, Arc<WriteGate>>>> = OnceLock::new();
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut gates = GATES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Arc::clone(gates.entry(key).or_default())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_urgent_writer_passes_queued_acquisitions() {
        let gate = Arc::new(WriteGate::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let first = gate.acquisition().await;
        let mut waiting = Vec::new();
        for i in 0..5 {
            let (gate, order) = (Arc::clone(&gate), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let _turn = gate.acquisition().await;
                order.lock().unwrap().push(format!("acquisition {i}"));
            }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let urgent = {
            let (gate, order) = (Arc::clone(&gate), Arc::clone(&order));
            tokio::spawn(async move {
                let _turn = gate.urgent().await;
                order.lock().unwrap().push("urgent".to_string());
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        drop(first);
        urgent.await.unwrap();
        for w in waiting {
            w.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let urgent_at = order.iter().position(|o| o == "urgent").unwrap();
        assert!(
            urgent_at <= 1,
            "at most one acquisition goes first: {order:?}"
        );
        assert_eq!(order.len(), 6);
    }
}
