//! Where a lock lives: its subject in the bucket's stream, the subject its
//! releases are announced on, and the headers its messages carry.

/// The header naming the acquisition that wrote a lock's message (a random
/// owner token): renewals and releases compare it.
pub(crate) const OWNER: &str = "Distlock-Owner";

/// The header carrying the grant's fencing token on the messages that
/// renew it (the grant's own message is its token).
pub(crate) const TOKEN: &str = "Distlock-Token";

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
}
