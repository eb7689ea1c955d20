//! Key names. Lock `n` lives under `PREFIX/e(n)/`, where `e` escapes `%` and
//! `/`, so that no name's directory is a prefix of another's and no name can
//! reach outside `PREFIX`. Each acquisition puts one key there:
//! `PREFIX/e(n)/LEASE-OWNER` (the lease in hex, then a random owner token).

/// The directory of lock `name` under `prefix`, with its trailing `/`.
pub(crate) fn dir(prefix: &str, name: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + name.len() + 2);
    out.push_str(prefix);
    out.push('/');
    for c in name.chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            c => out.push(c),
        }
    }
    out.push('/');
    out
}

/// One acquisition's key in `dir`.
pub(crate) fn key(dir: &str, lease: i64, owner: &str) -> String {
    format!("{dir}{lease:016x}-{owner}")
}

/// The end of the key range `[dir, range_end(dir))`: every key starting with
/// `dir` (its last byte, `/`, plus one).
pub(crate) fn range_end(dir: &str) -> Vec<u8> {
    let mut end = dir.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_never_nest() {
        assert_eq!(dir("/distlock", "a/b"), "/distlock/a%2Fb/");
        assert_ne!(dir("/p", "%2F"), dir("/p", "/"));
        assert!(!dir("/p", "a/b").starts_with(&dir("/p", "a")));
        assert_eq!(range_end("/p/a/"), b"/p/a0".to_vec());
        assert_eq!(key("/p/a/", 255, "ab"), "/p/a/00000000000000ff-ab");
    }
}
