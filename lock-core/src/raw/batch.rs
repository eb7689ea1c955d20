//! Coalescing concurrent requests to one server into batches: one request
//! is in flight at a time, and everything that arrived meanwhile goes out
//! together in the next one (group commit). A request that finds the batcher
//! idle leaves at once, so batching adds no latency to a lone request; under
//! load (the watchdog renewing thousands of leases) one server round trip,
//! one script run or one fsync serves many locks.

use std::fmt;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::error::LockError;

/// What a batcher runs: one server request for many items, answering one
/// output per item, in order.
pub type BatchFn<I, O> =
    Arc<dyn Fn(Vec<I>) -> BoxFuture<'static, Result<Vec<O>, LockError>> + Send + Sync>;

type Job<I, O> = (I, oneshot::Sender<Result<O, LockError>>);

/// Sends items through `run` in batches of at most `max_batch`, one batch in
/// flight at a time. The background task starts on the first call (on the
/// caller's Tokio runtime, again if that runtime has shut down since) and
/// ends when the batcher is dropped.
///
/// `run` must bound its own duration (a server timeout): a batch that never
/// finishes holds up every item behind it. It must not own what owns the
/// batcher, or neither is ever freed.
pub struct Batcher<I, O> {
    backend: &'static str,
    max_batch: usize,
    run: BatchFn<I, O>,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job<I, O>>>>,
}

impl<I, O> fmt::Debug for Batcher<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("backend", &self.backend)
            .field("max_batch", &self.max_batch)
            .finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// A batcher for `backend` (named in its errors) running `run` on up to
    /// `max_batch` items at once (at least one).
    pub fn new(backend: &'static str, max_batch: usize, run: BatchFn<I, O>) -> Self {
        Batcher {
            backend,
            max_batch: max_batch.max(1),
            run,
            jobs: Mutex::new(None),
        }
    }

    /// Run `item` in the next batch and return its output. Dropping the
    /// future does not withdraw the item if its batch has left.
    pub async fn call(&self, item: I) -> Result<O, LockError> {
        let (reply, answer) = oneshot::channel();
        self.send((item, reply))?;
        answer
            .await
            .map_err(|_| self.unavailable("the batching task stopped"))?
    }

    /// Queue `job`, starting the task if there is none (or its runtime is
    /// gone).
    fn send(&self, job: Job<I, O>) -> Result<(), LockError> {
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let job = match jobs.as_ref() {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| self.unavailable("called outside a Tokio runtime"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(drive(
            Arc::clone(&self.run),
            rx,
            self.max_batch,
            self.backend,
        ));
        tx.send(job)
            .map_err(|_| self.unavailable("the batching task stopped"))?;
        *jobs = Some(tx);
        Ok(())
    }

    fn unavailable(&self, why: &str) -> LockError {
        LockError::Unavailable {
            backend: self.backend,
            reason: format!("batching requests: {why}"),
            source: None,
        }
    }
}

async fn drive<I, O>(
    run: BatchFn<I, O>,
    mut jobs: mpsc::UnboundedReceiver<Job<I, O>>,
    max_batch: usize,
    backend: &'static str,
) {
    while let Some(first) = jobs.recv().await {
        let mut items = vec![first.0];
        let mut replies = vec![first.1];
        while items.len() < max_batch {
            match jobs.try_recv() {
                Ok((item, reply)) => {
                    items.push(item);
                    replies.push(reply);
                }
                Err(_) => break,
            }
        }
        let sent = items.len();
        match run(items).await {
            Ok(outputs) if outputs.len() == sent => {
                for (reply, output) in replies.into_iter().zip(outputs) {
                    let _ = reply.send(Ok(output));
                }
            }
            Ok(outputs) => {
                let reason = format!(
                    "a batch of {sent} requests was answered with {} results",
                    outputs.len()
                );
                for reply in replies {
                    let _ = reply.send(Err(LockError::Backend {
                        backend,
                        reason: reason.clone(),
                        source: None,
                    }));
                }
            }
            Err(e) => {
                tracing::debug!(target: "distlock", backend, items = sent, error = %e, "batch failed");
                for reply in replies {
                    let _ = reply.send(Err(copy_of(&e)));
                }
            }
        }
    }
}

/// The same error for another caller: the variant and message are kept, a
/// client library's error becomes its text.
fn copy_of(e: &LockError) -> LockError {
    let source =
        |s: &Option<crate::BoxError>| s.as_ref().map(|s| crate::BoxError::from(s.to_string()));
    match e {
        LockError::Timeout { name, waited } => LockError::Timeout {
            name: name.clone(),
            waited: *waited,
        },
        LockError::Unavailable {
            backend,
            reason,
            source: s,
        } => LockError::Unavailable {
            backend,
            reason: reason.clone(),
            source: source(s),
        },
        LockError::QuorumNotReached {
            acquired,
            needed,
            causes,
        } => LockError::QuorumNotReached {
            acquired: *acquired,
            needed: *needed,
            causes: causes.clone(),
        },
        LockError::NotHeld { name } => LockError::NotHeld { name: name.clone() },
        LockError::Lost { name, reason } => LockError::Lost {
            name: name.clone(),
            reason: reason.clone(),
        },
        LockError::InvalidName { name, reason } => LockError::InvalidName {
            name: name.clone(),
            reason: reason.clone(),
        },
        LockError::InvalidOptions { reason } => LockError::InvalidOptions {
            reason: reason.clone(),
        },
        LockError::InvalidUrl { url, reason } => LockError::InvalidUrl {
            url: url.clone(),
            reason: reason.clone(),
        },
        LockError::LimitReached {
            backend,
            limit,
            advice,
        } => LockError::LimitReached {
            backend,
            limit: *limit,
            advice: advice.clone(),
        },
        LockError::Unsupported { backend, operation } => {
            LockError::Unsupported { backend, operation }
        }
        LockError::Backend {
            backend,
            reason,
            source: s,
        } => LockError::Backend {
            backend,
            reason: reason.clone(),
            source: source(s),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn counting(sizes: Arc<Mutex<Vec<usize>>>, in_flight: Arc<AtomicUsize>) -> BatchFn<u32, u32> {
        Arc::new(move |items: Vec<u32>| {
            let sizes = Arc::clone(&sizes);
            let in_flight = Arc::clone(&in_flight);
            Box::pin(async move {
                assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0, "one at a time");
                sizes.lock().unwrap().push(items.len());
                tokio::time::sleep(Duration::from_millis(20)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok(items.into_iter().map(|i| i * 2).collect())
            })
        })
    }

    #[tokio::test]
    async fn concurrent_calls_share_batches_and_each_gets_its_own_answer() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let batcher = Arc::new(Batcher::new(
            "test",
            100,
            counting(Arc::clone(&sizes), Arc::new(AtomicUsize::new(0))),
        ));
        let calls = (0..250u32).map(|i| {
            let b = Arc::clone(&batcher);
            tokio::spawn(async move { (i, b.call(i).await) })
        });
        for call in futures_util::future::join_all(calls).await {
            let (i, answer) = call.unwrap();
            assert_eq!(answer.unwrap(), i * 2);
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 250);
        assert!(sizes.iter().all(|&n| n <= 100), "{sizes:?}");
        assert!(sizes.len() < 250 / 2, "calls were batched: {sizes:?}");
    }

    #[tokio::test]
    async fn a_lone_call_leaves_at_once() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let batcher = Batcher::new(
            "test",
            100,
            counting(Arc::clone(&sizes), Arc::new(AtomicUsize::new(0))),
        );
        assert_eq!(batcher.call(4).await.unwrap(), 8);
        assert_eq!(batcher.call(5).await.unwrap(), 10);
        assert_eq!(*sizes.lock().unwrap(), vec![1, 1]);
    }

    #[test]
    fn a_batcher_outlives_the_runtime_that_first_used_it() {
        let batcher = Batcher::new(
            "test",
            10,
            counting(
                Arc::new(Mutex::new(Vec::new())),
                Arc::new(AtomicUsize::new(0)),
            ),
        );
        for i in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            assert_eq!(runtime.block_on(batcher.call(i)).unwrap(), i * 2);
        }
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_item_with_the_same_kind() {
        let run: BatchFn<u32, u32> = Arc::new(|_items: Vec<u32>| {
            Box::pin(async {
                Err(LockError::unavailable(
                    "test",
                    "extending locks",
                    std::io::Error::other("connection reset"),
                ))
            })
        });
        let batcher = Arc::new(Batcher::new("test", 10, run));
        let calls = (0..5u32).map(|i| {
            let b = Arc::clone(&batcher);
            tokio::spawn(async move { b.call(i).await })
        });
        for call in futures_util::future::join_all(calls).await {
            let e = call.unwrap().unwrap_err();
            assert!(e.is_transient(), "{e}");
            assert!(
                std::error::Error::source(&e).is_some_and(|s| s.to_string() == "connection reset"),
                "{e:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_short_answer_is_a_backend_error_not_a_panic() {
        let run: BatchFn<u32, u32> = Arc::new(|_items: Vec<u32>| Box::pin(async { Ok(vec![1]) }));
        let batcher = Arc::new(Batcher::new("test", 10, run));
        // Both are queued before the task first runs: one batch of two.
        let (a, b) = tokio::join!(batcher.call(1), batcher.call(2));
        for answer in [a, b] {
            match answer {
                Err(LockError::Backend { reason, .. }) => {
                    assert!(
                        reason.contains("2 requests was answered with 1"),
                        "{reason}"
                    );
                }
                other => panic!("expected a Backend error, got {other:?}"),
            }
        }
    }
}
