//! Releases that do not depend on the runtime a lock was taken on.
//!
//! A guard dropped in async code releases in a task spawned on the current
//! runtime. A runtime that is shutting down drops its tasks without running
//! them: a `current_thread` `main` that drops a guard and returns, a
//! `#[tokio::test]` that ends, a task holding a guard that the shutdown
//! cancels. The lock then stayed held until its lease or session ended.
//!
//! Here, a background release whose task is dropped unfinished, and a guard
//! dropped outside any runtime, fall back to the handle's
//! [`detached_release`](GuardHandle::detached_release): a release on a
//! connection of its own, run on a thread and a runtime of its own, waited
//! for (at most [`DETACHED_PATIENCE`]) before the drop returns, so that the
//! shutdown that dropped the guard does not end the process before the lock
//! is given back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::raw::GuardHandle;

/// A release that needs nothing from the runtime the lock was taken on (it
/// opens a connection of its own): what
/// [`GuardHandle::detached_release`] returns.
pub type DetachedRelease = Pin<Box<dyn Future<Output = Result<bool, LockError>> + Send + 'static>>;

/// How long a detached release may take, connection included, before the
/// drop that waits for it gives up (the lease or session then ends the
/// lock).
pub const DETACHED_PATIENCE: Duration = Duration::from_secs(5);

/// Run `handle`'s detached release to its end (or [`DETACHED_PATIENCE`]) on
/// a thread with a runtime of its own, and wait for it. A handle without
/// one leaves the lock to its lease or session.
pub(crate) fn release_detached(handle: &dyn GuardHandle, name: &str) {
    let Some(release) = handle.detached_release() else {
        tracing::debug!(target: "distlock",
            lock = %name,
            "no runtime left to release on; the server frees the lock when its lease or session ends"
        );
        return;
    };
    let thread = std::thread::Builder::new()
        .name("distlock-release".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| {
                    failed(format!("starting a runtime for a release at shutdown: {e}"))
                })?;
            rt.block_on(async {
                tokio::time::timeout(DETACHED_PATIENCE, release)
                    .await
                    .unwrap_or_else(|_| {
                        Err(failed(format!(
                            "a release at shutdown got no answer within {DETACHED_PATIENCE:?}"
                        )))
                    })
            })
        });
    let outcome = match thread {
        Ok(thread) => thread
            .join()
            .unwrap_or_else(|_| Err(failed("the release thread panicked".into()))),
        Err(e) => Err(failed(format!(
            "starting a thread for a release at shutdown: {e}"
        ))),
    };
    match outcome {
        Ok(true) => {
            tracing::debug!(target: "distlock", lock = %name, "released at shutdown, on a connection of its own")
        }
        Ok(false) => {
            tracing::debug!(target: "distlock", lock = %name, "at shutdown, the dropped guard's lock was no longer held")
        }
        Err(e) => tracing::warn!(target: "distlock",
            lock = %name, error = %e.report(),
            "release at shutdown failed; the server frees the lock when its lease or session ends"
        ),
    }
}

/// A release at shutdown that could not be run or answered.
fn failed(reason: String) -> LockError {
    LockError::Unavailable {
        backend: "distlock",
        reason,
        source: None,
    }
}

/// Run `work` (a release of `handle`'s lock) as a task on `rt`. If the
/// runtime drops the task before `work` is done (it is shutting down), the
/// handle's detached release runs instead, before the drop returns.
pub(crate) fn spawn_release<F>(
    rt: &tokio::runtime::Handle,
    handle: Arc<dyn GuardHandle>,
    name: String,
    work: F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let fallback = Unfinished {
        handle: Some(handle),
        name,
    };
    rt.spawn(async move {
        let mut fallback = fallback;
        work.await;
        fallback.handle = None;
    });
}

/// Armed while a background release has not finished; dropped armed, it
/// runs the detached release.
struct Unfinished {
    handle: Option<Arc<dyn GuardHandle>>,
    name: String,
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            release_detached(handle.as_ref(), &self.name);
        }
    }
}
