//! Fanning one request out to every node at once and counting the answers.

use std::future::Future;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use lock_core::LockError;

/// Each node's answer, by node index; `None` for a node whose answer was not
/// waited for because the outcome was already decided.
pub(crate) type Replies<T> = Vec<Option<Result<T, LockError>>>;

/// What becomes of requests still in flight once the outcome is decided.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stragglers {
    /// Dropped: a request not yet sent (its node reconnecting) is never
    /// sent. Used for refused acquires, which must not land after the
    /// caller has moved on.
    Drop,
    /// Run to completion in the background (granted acquires, releases,
    /// renewals, fencing writes: harmless if late, and worth delivering).
    Finish,
}

/// Run `requests` (one per node) concurrently and collect their answers
/// until `decided` says the outcome is settled or every node has answered.
/// Each request is bounded by the node timeout, so this is too; a slow node
/// never delays the caller once the outcome is decided.
pub(crate) async fn gather<T, Fut>(
    requests: impl IntoIterator<Item = Fut>,
    stragglers: Stragglers,
    decided: impl FnMut(&Replies<T>) -> bool,
) -> Replies<T>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, LockError>> + Send + 'static,
{
    gather_then(requests, decided, move |_| stragglers).await
}

/// [`gather`], with what becomes of the requests still in flight chosen
/// by the decided outcome (`stragglers`, given the replies so far).
pub(crate) async fn gather_then<T, Fut>(
    requests: impl IntoIterator<Item = Fut>,
    mut decided: impl FnMut(&Replies<T>) -> bool,
    stragglers: impl FnOnce(&Replies<T>) -> Stragglers,
) -> Replies<T>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, LockError>> + Send + 'static,
{
    let mut pending: FuturesUnordered<_> = requests
        .into_iter()
        .enumerate()
        .map(|(i, request)| async move { (i, request.await) })
        .collect();
    let mut replies: Replies<T> = (0..pending.len()).map(|_| None).collect();
    while let Some((i, reply)) = pending.next().await {
        replies[i] = Some(reply);
        if decided(&replies) {
            if stragglers(&replies) == Stragglers::Finish
                && !pending.is_empty()
                && let Ok(rt) = tokio::runtime::Handle::try_current()
            {
                rt.spawn(async move { while pending.next().await.is_some() {} });
            }
            break;
        }
    }
    replies
}

/// An acquisition fanned out to every node (one request each): answers
/// are gathered until `q` nodes `granted` or so many `refused` or failed
/// that `q` can no longer be reached. Once granted, the slower nodes'
/// requests run on, so the grant lands on every node that takes it and
/// survives the loss of any minority (a restarted node, its script cache
/// empty, answers three round trips late and was otherwise always cut
/// off); refused, they are dropped: a request not yet sent must not land
/// after the caller has moved on.
pub(crate) async fn gather_grants<T, Fut>(
    requests: impl IntoIterator<Item = Fut>,
    q: usize,
    granted: impl Fn(&T) -> bool + Copy,
    refused: impl Fn(&T) -> bool + Copy,
) -> Replies<T>
where
    T: Send + 'static,
    Fut: Future<Output = Result<T, LockError>> + Send + 'static,
{
    let requests: Vec<Fut> = requests.into_iter().collect();
    let n = requests.len();
    gather_then(
        requests,
        |r| count(r, granted) >= q || n - count(r, refused) - failed(r) < q,
        |r| {
            if count(r, granted) >= q {
                Stragglers::Finish
            } else {
                Stragglers::Drop
            }
        },
    )
    .await
}

/// An acquisition sent to the nodes one at a time, in their order,
/// stopping at the first that `refused` (the rest are not sent). The order
/// breaks a split vote as ordered lock acquisition breaks a circle: of
/// contenders that all go this way, the one the first live node grants is
/// refused nowhere after it, and the others stop there, holding nothing.
pub(crate) async fn gather_in_order<T, Fut>(
    requests: impl IntoIterator<Item = Fut>,
    refused: impl Fn(&T) -> bool,
) -> Replies<T>
where
    Fut: Future<Output = Result<T, LockError>>,
{
    let mut replies = Vec::new();
    let mut stopped = false;
    for request in requests {
        if stopped {
            replies.push(None);
            continue;
        }
        let reply = request.await;
        stopped = matches!(&reply, Ok(v) if refused(v));
        replies.push(Some(reply));
    }
    replies
}

/// How many answers satisfy `pred`.
pub(crate) fn count<T>(replies: &Replies<T>, pred: impl Fn(&T) -> bool) -> usize {
    replies
        .iter()
        .filter(|r| matches!(r, Some(Ok(v)) if pred(v)))
        .count()
}

/// How many nodes failed (error or timeout).
pub(crate) fn failed<T>(replies: &Replies<T>) -> usize {
    replies.iter().filter(|r| matches!(r, Some(Err(_)))).count()
}

/// The majority of `n` nodes.
pub(crate) fn majority(n: usize) -> usize {
    n / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::causes;

    #[test]
    fn majorities() {
        assert_eq!(
            [1, 3, 5, 7].map(majority),
            [1, 2, 3, 4],
            "any two majorities of the same set intersect"
        );
    }

    #[tokio::test]
    async fn stops_once_decided_and_counts() {
        let requests = (0..5u32).map(|i| async move {
            if i == 4 {
                std::future::pending::<()>().await;
            }
            if i == 1 {
                Err(LockError::invalid_options("node down"))
            } else {
                Ok(i)
            }
        });
        let replies = gather(requests, Stragglers::Drop, |r| count(r, |_| true) >= 3).await;
        assert!(replies[4].is_none(), "the straggler was not waited for");
        assert_eq!(count(&replies, |&v| v % 2 == 0), 2);
        assert_eq!(failed(&replies), 1);
        let names: Vec<String> = (0..5).map(|i| format!("n{i}")).collect();
        let causes = causes(&replies, &names);
        assert_eq!(causes.len(), 1);
        assert!(causes[0].starts_with("n1: "), "{causes:?}");
    }

    /// A straggler runs on when the outcome says so, and is dropped when
    /// it does not.
    #[tokio::test]
    async fn the_outcome_chooses_whether_stragglers_run_on() {
        for finish in [true, false] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let mut tx = Some(tx);
            let requests = (0..3u32).map(|i| {
                let tx = if i == 2 { tx.take() } else { None };
                async move {
                    if let Some(tx) = tx {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        let _ = tx.send(());
                    }
                    Ok(i)
                }
            });
            let replies = gather_then(
                requests,
                |r| count(r, |_| true) >= 2,
                |_| {
                    if finish {
                        Stragglers::Finish
                    } else {
                        Stragglers::Drop
                    }
                },
            )
            .await;
            assert!(replies[2].is_none(), "decided before the straggler");
            let ran = tokio::time::timeout(std::time::Duration::from_secs(2), rx).await;
            assert_eq!(matches!(ran, Ok(Ok(()))), finish, "finish = {finish}");
        }
    }
}
