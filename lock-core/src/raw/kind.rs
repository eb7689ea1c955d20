//! What a request asks for, read from its options in one place, and the
//! one queue decision every primitive makes: given the entries ahead of
//! one in arrival order, whether it holds, or which entry it waits for
//! (Curator's `getsTheLock`). A backend that queues (ZooKeeper's
//! sequential nodes, etcd's revisions) walks its queue once for every
//! primitive and asks [`Kind::turn`].

use crate::options::LockOptions;
use crate::rw_lock::Access;

/// The primitive a request asks for.
/// Not `non_exhaustive`: a new primitive is a decision every backend's
/// `match` has to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A plain lock (a lock set's member, an election's lock): held alone.
    Lock,
    /// A permit of a semaphore of this limit.
    Permit(u32),
    /// One side of a reader-writer lock.
    Rw(Access),
}

/// Where a queued entry stands, given the entries ahead of it
/// ([`Kind::turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It holds.
    Holds,
    /// It waits for the entry at this index of those ahead: the last one
    /// that keeps it out. Once that one leaves, decide again.
    After(usize),
    /// It waits for any entry ahead to leave (a permit beyond the limit).
    AnyAhead,
}

impl Kind {
    /// The primitive `opts` ask for.
    pub fn of(opts: &LockOptions) -> Kind {
        match (opts.access, opts.permits) {
            (Some(access), _) => Kind::Rw(access),
            (_, Some(limit)) => Kind::Permit(limit),
            _ => Kind::Lock,
        }
    }

    /// Whether an entry of this kind ahead keeps an entry of kind `behind`
    /// out while it is there. Permits are counted, not kept out one by
    /// one ([`turn`](Self::turn)).
    pub fn keeps_out(self, behind: Kind) -> bool {
        match (self, behind) {
            (Kind::Rw(ahead), Kind::Rw(behind)) => ahead.keeps_out(behind),
            (Kind::Permit(_), Kind::Permit(_)) => false,
            _ => true,
        }
    }

    /// The turn of an entry of this kind behind `ahead` (the entries
    /// before it, in arrival order). An entry that leaves never keeps
    /// anyone out longer, so a waiter may drop an entry it saw leave and
    /// decide again without reading the queue again.
    pub fn turn(self, ahead: &[Kind]) -> Turn {
        match self {
            Kind::Permit(limit) if ahead.len() < limit as usize => Turn::Holds,
            Kind::Permit(_) => Turn::AnyAhead,
            _ => match ahead.iter().rposition(|k| k.keeps_out(self)) {
                Some(at) => Turn::After(at),
                None => Turn::Holds,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Kind = Kind::Rw(Access::Read);
    const W: Kind = Kind::Rw(Access::Write);
    const U: Kind = Kind::Rw(Access::Upgradeable);

    #[test]
    fn the_options_name_the_kind() {
        let o = LockOptions::new();
        assert_eq!(Kind::of(&o), Kind::Lock);
        assert_eq!(Kind::of(&o.clone().permits(3)), Kind::Permit(3));
        assert_eq!(Kind::of(&o.access(Access::Read)), R);
    }

    #[test]
    fn a_lock_and_a_writer_wait_for_the_one_just_ahead() {
        assert_eq!(Kind::Lock.turn(&[]), Turn::Holds);
        assert_eq!(Kind::Lock.turn(&[Kind::Lock; 3]), Turn::After(2));
        assert_eq!(W.turn(&[]), Turn::Holds);
        assert_eq!(W.turn(&[W, R, R]), Turn::After(2));
    }

    #[test]
    fn a_reader_waits_for_the_last_writer_ahead() {
        assert_eq!(R.turn(&[R, R]), Turn::Holds);
        assert_eq!(R.turn(&[R, W, R, U]), Turn::After(1));
        assert_eq!(U.turn(&[R, U, R]), Turn::After(1));
        assert_eq!(R.turn(&[U]), Turn::Holds);
    }

    #[test]
    fn the_first_permits_up_to_the_limit_hold() {
        let ahead = [Kind::Permit(2); 2];
        assert_eq!(Kind::Permit(3).turn(&ahead), Turn::Holds);
        assert_eq!(Kind::Permit(2).turn(&ahead), Turn::AnyAhead);
    }

    /// Dropping any entry ahead never turns a holder into a waiter, nor
    /// moves what a waiter waits for further back: what lets a waiter
    /// decide again without listing.
    #[test]
    fn an_entry_leaving_never_keeps_anyone_out_longer() {
        let kinds = [R, W, U, Kind::Lock];
        let mut queues: Vec<Vec<Kind>> = vec![vec![]];
        for _ in 0..4 {
            let longer: Vec<Vec<Kind>> = queues
                .iter()
                .flat_map(|q| {
                    kinds.iter().map(move |k| {
                        let mut q = q.clone();
                        q.push(*k);
                        q
                    })
                })
                .collect();
            queues.extend(longer);
        }
        for q in &queues {
            for us in kinds.into_iter().chain([Kind::Permit(2)]) {
                let before = us.turn(q);
                for gone in 0..q.len() {
                    let mut rest = q.clone();
                    rest.remove(gone);
                    let after = us.turn(&rest);
                    if before == Turn::Holds {
                        assert_eq!(after, Turn::Holds, "{us:?} behind {q:?} without {gone}");
                    }
                    if let (Turn::After(was), Turn::After(now)) = (before, after) {
                        assert!(now <= was, "{us:?} behind {q:?} without {gone}");
                    }
                }
            }
        }
    }
}
