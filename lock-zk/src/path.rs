//! Where a lock lives in the tree: lock names become single, safe path
//! components, and each attempt's node carries a unique id.

/// The lock node of `name` under `root`: `n` and the name with every byte
/// outside `[A-Za-z0-9_-]` written as `%XX`, so `/`, `.`, `..`, control
/// characters and any UTF-8 are safe and distinct path components.
pub(crate) fn lock_node(root: &str, name: &str) -> String {
    node(root, 'n', name)
}

/// The semaphore node of `name` under `root`: as [`lock_node`], with `s`
/// in place of `n`, so no lock's node is a semaphore's.
pub(crate) fn semaphore_node(root: &str, name: &str) -> String {
    node(root, 's', name)
}

/// The reader-writer lock node of `name` under `root`: as [`lock_node`],
/// with `r` in place of `n`.
pub(crate) fn rw_node(root: &str, name: &str) -> String {
    node(root, 'r', name)
}

/// The counter node of reader-writer lock `name` under `root` (the latest
/// write's token): as [`lock_node`], with `f` in place of `n`.
pub(crate) fn rw_counter_node(root: &str, name: &str) -> String {
    node(root, 'f', name)
}

fn node(root: &str, kind: char, name: &str) -> String {
    let mut out = String::with_capacity(root.len() + 2 + name.len());
    out.push_str(root);
    out.push('/');
    out.push(kind);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(b as char);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
    }
    out
}

/// The prefix of one attempt's node under `dir`: the server appends the
/// sequence number. `id` is unique per attempt, so the node can be found
/// again after a lost reply.
pub(crate) fn attempt_prefix(dir: &str, id: &str) -> String {
    format!("{dir}/lock-{id}-")
}

/// Whether `child` is the node of the attempt `id`.
pub(crate) fn is_attempt(child: &str, id: &str) -> bool {
    child
        .strip_prefix("lock-")
        .and_then(|rest| rest.strip_prefix(id))
        .is_some_and(|rest| rest.starts_with('-'))
}

/// The sequence number at the end of a lock child's name, or `None` for a
/// node that is not one of ours.
pub(crate) fn sequence(child: &str) -> Option<i64> {
    if !child.starts_with("lock-") {
        return None;
    }
    child.rsplit('-').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_distinct_components() {
        assert_eq!(lock_node("/r", "a/b"), "/r/na%2Fb");
        assert_eq!(lock_node("/r", ".."), "/r/n%2E%2E");
        assert_eq!(lock_node("/r", "é\n"), "/r/n%C3%A9%0A");
        assert_eq!(lock_node("/r", "Ok_1-x"), "/r/nOk_1-x");
        assert_ne!(lock_node("/r", "%2F"), lock_node("/r", "/"));
    }

    #[test]
    fn children_are_recognised() {
        let prefix = attempt_prefix("/r/nx", "00ff");
        assert_eq!(prefix, "/r/nx/lock-00ff-");
        assert_eq!(sequence("lock-00ff-0000000042"), Some(42));
        assert_eq!(sequence("other-0000000042"), None);
        assert_eq!(sequence("lock-00ff-"), None);
        assert!(is_attempt("lock-00ff-0000000042", "00ff"));
        assert!(!is_attempt("lock-00ffee-0000000042", "00ff"));
        assert!(!is_attempt("lock-1200ff-0000000042", "00ff"));
    }
}
