//! Lock sets: several names held all or none ([`LockSetExt`]).
//!
//! Where the backend takes a whole set in one request
//! ([`Capabilities::atomic_sets`]), a try is that request: all or none on
//! the server, nobody ever sees part of the set held, and a refused set
//! took nothing. A wait starts with that request and, if the set is not
//! free, goes on as below.
//!
//! Elsewhere (and for larger sets) the names are deduplicated and taken
//! one by one in one total order (their bytes' order), so two clients that
//! want overlapping sets never wait for each other in a circle: the one
//! that holds the lowest name both want goes first. The whole set shares
//! one wait: each member waits only for what is left of it. A set that
//! cannot be completed gives back every member it took before returning; a
//! dropped acquisition leaves nothing held (each member taken is a guard,
//! released on drop, and a member's own acquisition is cancel-safe).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::lock::DistributedLock;
use crate::loss::LossReason;
use crate::name::validate_name;
use crate::options::{LockOptions, Wait};
use crate::raw::wait_deadline;

/// The most names one set takes.
pub const MAX_SET_NAMES: usize = 1024;

/// Several names held all or none: `acquire_all` and `try_acquire_all` on
/// every [`DistributedLock`] (a blanket implementation; bring the trait
/// into scope).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions, LockSetExt, MemoryLock};
/// let locks = MemoryLock::new();
/// // A transfer between two accounts: both or neither, whichever order
/// // another transfer names them in.
/// let both = locks
///     .acquire_all(&["account/17", "account/4"], &LockOptions::new())
///     .await?;
/// assert_eq!(both.names().collect::<Vec<_>>(), ["account/17", "account/4"]);
/// let token = both.fencing_token("account/4");
/// assert!(token.is_some());
/// assert!(both.release().await?);
/// # Ok(()) }
/// ```
#[async_trait]
pub trait LockSetExt: DistributedLock {
    /// Take every name in `names` now, or none: `Ok(None)` when one of them
    /// is held by someone else (the members already taken are given back
    /// first). `opts.wait` is not used.
    async fn try_acquire_all<S>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<Option<LockSet>, LockError>
    where
        S: AsRef<str> + Sync;

    /// Take every name in `names`, waiting as `opts.wait` says for the
    /// whole set (then [`LockError::Timeout`], naming the member waited
    /// for, with every member taken given back first). Any other error of a
    /// member is returned the same way. Cancel-safe.
    async fn acquire_all<S>(&self, names: &[S], opts: &LockOptions) -> Result<LockSet, LockError>
    where
        S: AsRef<str> + Sync;
}

#[async_trait]
impl<L: DistributedLock + ?Sized> LockSetExt for L {
    async fn try_acquire_all<S>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<Option<LockSet>, LockError>
    where
        S: AsRef<str> + Sync,
    {
        let names = set_names(names, opts)?;
        if let Some(atomic) = try_atomically(self, &names, opts).await {
            return atomic;
        }
        let mut taken = Vec::with_capacity(names.len());
        for name in &names {
            match self.try_acquire(name, opts).await {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => {
                    give_back(taken).await;
                    return Ok(None);
                }
                Err(e) => {
                    give_back(taken).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(LockSet { guards: taken }))
    }

    async fn acquire_all<S>(&self, names: &[S], opts: &LockOptions) -> Result<LockSet, LockError>
    where
        S: AsRef<str> + Sync,
    {
        let names = set_names(names, opts)?;
        let start = Instant::now();
        if let Some(atomic) = try_atomically(self, &names, opts).await
            && let Some(set) = atomic?
        {
            return Ok(set);
        }
        let deadline = wait_deadline(start, opts.wait);
        let timeout = |name: &str| LockError::Timeout {
            name: name.to_string(),
            waited: start.elapsed(),
        };
        loop {
            let mut taken: Vec<LockGuard> = Vec::with_capacity(names.len());
            for name in &names {
                let member = match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
                    None => self.acquire(name, opts).await,
                    Some(left) if left.is_zero() => match self.try_acquire(name, opts).await {
                        Ok(Some(guard)) => Ok(guard),
                        Ok(None) => Err(timeout(name)),
                        Err(e) => Err(e),
                    },
                    Some(left) => {
                        self.acquire(name, &opts.clone().wait(Wait::UpTo(left)))
                            .await
                    }
                };
                match member {
                    Ok(guard) => taken.push(guard),
                    Err(e) => {
                        give_back(taken).await;
                        return Err(match e {
                            LockError::Timeout { name, .. } => timeout(&name),
                            e => e,
                        });
                    }
                }
            }
            // A member taken early may have been lost while a later one was
            // waited for (its lease ran out unrenewed, its session ended):
            // the set is not held; take it again while the wait lasts.
            let Some(lost) = taken.iter().find(|g| g.is_lost().is_some()) else {
                return Ok(LockSet { guards: taken });
            };
            let name = lost.name().to_string();
            tracing::debug!(target: "distlock", name, "a lock set's member was lost before the set was complete; taking it again");
            give_back(taken).await;
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timeout(&name));
            }
        }
    }
}

/// The one request for the whole set ([`DistributedLock::try_acquire_set`])
/// where `lock` takes a set of this size so; `None` where it does not.
async fn try_atomically<L: DistributedLock + ?Sized>(
    lock: &L,
    names: &[String],
    opts: &LockOptions,
) -> Option<Result<Option<LockSet>, LockError>> {
    if names.len() > lock.capabilities().atomic_sets {
        return None;
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    Some(
        lock.try_acquire_set(&names, opts)
            .await
            .map(|granted| granted.map(|guards| LockSet { guards })),
    )
}

/// That a backend with `caps` takes a set of `len` names in one request
/// ([`Capabilities::atomic_sets`]).
pub(crate) fn check_atomic_set(caps: &Capabilities, len: usize) -> Result<(), LockError> {
    match caps.atomic_sets {
        0 => Err(LockError::Unsupported {
            backend: caps.backend,
            operation: "atomic lock sets",
        }),
        most if len > most => Err(LockError::invalid_options(format!(
            "{} takes at most {most} names in one request, this set has {len}",
            caps.backend
        ))),
        _ => Ok(()),
    }
}

/// The names of a set, deduplicated, in the order they are taken; with
/// the request checked.
pub(crate) fn set_names<S: AsRef<str>>(
    names: &[S],
    opts: &LockOptions,
) -> Result<Vec<String>, LockError> {
    if opts.permits.is_some() {
        return Err(LockError::invalid_options(
            "a lock set takes locks, not a semaphore's permits (LockOptions::permits)",
        ));
    }
    if let Some(access) = opts.access {
        return Err(LockError::invalid_options(format!(
            "a lock set takes locks, not {access} locks (LockOptions::access)"
        )));
    }
    let mut set: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        let name = name.as_ref();
        validate_name(name)?;
        set.push(name.to_string());
    }
    set.sort_unstable();
    set.dedup();
    match set.len() {
        0 => Err(LockError::invalid_options(
            "a lock set needs at least one name",
        )),
        n if n > MAX_SET_NAMES => Err(LockError::invalid_options(format!(
            "a lock set takes at most {MAX_SET_NAMES} names, this one has {n}"
        ))),
        _ => Ok(set),
    }
}

/// Release every guard at once (the set's members, in any order: nobody
/// waits on a member held by a set that is giving up).
async fn give_back(taken: Vec<LockGuard>) {
    join_all(taken.into_iter().map(|guard| async move {
        let name = guard.name().to_string();
        if let Err(e) = guard.release().await {
            tracing::debug!(target: "distlock", name, error = %e.report(), "giving back a lock set's member");
        }
    }))
    .await;
}

/// A member of a [`LockSet`] that was lost ([`LockSet::lost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberLost {
    /// The member's name.
    pub name: String,
    /// Why it was lost.
    pub reason: LossReason,
}

impl fmt::Display for MemberLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock {:?} of the set: {}", self.name, self.reason)
    }
}

/// Several locks held together ([`LockSetExt::acquire_all`]): one guard per
/// name, in the order they were taken (the names' order). Each member keeps
/// its own lease, renewal and fencing token (tokens are per name); the set
/// is lost when any member is. Dropping the set releases every member.
#[derive(Debug)]
pub struct LockSet {
    guards: Vec<LockGuard>,
}

impl LockSet {
    /// The names held, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::name)
    }

    /// How many names are held.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether the set holds no name (never, for a set that was granted).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// The members' guards, in order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The guard of `name`, if the set holds it.
    pub fn get(&self, name: &str) -> Option<&LockGuard> {
        self.guards
            .binary_search_by(|g| g.name().cmp(name))
            .ok()
            .map(|at| &self.guards[at])
    }

    /// The fencing token of member `name` (pass each protected item the
    /// token of its own name).
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(LockGuard::fencing_token)
    }

    /// Every member's fencing token, by name.
    pub fn fencing_tokens(&self) -> Vec<(&str, Option<u64>)> {
        self.guards
            .iter()
            .map(|g| (g.name(), g.fencing_token()))
            .collect()
    }

    /// Resolves when any member is known or suspected lost, naming it. Use
    /// it in `tokio::select!` to stop the work the set protects.
    pub async fn lost(&self) -> MemberLost {
        if self.guards.is_empty() {
            return std::future::pending().await;
        }
        let (lost, _, _) = select_all(self.guards.iter().map(|g| {
            Box::pin(async move {
                MemberLost {
                    name: g.name().to_string(),
                    reason: g.lost().await,
                }
            })
        }))
        .await;
        lost
    }

    /// A member lost right now, if any.
    pub fn is_lost(&self) -> Option<MemberLost> {
        self.guards.iter().find_map(|g| {
            g.is_lost().map(|reason| MemberLost {
                name: g.name().to_string(),
                reason,
            })
        })
    }

    /// `Ok` while every member is held ([`LockGuard::ensure_held`]); else
    /// [`LockError::Lost`] naming a lost one. The check before each write
    /// the set protects.
    pub fn ensure_held(&self) -> Result<(), LockError> {
        self.guards.iter().try_for_each(LockGuard::ensure_held)
    }

    /// The earliest member's validity deadline: the set is held until
    /// then at least. `None` when every member is held by a connection or
    /// session.
    pub fn validity_deadline(&self) -> Option<Instant> {
        self.guards
            .iter()
            .filter_map(LockGuard::validity_deadline)
            .min()
    }

    /// Prolong every member to `ttl` from now (all at once). The set's new
    /// validity deadline, the earliest member's; the first member's error
    /// if any member could not be prolonged (every member was asked).
    pub async fn extend(&self, ttl: Duration) -> Result<Option<Instant>, LockError> {
        let extended = join_all(self.guards.iter().map(|g| g.extend(ttl))).await;
        let mut earliest: Option<Instant> = None;
        for deadline in extended {
            if let Some(d) = deadline? {
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
            }
        }
        Ok(earliest)
    }

    /// Give every member back (all at once): `Ok(true)` if every one was
    /// still ours. A member's error is returned after every member was
    /// released; [`release_each`](Self::release_each) tells per name.
    pub async fn release(self) -> Result<bool, LockError> {
        let mut all_ours = true;
        let mut failed = None;
        for (_, released) in self.release_each().await {
            match released {
                Ok(ours) => all_ours &= ours,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(all_ours),
        }
    }

    /// Give every member back (all at once), and say per name whether it
    /// was still ours.
    pub async fn release_each(self) -> Vec<(String, Result<bool, LockError>)> {
        join_all(self.guards.into_iter().map(|guard| async move {
            let name = guard.name().to_string();
            (name, guard.release().await)
        }))
        .await
    }

    /// The members' guards, to keep or release apart.
    pub fn into_guards(self) -> Vec<LockGuard> {
        self.guards
    }
}
