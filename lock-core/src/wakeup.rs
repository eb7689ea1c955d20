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
        let names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = names.get(name).and_then(Weak::upgrade) {
            n.notify_waiters();
        }
    }
}
