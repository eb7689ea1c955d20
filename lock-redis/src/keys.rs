//! Key and channel names. Every name of lock `n` is `PREFIX{e(n)}…`, where
//! `e` escapes `%`, `{` and `}` so that the braces always enclose the whole,
//! non-empty name: the lock key, its fencing counter and its release channel
//! share one Redis Cluster slot, no name can reach outside the prefix, and
//! distinct names never share a key.

/// The names used for locks under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Names under `prefix` (validated by [`RedisConfig`](crate::RedisConfig)).
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    fn tag(&self, name: &str) -> String {
        let mut out = String::with_capacity(self.prefix.len() + name.len() + 2);
        out.push_str(&self.prefix);
        out.push('{');
        if name.contains(['%', '{', '}']) {
            for c in name.chars() {
                match c {
                    '%' => out.push_str("%25"),
                    '{' => out.push_str("%7B"),
                    '}' => out.push_str("%7D"),
                    c => out.push(c),
                }
            }
        } else {
            out.push_str(name);
        }
        out.push('}');
        out
    }

    /// The key holding the owner token, with the lease as its TTL.
    pub fn lock(&self, name: &str) -> String {
        self.tag(name)
    }

    /// The channel the release script publishes on.
    pub fn channel(&self, name: &str) -> String {
        self.tag(name) + ":released"
    }

    /// All names of one semaphore, escaping the name once. They share the
    /// lock's hash tag, and none is a name of the lock.
    pub fn permits(&self, name: &str) -> PermitKeys {
        let tag = self.tag(name);
        let with = |suffix: &str| [tag.as_str(), suffix].concat();
        PermitKeys {
            limit: with(":permits:limit"),
            fence: with(":permits:fence"),
            held: with(":permits"),
            slot_base: with(":permit:"),
            channel: with(":permits:released"),
            wake: format!("permits:{name}"),
        }
    }

    /// All names of one reader-writer lock, escaping the name once. They
    /// share the lock's hash tag, and none is a name of the lock or of the
    /// semaphore.
    pub fn rw(&self, name: &str) -> RwKeys {
        let tag = self.tag(name);
        let with = |suffix: &str| [tag.as_str(), suffix].concat();
        RwKeys {
            writer: with(":rw:writer"),
            reader_base: with(":rw:reader:"),
            readers: with(":rw:readers"),
            fence: with(":rw:fence"),
            held: with(":rw:held"),
            writers_waiting: with(":rw:waiting"),
            channel: with(":rw:released"),
            wake: format!("rw:{name}"),
        }
    }

    /// All names of one lock, escaping the name once.
    pub fn all(&self, name: &str) -> LockKeys {
        let tag = self.tag(name);
        let with = |suffix: &str| [tag.as_str(), suffix].concat();
        LockKeys {
            fence: with(":fence"),
            queue: with(":queue"),
            handoff: with(":handoff"),
            holder: with(":holder"),
            channel: with(":released"),
            changes: with(":changed"),
            lock: tag,
        }
    }
}

/// The keys and channel of one semaphore (see [`Keys::permits`]).
#[derive(Clone)]
pub struct PermitKeys {
    /// The limit the live permits were taken with (no TTL: a permit's
    /// script checks whether any slot below it is still held).
    pub limit: String,
    /// The permits' fencing counter (no TTL, like a lock's): one counter
    /// per name, so each slot's tokens rise too.
    pub fence: String,
    /// A hash: each slot's latest token (field `N`) and holder record
    /// (field `N:holder`), written with the grant.
    pub held: String,
    /// The slot keys' common prefix: slot `N`'s key, which holds its
    /// owner token with the lease as its TTL, is this followed by `N`.
    pub slot_base: String,
    /// The channel a release publishes on.
    pub channel: String,
    /// The message a release publishes: the key this process's waiters
    /// for the semaphore are woken by (never a waiter id, which is hex).
    pub wake: String,
}

impl PermitKeys {
    /// Slot `slot`'s key.
    pub fn slot(&self, slot: u32) -> String {
        format!("{}{slot}", self.slot_base)
    }
}

/// The keys and channel of one reader-writer lock (see [`Keys::rw`]).
#[derive(Clone)]
pub struct RwKeys {
    /// The writer's key: its owner token, with the lease as its TTL.
    pub writer: String,
    /// The readers' keys' common prefix: a reader's key, holding its owner
    /// token with the lease as its TTL, is this followed by the token.
    pub reader_base: String,
    /// A set of the owner tokens of the readers whose keys may be live
    /// (no TTL: the scripts drop a member whose key has gone).
    pub readers: String,
    /// The write grants' counter (no TTL, like a lock's): a write grant's
    /// token, and a reader's.
    pub fence: String,
    /// A hash of holder records: field `writer` for the writer's, a
    /// reader's owner token for its own.
    pub held: String,
    /// A sorted set of waiters: member `ARRIVAL:ID` (the waiter's arrival
    /// in ms by its client's clock, zero-padded; a waiting reader's id
    /// starts with `r`), score the server-time ms its mark lapses unless
    /// renewed.
    pub writers_waiting: String,
    /// The channel a release publishes on.
    pub channel: String,
    /// The message a release publishes: the key this process's waiters
    /// for the lock are woken by.
    pub wake: String,
}

impl RwKeys {
    /// The key of the reader whose owner token is `owner`.
    pub fn reader(&self, owner: &str) -> String {
        [self.reader_base.as_str(), owner].concat()
    }
}

/// The keys and channel of one lock (see [`Keys`]).
#[derive(Clone)]
pub struct LockKeys {
    /// Holds the owner token, with the lease as its TTL.
    pub lock: String,
    /// The fencing counter (no TTL: it must outlive every grant).
    pub fence: String,
    /// The waiter ids, a sorted set ordered by arrival ticket.
    pub queue: String,
    /// The id of the waiter a release handed the lock to, with the hand-off
    /// window as its TTL.
    pub handoff: String,
    /// The latest grant's holder record (identity, time, value), written by
    /// the acquire script with the grant; no TTL, like the fence: the lock
    /// key says whether it is held.
    pub holder: String,
    /// The channel the release script publishes on.
    pub channel: String,
    /// The channel a grant, a release and a new holder record publish on
    /// (the scripts make it from the lock key: `LOCK:changed`), which an
    /// election's observers listen to.
    pub changes: String,
}

impl LockKeys {
    /// This lock's keys in a run of the set script
    /// ([`SET_ACQUIRE`](crate::raw::SET_ACQUIRE)), in its order.
    pub fn in_set(&self) -> [&str; 4] {
        [&self.lock, &self.fence, &self.handoff, &self.holder]
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn braces_always_enclose_the_whole_escaped_name() {
        let k = Keys::new("distlock:");
        assert_eq!(k.lock("a"), "distlock:{a}");
        assert_eq!(k.channel("}x{"), "distlock:{%7Dx%7B}:released");
        assert_ne!(k.lock("%7D"), k.lock("}"));
        let all = k.all("a");
        // The scripts publish changes on the lock key followed by this.
        assert_eq!(all.changes, format!("{}:changed", all.lock));
        let permits = k.permits("a");
        assert_eq!(
            [permits.slot(2), permits.limit, permits.fence, permits.held],
            [
                "distlock:{a}:permit:2",
                "distlock:{a}:permits:limit",
                "distlock:{a}:permits:fence",
                "distlock:{a}:permits"
            ]
        );
        assert_eq!(
            [all.lock, all.fence, all.queue, all.handoff, all.channel],
            [
                "distlock:{a}".to_string(),
                "distlock:{a}:fence".to_string(),
                "distlock:{a}:queue".to_string(),
                "distlock:{a}:handoff".to_string(),
                k.channel("a")
            ]
        );
    }
}
