//! Wake-ups between clients of one process, for backends whose server
//! cannot notify waiters: a release made by this process wakes this
//! process's waiters for that name at once; other processes still poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;

/// Per-name wake-up signals. Clones share the same signals.
///
/// Entries are weak: a name with no waiter costs nothing once they leave.
#[derive(Clone, Default, Debug)]
pub struct Wakeups {
    names: Arc<Mutex<HashMap<String, Weak<Notify>>>>,
}

impl Wakeups {
    /// A new, empty set of signals.
    pub fn new() -> Self {
        Self::default()
    }

    /// The signal for `name`, shared by every waiter of that name.
    pub fn subscribe(&self, name: &str) -> Arc<Notify> {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = names.get(name).and_then(Weak::upgrade) {
            return n;
        }
        let n = Arc::new(Notify::new());
        // Forget names nobody waits for any more before the map can grow large.
        if names.len() >= 64 && names.len().is_power_of_two() {
            names.retain(|_, w| w.strong_count() > 0);
        }
        names.insert(name.to_string(), Arc::downgrade(&n));
        n
    }

    /// Wake every current waiter of `name` (they retry at once).
    pub fn wake(&self, name: &str) {
        if let Some(n) = self.get(name) {
            n.notify_waiters();
        }
    }

    /// Wake the longest-waiting waiter of `name` only. If it is cancelled
    /// before it runs, the wake-up passes to the next one (tokio's
    /// `Notify::notify_one`); if nobody waits, the next to wait starts awake.
    pub fn wake_one(&self, name: &str) {
        if let Some(n) = self.get(name) {
            n.notify_one();
        }
    }

    /// Wake every waiter of every name (after a connection loss, when
    /// notifications may have been missed).
    pub fn wake_all(&self) {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        for n in names.values().filter_map(Weak::upgrade) {
            n.notify_waiters();
        }
    }

    fn get(&self, name: &str) -> Option<Arc<Notify>> {
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.get(name).and_then(Weak::upgrade)
    }
}
