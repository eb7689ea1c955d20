//! Where a lock lives: its subject in the bucket's stream, the subject its
//! releases are announced on, and the headers its messages carry.

use lock_core::raw::WaitMark;

/// The header naming the acquisition that wrote a lock's message (a random
/// owner token): renewals and releases compare it.
pub(crate) const OWNER: &str = "Distlock-Owner";

/// The header carrying the grant's fencing token on the messages that
/// renew it (the grant's own message is its token).
pub(crate) const TOKEN: &str = "Distlock-Token";

/// The header naming the subjects (a wildcard) a publish's
/// `Nats-Expected-Last-Subject-Sequence` is checked against, in place of
/// its own subject (nats-server 2.11).
pub(crate) const EXPECTED_SUBJECTS: &str = "Nats-Expected-Last-Subject-Sequence-Subject";

/// The header carrying a permit's limit (the limit its semaphore was
/// asked with) on each of its messages.
pub(crate) const LIMIT: &str = "Distlock-Limit";

/// The subjects of one lock name. A name is one subject token of its own
/// ([`token`]), so it can never reach another's subject or a wildcard.
#[derive(Clone)]
pub(crate) struct Subjects {
    /// The lock's message: `$KV.BUCKET.lock.TOKEN`.
    pub(crate) lock: String,
    /// Where its releases are announced to waiters (core NATS, not kept):
    /// `distlock.BUCKET.released.TOKEN`.
    pub(crate) released: String,
}

impl Subjects {
    /// The subjects of `name` in `bucket`.
    pub(crate) fn of(bucket: &str, name: &str) -> Self {
        let token = token(name);
        Subjects {
            lock: format!("$KV.{bucket}.lock.{token}"),
            released: format!("distlock.{bucket}.released.{token}"),
        }
    }
}

/// A waiter's mark, as its subject's last token reads (`ARRIVAL-ID`): the
/// arrival in 16 digits, so that marks order as text, then the mark's id.
/// Marks order by arrival, then id: a writer's id (hexadecimal) before a
/// reader's of the same millisecond.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Mark {
    pub(crate) arrival: u64,
    pub(crate) id: String,
}

impl Mark {
    /// The mark's subject token.
    fn token(arrival: u64, id: &str) -> String {
        format!("{arrival:016}-{id}")
    }

    /// The mark a subject token reads as.
    fn read(token: &str) -> Option<Mark> {
        let (arrival, id) = token.split_once('-')?;
        Some(Mark {
            arrival: arrival.parse().ok()?,
            id: id.to_string(),
        })
    }

    /// Whether a waiting reader left it.
    pub(crate) fn reader(&self) -> bool {
        WaitMark::is_reader_id(&self.id)
    }
}

/// The subjects of one semaphore: one per slot and limit, each holding
/// the message of the permit on it, and the waiters' marks (`q.ARRIVAL-ID`).
#[derive(Clone)]
pub(crate) struct PermitSubjects {
    /// Every permit's subject and every mark's: `$KV.BUCKET.sem.TOKEN.*.*`.
    pub(crate) filter: String,
    /// Where its releases are announced: `distlock.BUCKET.permits.TOKEN`.
    released: String,
    /// A permit's subject without the limit and slot:
    /// `$KV.BUCKET.sem.TOKEN.`.
    base: String,
}

impl PermitSubjects {
    /// The subjects of semaphore `name` in `bucket`.
    pub(crate) fn of(bucket: &str, name: &str) -> Self {
        let token = token(name);
        let base = format!("$KV.{bucket}.sem.{token}.");
        PermitSubjects {
            filter: format!("{base}*.*"),
            released: format!("distlock.{bucket}.permits.{token}"),
            base,
        }
    }

    /// The subjects of a permit on `slot` asked with `limit`
    /// (`…sem.TOKEN.LIMIT.SLOT`): its own message, and the semaphore's
    /// announcements.
    pub(crate) fn slot(&self, limit: u32, slot: u32) -> Subjects {
        Subjects {
            lock: format!("{}{limit}.{slot}", self.base),
            released: self.released.clone(),
        }
    }

    /// The announcements of releases, for waiters.
    pub(crate) fn released(&self) -> &str {
        &self.released
    }

    /// A waiter's mark: its arrival (milliseconds) and its id.
    pub(crate) fn mark(&self, arrival: u64, id: &str) -> String {
        format!("{}q.{}", self.base, Mark::token(arrival, id))
    }

    /// The mark one of this semaphore's subjects is, if it is one.
    pub(crate) fn mark_of(&self, subject: &str) -> Option<Mark> {
        Mark::read(subject.strip_prefix(&self.base)?.strip_prefix("q.")?)
    }

    /// The limit and the slot of one of this semaphore's subjects.
    pub(crate) fn slot_of(&self, subject: &str) -> Option<(u32, u32)> {
        let (limit, slot) = subject.strip_prefix(&self.base)?.split_once('.')?;
        // Only the form this crate writes: no sign, no leading zeros.
        let number = |digits: &str| match digits.starts_with('0') && digits.len() > 1 {
            true => None,
            false => digits.parse::<u32>().ok(),
        };
        Some((number(limit)?, number(slot)?))
    }
}

/// The subjects of one reader-writer lock, under `$KV.BUCKET.rw.TOKEN.`:
/// the readers' (`r.OWNER`) apart from the writers' side (`x.…`: the
/// writer `x.w`, the waiters' marks `x.q.ARRIVAL-ID`, a waiting reader's
/// id starting with `r`, and the latest write's token `x.t`).
#[derive(Clone)]
pub(crate) struct RwSubjects {
    /// Every subject of the lock: `…rw.TOKEN.>`.
    pub(crate) all: String,
    /// The writer's message.
    pub(crate) writer: String,
    /// Every reader's message: `…rw.TOKEN.r.*`.
    pub(crate) readers: String,
    /// The latest write grant's token (a message without a TTL).
    pub(crate) token: String,
    /// Where releases (and marks given up) are announced:
    /// `distlock.BUCKET.rw.TOKEN`.
    pub(crate) released: String,
    base: String,
}

impl RwSubjects {
    /// The subjects of reader-writer lock `name` in `bucket`.
    pub(crate) fn of(bucket: &str, name: &str) -> Self {
        let token = token(name);
        let base = format!("$KV.{bucket}.rw.{token}.");
        RwSubjects {
            all: format!("{base}>"),
            writer: format!("{base}x.w"),
            readers: format!("{base}r.*"),
            token: format!("{base}x.t"),
            released: format!("distlock.{bucket}.rw.{token}"),
            base,
        }
    }

    /// A grant's subjects: the writer's, or reader `owner`'s.
    pub(crate) fn holder(&self, write: bool, owner: &str) -> Subjects {
        Subjects {
            lock: match write {
                true => self.writer.clone(),
                false => format!("{}r.{owner}", self.base),
            },
            released: self.released.clone(),
        }
    }

    /// A waiter's mark: its arrival (milliseconds) and its id.
    pub(crate) fn mark(&self, arrival: u64, id: &str) -> String {
        format!("{}x.q.{}", self.base, Mark::token(arrival, id))
    }

    /// What one of the lock's subjects is.
    pub(crate) fn kind_of(&self, subject: &str) -> Option<RwSubject> {
        let rest = subject.strip_prefix(&self.base)?;
        if rest == "x.w" {
            Some(RwSubject::Writer)
        } else if rest == "x.t" {
            Some(RwSubject::Token)
        } else if let Some(mark) = rest.strip_prefix("x.q.") {
            Mark::read(mark).map(RwSubject::Mark)
        } else if rest.starts_with("r.") {
            Some(RwSubject::Reader)
        } else {
            None
        }
    }
}

/// One subject of a reader-writer lock ([`RwSubjects::kind_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RwSubject {
    /// The writer's message.
    Writer,
    /// A reader's message.
    Reader,
    /// A waiter's mark: a reader's or a writer's.
    Mark(Mark),
    /// The latest write's token.
    Token,
}

/// Whether `b` stands for itself in a name's token: letters, digits, `-`,
/// `_` and `/` (a key-value key's characters, without `.`, which
/// separates subject tokens, and `=`, the escape).
fn kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'/')
}

/// A name as one subject token: its bytes that [`kept`] says stand for
/// themselves as they are (`orders/42` stays `orders/42`), every other
/// byte as `=` and two hex digits (`a.b` is `a=2Eb`). Distinct names give
/// distinct tokens, and no token holds `.`, `*`, `>` or white space.
pub(crate) fn token(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for &b in name.as_bytes() {
        if kept(b) {
            out.push(char::from(b));
        } else {
            out.push('=');
            out.push_str(&hex::encode_upper([b]));
        }
    }
    out
}

/// The stream of `bucket`, as NATS key-value buckets name theirs.
pub(crate) fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The subjects of `bucket`'s stream.
pub(crate) fn stream_subjects(bucket: &str) -> String {
    format!("$KV.{bucket}.>")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inverse of [`token`], for the test.
    fn name_of(token: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut bytes = token.bytes();
        while let Some(b) = bytes.next() {
            if b == b'=' {
                let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                out.extend(hex::decode(hex).expect("two hex digits"));
            } else {
                assert!(kept(b), "{b} in {token}");
                out.push(b);
            }
        }
        out
    }

    #[test]
    fn any_name_is_one_subject_token() {
        for name in [
            "a",
            "a.b",
            "*",
            ">",
            "a b",
            "ünï/cøde",
            "x\u{7f}",
            "=2E",
            "orders/42",
            "a\tb",
        ] {
            let s = Subjects::of("distlock", name);
            let token = s.lock.strip_prefix("$KV.distlock.lock.").expect("prefix");
            assert!(
                !token.contains(['.', '*', '>', ' ', '\t']),
                "{name:?}: {token}"
            );
            assert_eq!(name_of(token), name.as_bytes(), "{token}");
            assert!(s.released.ends_with(token));
        }
        assert_eq!(token("orders/42"), "orders/42");
        assert_eq!(token("a.b"), "a=2Eb");
        assert_eq!(token("=2E"), "=3D2E");
    }

    #[test]
    fn a_reader_writer_lock_reads_its_subjects_back() {
        let rw = RwSubjects::of("distlock", "a.b");
        assert_eq!(rw.kind_of(&rw.writer), Some(RwSubject::Writer));
        assert_eq!(rw.kind_of(&rw.token), Some(RwSubject::Token));
        assert_eq!(
            rw.kind_of(&rw.holder(false, "00ff").lock),
            Some(RwSubject::Reader)
        );
        assert_eq!(
            rw.kind_of(&rw.mark(1_700_000_000_123, "beef")),
            Some(RwSubject::Mark(Mark {
                arrival: 1_700_000_000_123,
                id: "beef".into(),
            }))
        );
        let Some(RwSubject::Mark(reader)) = rw.kind_of(&rw.mark(7, "rbeef")) else {
            panic!("a reader's mark reads back");
        };
        assert!(reader.reader() && reader.arrival == 7);
        // A writer's mark orders before a reader's of the same moment.
        let writer = Mark {
            arrival: 7,
            id: "ffff".into(),
        };
        assert!(writer < reader && !writer.reader());
        // Every subject of the lock is under `all`.
        let base = rw.all.trim_end_matches('>');
        for subject in [rw.writer.clone(), rw.token.clone(), rw.mark(1, "x")] {
            assert!(subject.starts_with(base), "{subject}");
        }
        assert!(rw.holder(false, "00ff").lock.starts_with(base));
        assert_eq!(rw.kind_of("$KV.distlock.rw.a.x.w"), None);
    }

    #[test]
    fn a_semaphore_slot_reads_back_from_its_subject() {
        let permits = PermitSubjects::of("distlock", "a.b");
        assert_eq!(permits.filter, "$KV.distlock.sem.a=2Eb.*.*");
        for (limit, slot) in [(1, 0), (10, 7), (1024, 1023)] {
            let subject = permits.slot(limit, slot).lock;
            assert_eq!(permits.slot_of(&subject), Some((limit, slot)), "{subject}");
        }
        assert_eq!(permits.slot_of("$KV.distlock.sem.a=2Eb.10.07"), None);
        assert_eq!(permits.slot_of("$KV.distlock.sem.a=2Eb.010.7"), None);
        assert_eq!(permits.slot_of("$KV.distlock.sem.a=2Eb.7"), None);
        assert_eq!(permits.slot_of("$KV.distlock.sem.other.2.1"), None);
        assert_eq!(permits.slot_of("$KV.distlock.lock.a=2Eb"), None);
        // A waiter's mark is under the filter, and is no slot.
        let mark = permits.mark(1_700_000_000_123, "beef");
        assert!(mark.starts_with(permits.filter.trim_end_matches("*.*")));
        assert_eq!(mark.split('.').count(), permits.filter.split('.').count());
        assert_eq!(permits.slot_of(&mark), None);
        assert_eq!(
            permits.mark_of(&mark),
            Some(Mark {
                arrival: 1_700_000_000_123,
                id: "beef".into(),
            })
        );
        assert_eq!(permits.mark_of(&permits.slot(10, 7).lock), None);
        // Another name's slots are never under this one's filter.
        let other = PermitSubjects::of("distlock", "a");
        assert!(!other.slot(2, 1).lock.starts_with(&permits.base));
    }
}
