//! Opt-in reentrancy over any backend, through an explicit owner handle.
//!
//! Java's Redisson and Curator key reentrancy on the calling thread. Async
//! Rust has no such identity: a task hops between threads, and one logical
//! operation may span several tasks. So the owner is an explicit value,
//! [`LockOwner`], that the code passes to whatever should count as "the same
//! holder". Reentrancy is never implied: two `LockOwner`s exclude each other
//! exactly as two processes do.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::guard::RawGuard;
use crate::lock::DistributedLock;
use crate::loss::LossReason;
use crate::options::LockOptions;
use crate::raw::LeaseState;

/// One reentrant holder. Clones are the same holder.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use std::sync::Arc;
/// use lock_core::{LockOptions, LockOwner, MemoryLock};
/// let owner = LockOwner::new(Arc::new(MemoryLock::new()));
/// let outer = owner.acquire("account-7", &LockOptions::new()).await?;
/// let inner = owner.acquire("account-7", &LockOptions::new()).await?; // same owner: counts
/// assert_eq!(owner.hold_count("account-7"), 2);
/// drop(inner);
/// assert!(outer.release().await?); // count reaches zero: released on the server
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockOwner {
    lock: Arc<dyn DistributedLock>,
    held: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
}

#[derive(Default)]
struct Slot {
    /// Serialises this owner's first acquisition of a name.
    acquiring: tokio::sync::Mutex<()>,
    state: Mutex<Option<Held>>,
}

struct Held {
    guard: LockGuard,
    count: usize,
}

impl LockOwner {
    /// A new holder identity over `lock`.
    pub fn new(lock: Arc<dyn DistributedLock>) -> Self {
        LockOwner {
            lock,
            held: Arc::default(),
        }
    }

    fn slot(&self, name: &str) -> Arc<Slot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(held.entry(name.to_string()).or_default())
    }

    /// How many guards this owner holds on `name` right now.
    pub fn hold_count(&self, name: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.get(name)
            .and_then(|s| {
                s.state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .as_ref()
                    .map(|h| h.count)
            })
            .unwrap_or(0)
    }

    /// Acquire `name`, waiting as `opts` says; if this owner already holds
    /// it, count once more and return at once.
    pub async fn acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<ReentrantGuard, LockError> {
        self.enter(name, opts, true)
            .await?
            .ok_or_else(|| LockError::Timeout {
                name: name.to_string(),
                waited: std::time::Duration::ZERO,
            })
    }

    /// One attempt: `Ok(None)` when another owner holds `name`.
    pub async fn try_acquire(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<Option<ReentrantGuard>, LockError> {
        self.enter(name, opts, false).await
    }

    async fn enter(
        &self,
        name: &str,
        opts: &LockOptions,
        wait: bool,
    ) -> Result<Option<ReentrantGuard>, LockError> {
        let slot = self.slot(name);
        let _first = slot.acquiring.lock().await;
        if let Some(g) = self.reenter(&slot, name)? {
            return Ok(Some(g));
        }
        let guard = if wait {
            Some(self.lock.acquire(name, opts).await?)
        } else {
            self.lock.try_acquire(name, opts).await?
        };
        Ok(guard.map(|guard| {
            let lease = Arc::clone(guard.lease());
            let token = guard.fencing_token();
            *slot.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(Held { guard, count: 1 });
            ReentrantGuard {
                name: name.to_string(),
                token,
                lease,
                slot: Some(slot.clone()),
            }
        }))
    }

    /// Count one more level if this owner holds `name`. A held lock that is
    /// lost is an error: the outer levels must notice the loss themselves
    /// rather than have a fresh grant slip in beneath them.
    fn reenter(&self, slot: &Arc<Slot>, name: &str) -> Result<Option<ReentrantGuard>, LockError> {
        let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = state.as_mut() else {
            return Ok(None);
        };
        if let Some(reason) = held.guard.is_lost() {
            return Err(LockError::Lost {
                name: name.to_string(),
                reason,
            });
        }
        held.count += 1;
        Ok(Some(ReentrantGuard {
            name: name.to_string(),
            token: held.guard.fencing_token(),
            lease: Arc::clone(held.guard.lease()),
            slot: Some(Arc::clone(slot)),
        }))
    }
}

impl fmt::Debug for LockOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockOwner")
            .field("backend", &self.lock.capabilities().backend)
            .finish_non_exhaustive()
    }
}

/// One level of a reentrant hold. The lock is released on the server when
/// the last level is dropped or released.
pub struct ReentrantGuard {
    name: String,
    token: Option<u64>,
    lease: Arc<LeaseState>,
    slot: Option<Arc<Slot>>,
}

impl ReentrantGuard {
    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of the underlying grant (the same for every level).
    pub fn fencing_token(&self) -> Option<u64> {
        self.token
    }

    /// Resolves when the underlying lock is known or suspected lost.
    pub async fn lost(&self) -> LossReason {
        self.lease.lost().await
    }

    /// Leave this level. When it was the last one, the lock is released on
    /// the server and the result says whether it was still ours; otherwise
    /// `Ok(true)` (the lock stays held by the remaining levels).
    pub async fn release(mut self) -> Result<bool, LockError> {
        match self.leave() {
            Some(guard) => guard.release().await,
            None => Ok(true),
        }
    }

    /// Decrement the count; hand back the guard when it reaches zero.
    fn leave(&mut self) -> Option<LockGuard> {
        let slot = self.slot.take()?;
        let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
        let held = state.as_mut()?;
        held.count -= 1;
        if held.count == 0 {
            state.take().map(|h| h.guard)
        } else {
            None
        }
    }
}

impl Drop for ReentrantGuard {
    fn drop(&mut self) {
        // Dropping the inner guard releases it in the background.
        drop(self.leave());
    }
}

impl fmt::Debug for ReentrantGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantGuard")
            .field("name", &self.name)
            .field("fencing_token", &self.token)
            .finish_non_exhaustive()
    }
}
