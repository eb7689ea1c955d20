//! Where a lock lives: its subject in the bucket's stream, the subject its
//! releases are announced on, and the headers its messages carry.

/// The header naming the acquisition that wrote a lock's message (a random
/// owner token): renewals and releases compare it.
pub(crate) const OWNER: &str = "Distlock-Owner";

/// The header carrying the grant's fencing token on the messages that
/// renew it (the grant's own message is its token).
pub(crate) const TOKEN: &str = "Distlock-Token";

/// The subjects of one lock name. Names travel hex-encoded, so any name is
/// one subject token of its own and can never reach another's subject or
/// a wildcard.
#[derive(Clone)]
pub(crate) struct Subjects {
    /// The lock's message: `$KV.BUCKET.lock.HEX`.
    pub(crate) lock: String,
    /// Where its releases are announced to waiters (core NATS, not kept):
    /// `distlock.BUCKET.released.HEX`.
    pub(crate) released: String,
}

impl Subjects {
    /// The subjects of `name` in `bucket`.
    pub(crate) fn of(bucket: &str, name: &str) -> Self {
        let hex = hex::encode(name.as_bytes());
        Subjects {
            lock: format!("$KV.{bucket}.lock.{hex}"),
            released: format!("distlock.{bucket}.released.{hex}"),
        }
    }
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

    #[test]
    fn any_name_is_one_subject_token() {
        for name in ["a", "a.b", "*", ">", "a b", "ünï/cøde", "x\u{7f}"] {
            let s = Subjects::of("distlock", name);
            let token = s.lock.strip_prefix("$KV.distlock.lock.").expect("prefix");
            assert!(
                token.bytes().all(|b| b.is_ascii_hexdigit()),
                "{name:?}: {token}"
            );
            assert_eq!(hex::decode(token).expect("hex"), name.as_bytes());
            assert!(s.released.ends_with(token));
        }
    }
}
