//! Coalescing concurrent requests to one server into batches: one request
//! is in flight at a time, and everything that arrived meanwhile goes out
//! together in the next one (group commit). A request that finds the batcher
//! idle runs at once, in the caller's own task, so batching adds no latency
//! (not even a hand-over to another task) to a lone request; under load
//! (the watchdog renewing thousands of leases) one server round trip, one
//! script run or one commit serves many locks.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

use crate::error::LockError;

/// What a batcher runs: one server request for many items, answering one
/// output per item, in order.
pub type BatchFn<I, O> =
    Arc<dyn Fn(Vec<I>) -> BoxFuture<'static, Result<Vec<O>, LockError>> + Send + Sync>;

type Job<I, O> = (I, oneshot::Sender<Result<O, LockError>>);

/// Sends items through `run` in batches of at most `max_batch`, one batch in
/// flight at a time. A call that finds no batch in flight is a batch of
/// one, run in the caller's task; calls made while a batch is in flight
/// wait for it, then go out together from a task spawned on the runtime of
/// the call that ends the batch in flight.
///
/// `run` must bound its own duration (a server timeout): a batch that never
/// finishes holds up every item behind it. It must not own what owns the
/// batcher, or neither is ever freed.
pub struct Batcher<I, O> {
    shared: Arc<Shared<I, O>>,
}

struct Shared<I, O> {
    backend: &'static str,
    max_batch: usize,
    run: BatchFn<I, O>,
    state: Mutex<State<I, O>>,
}

struct State<I, O> {
    /// A batch is in flight (in a caller's task or a spawned one).
    busy: bool,
    /// The calls waiting for the next batch.
    queue: VecDeque<Job<I, O>>,
}

impl<I, O> fmt::Debug for Batcher<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("backend", &self.shared.backend)
            .field("max_batch", &self.shared.max_batch)
            .finish_non_exhaustive()
    }
}

impl<I: Send + 'static, O: Send + 'static> Batcher<I, O> {
    /// A batcher for `backend` (named in its errors) running `run` on up to
    /// `max_batch` items at once (at least one).
    pub fn new(backend: &'static str, max_batch: usize, run: BatchFn<I, O>) -> Self {
        Batcher {
            shared: Arc::new(Shared {
                backend,
                max_batch: max_batch.max(1),
                run,
                state: Mutex::new(State {
                    busy: false,
                    queue: VecDeque::new(),
                }),
            }),
        }
    }

    /// Run `item` in the next batch and return its output. Dropping the
    /// future does not withdraw the item once its batch has left: a batch
    /// run in the caller's task goes on in a task of its own.
    pub async fn call(&self, item: I) -> Result<O, LockError> {
        let queued = {
            let mut state = self.shared.state();
            if state.busy {
                let (reply, answer) = oneshot::channel();
                state.queue.push_back((item, reply));
                Ok(answer)
            } else {
                state.busy = true;
                Err(item)
            }
        };
        match queued {
            Ok(answer) => answer
                .await
                .map_err(|_| self.shared.unavailable("the batching task stopped"))?,
            Err(item) => self.run_alone(item).await,
        }
    }

    /// Run `item` as a batch of one in this task (the batcher marked busy).
    async fn run_alone(&self, item: I) -> Result<O, LockError> {
        let mut inline = Inline {
            shared: Arc::clone(&self.shared),
            batch: (self.shared.run)(vec![item]),
            finished: false,
        };
        let outputs = (&mut inline.batch).await;
        inline.finished = true;
        drop(inline);
        let mut outputs = self.shared.checked(outputs?, 1)?;
        outputs
            .pop()
            .ok_or_else(|| self.shared.unavailable("an empty answer"))
    }
}

/// A batch of one in flight in a caller's task. Dropped, it hands the
/// calls queued meanwhile to a task of their own; dropped before its batch
/// finished (the call was cancelled), that task first finishes the batch.
struct Inline<I: Send + 'static, O: Send + 'static> {
    shared: Arc<Shared<I, O>>,
    batch: BoxFuture<'static, Result<Vec<O>, LockError>>,
    finished: bool,
}

impl<I: Send + 'static, O: Send + 'static> Drop for Inline<I, O> {
    fn drop(&mut self) {
        if self.finished {
            let mut state = self.shared.state();
            if state.queue.is_empty() {
                state.busy = false;
                return;
            }
        }
        let unfinished = (!self.finished).then(|| {
            std::mem::replace(
                &mut self.batch,
                Box::pin(std::future::ready(Ok(Vec::new()))),
            )
        });
        let shared = Arc::clone(&self.shared);
        let work = async move {
            if let Some(batch) = unfinished {
                let _ = batch.await;
            }
            drain(shared).await;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(work)),
            Err(_) => {
                // No runtime to go on in: the queued calls hear that the
                // batching stopped (their answers are dropped).
                let mut state = self.shared.state();
                state.queue.clear();
                state.busy = false;
            }
        }
    }
}

/// Run the queued calls in batches until the queue is empty, then mark the
/// batcher idle.
async fn drain<I: Send + 'static, O: Send + 'static>(shared: Arc<Shared<I, O>>) {
    loop {
        let (items, replies): (Vec<I>, Vec<_>) = {
            let mut state = shared.state();
            if state.queue.is_empty() {
                state.busy = false;
                return;
            }
            let n = state.queue.len().min(shared.max_batch);
            state.queue.drain(..n).unzip()
        };
        let sent = items.len();
        match (shared.run)(items).await {
            Ok(outputs) => match shared.checked(outputs, sent) {
                Ok(outputs) => {
                    for (reply, output) in replies.into_iter().zip(outputs) {
                        let _ = reply.send(Ok(output));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(copy_of(&e)));
                    }
                }
            },
            Err(e) => {
                tracing::debug!(target: "distlock", backend = shared.backend, items = sent,
                    error = %e.report(), "batch failed");
                for reply in replies {
                    let _ = reply.send(Err(copy_of(&e)));
                }
            }
        }
    }
}

impl<I, O> Shared<I, O> {
    fn state(&self) -> MutexGuard<'_, State<I, O>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `outputs` if it answers each of the `sent` items.
    fn checked(&self, outputs: Vec<O>, sent: usize) -> Result<Vec<O>, LockError> {
        if outputs.len() == sent {
            return Ok(outputs);
        }
        Err(LockError::Backend {
            backend: self.backend,
            reason: format!(
                "a batch of {sent} requests was answered with {} results",
                outputs.len()
            ),
            source: None,
        })
    }

    fn unavailable(&self, why: &str) -> LockError {
        LockError::Unavailable {
            backend: self.backend,
            reason: format!("batching requests: {why}"),
            source: None,
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

    /// A call that finds the batcher idle runs in the caller's own task:
    /// no hand-over to another task and back (which cost a lone SQLite
    /// release about a third of its time).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_call_runs_in_the_callers_task() {
        let ran_in = Arc::new(Mutex::new(Vec::new()));
        let run: BatchFn<u32, u32> = {
            let ran_in = Arc::clone(&ran_in);
            Arc::new(move |items: Vec<u32>| {
                ran_in.lock().unwrap().push(tokio::task::try_id());
                Box::pin(async move { Ok(items) })
            })
        };
        let batcher = Arc::new(Batcher::new("test", 10, run));
        let caller = tokio::spawn({
            let batcher = Arc::clone(&batcher);
            async move {
                let answer = batcher.call(7).await.unwrap();
                (answer, tokio::task::try_id())
            }
        });
        let (answer, caller) = caller.await.unwrap();
        assert_eq!(answer, 7);
        assert!(caller.is_some());
        assert_eq!(*ran_in.lock().unwrap(), vec![caller]);
    }

    /// A call dropped while its batch is in flight does not withdraw it:
    /// the batch finishes, and the calls queued behind it are answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_call_still_finishes_its_batch_and_those_behind_it() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let batcher = Arc::new(Batcher::new(
            "test",
            100,
            counting(Arc::clone(&sizes), Arc::new(AtomicUsize::new(0))),
        ));
        let cancelled = tokio::time::timeout(Duration::from_millis(5), batcher.call(1));
        let behind = async {
            tokio::time::sleep(Duration::from_millis(1)).await;
            batcher.call(2).await
        };
        let (cancelled, behind) = tokio::join!(cancelled, behind);
        assert!(cancelled.is_err(), "the first call timed out");
        assert_eq!(behind.unwrap(), 4);
        assert_eq!(*sizes.lock().unwrap(), vec![1, 1]);
        assert_eq!(batcher.call(3).await.unwrap(), 6, "idle again");
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
        let run: BatchFn<u32, u32> = Arc::new(|items: Vec<u32>| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(vec![1; items.len() - 1])
            })
        });
        let batcher = Arc::new(Batcher::new("test", 10, run));
        // The first runs alone; the next two are queued behind it and go
        // out together.
        let (a, b, c) = tokio::join!(batcher.call(1), batcher.call(2), batcher.call(3));
        for (answer, sent) in [(a, 1), (b, 2), (c, 2)] {
            match answer {
                Err(LockError::Backend { reason, .. }) => {
                    let short = format!("{sent} requests was answered with {}", sent - 1);
                    assert!(reason.contains(&short), "{reason}");
                }
                other => panic!("expected a Backend error, got {other:?}"),
            }
        }
    }
}
