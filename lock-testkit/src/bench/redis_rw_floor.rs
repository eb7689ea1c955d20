//! The hand-written Redis reader-writer lock that the Redis and Redlock
//! benchmarks measure distlock's against: two scripts with the same
//! guarantees as lock-redis's (a lease per holder, a write counter for
//! tokens, writer preference by the waiting writers' marks, a message to
//! the waiters on release), without holder records or lease reports.
//! The benchmarks send them with plain redis-rs.

/// The acquire script: KEYS writer, readers' set, counter, marks; ARGV
/// owner, ttl in ms, `r` or `w`, the readers' key prefix, the arrival in
/// ms. `{1, token}` when granted, else `{0}`.
pub const ACQUIRE: &str = include_str!("rw_floor_acquire.lua");

/// The release script: KEYS the grant's key (the writer's, or the prefix
/// and the owner), the readers' set; ARGV owner, channel. 1 if ours.
pub const RELEASE: &str = include_str!("rw_floor_release.lua");

/// The keys of one floor lock `name` (one hash tag, so one slot).
#[derive(Debug, Clone)]
pub struct Keys {
    /// The writer's key.
    pub writer: String,
    /// The readers' set.
    pub readers: String,
    /// The write counter.
    pub counter: String,
    /// The waiting writers' marks.
    pub marks: String,
    /// The readers' keys' prefix (the owner follows).
    pub reader_prefix: String,
    /// The release channel.
    pub channel: String,
}

impl Keys {
    /// The keys of `name`.
    pub fn of(name: &str) -> Self {
        let key = |part: &str| format!("{{{name}}}:{part}");
        Keys {
            writer: key("w"),
            readers: key("r"),
            counter: key("fence"),
            marks: key("marks"),
            reader_prefix: key("reader:"),
            channel: key("released"),
        }
    }

    /// The key a grant of `owner` for `access` holds.
    pub fn grant(&self, owner: &str, write: bool) -> String {
        if write {
            self.writer.clone()
        } else {
            format!("{}{owner}", self.reader_prefix)
        }
    }
}
