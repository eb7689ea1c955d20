//! URL text shared by the backends' URL parsers: credentials removed
//! before a URL appears in errors or logs, and `%XX` escapes decoded.

/// `url` with any password (and, for unparsable URLs, the whole user-info
/// part) replaced by `***`.
///
/// ```
/// assert_eq!(
///     lock_core::redact_url("postgres://app:s3cret@db:5432/locks"),
///     "postgres://app:***@db:5432/locks"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    // An `@` past the authority may belong to a password with an unencoded
    // `/`, `?` or `#` that the parser took for the path's start: only a URL
    // with one `@` is trusted to its parser.
    let one_at = url.matches('@').count() <= 1;
    if let Some(redacted) = redact_nested(url) {
        return redacted;
    }
    if let Some(mut parsed) = url::Url::parse(url).ok().filter(|_| one_at) {
        if parsed.password().is_some() && parsed.set_password(Some("***")).is_ok() {
            return parsed.to_string();
        }
        if parsed.password().is_none() && !url.contains('@') {
            return url.to_string();
        }
    }
    // Unparsable (or multi-host, which `url` does not model): cut everything
    // between `://` and the last `@`. A password may hold unencoded `/`,
    // `?`, `#` or `@`, so no character before the last `@` can be trusted
    // to end the user-info; a path or query holding an `@` is cut too,
    // which errs on the side of hiding.
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains('@') {
            "<redacted>".to_string()
        } else {
            url.to_string()
        };
    };
    match rest.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://***@{host}"),
        None => url.to_string(),
    }
}

/// A URL whose options hold URLs (`migrate://?from=…&to=…`), each of those
/// redacted in turn; `None` if no option value is a URL. The outer URL must
/// parse and have no user-info of its own.
fn redact_nested(url: &str) -> Option<String> {
    let mut parsed = url::Url::parse(url).ok()?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return None;
    }
    let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
    // A key holding `@` or `:` is the tail of a nested password cut at an
    // unencoded `&`: leave such a URL to the cautious path.
    if !pairs.iter().any(|(_, v)| v.contains("://"))
        || pairs.iter().any(|(k, _)| k.contains(['@', ':']))
    {
        return None;
    }
    parsed
        .query_pairs_mut()
        .clear()
        .extend_pairs(pairs.iter().map(|(k, v)| {
            let value = if v.contains("://") {
                redact_url(v)
            } else {
                v.clone()
            };
            (k.clone(), value)
        }));
    Some(parsed.to_string())
}

/// `raw` with its user-info percent-encoded, so that a password holding
/// unencoded `/`, `?`, `#`, `@`, spaces or control characters (common in
/// generated passwords) reaches the URL parser intact instead of being
/// split into host, path and query, where an error message could quote
/// it. The user-info is everything between `://` and the **last** `@`: an
/// `@` anywhere else in a lock URL must be written `%40`. The first `:`
/// stays the user/password separator; existing `%XX` escapes are kept.
///
/// ```
/// assert_eq!(
///     lock_core::raw::encode_userinfo("redis://:pa/ss?w@rd@host:6379/0"),
///     "redis://:pa%2Fss%3Fw%40rd@host:6379/0"
/// );
/// assert_eq!(lock_core::raw::encode_userinfo("redis://host:6379"), "redis://host:6379");
/// ```
pub fn encode_userinfo(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_string();
    };
    let Some((info, host)) = rest.rsplit_once('@') else {
        return raw.to_string();
    };
    let mut out = String::with_capacity(info.len() + 8);
    let mut separator_seen = false;
    for (i, c) in info.char_indices() {
        let escape_kept = c == '%'
            && info
                .get(i + 1..i + 3)
                .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        match c {
            ':' if !separator_seen => {
                separator_seen = true;
                out.push(':');
            }
            c if escape_kept || c.is_ascii_alphanumeric() || "-._~!$&'()*+;=".contains(c) => {
                out.push(c)
            }
            c => {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("%{b:02X}"));
                }
            }
        }
    }
    format!("{scheme}://{out}@{host}")
}

/// A URL option's yes or no: `true`/`false`, `on`/`off` or `1`/`0`.
///
/// ```
/// assert_eq!(lock_core::raw::parse_flag("off"), Some(false));
/// assert_eq!(lock_core::raw::parse_flag("yes please"), None);
/// ```
pub fn parse_flag(value: &str) -> Option<bool> {
    match value {
        "true" | "on" | "1" => Some(true),
        "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// `s` with every `%XX` escape decoded (user names, passwords and paths
/// that hold `:`, `@`, `/` or spaces); an error says what is wrong.
///
/// ```
/// assert_eq!(lock_core::raw::percent_decode("p%40ss%2Fw").as_deref(), Ok("p@ss/w"));
/// assert!(lock_core::raw::percent_decode("50%").is_err());
/// ```
pub fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-escape at byte {i}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "percent-escapes do not decode to UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, redact_url};

    #[test]
    fn urls_inside_options_are_redacted_too() {
        let shown = redact_url(
            "migrate://?from=redis%3A%2F%2F%3As3cret%40h%3A1&to=postgres%3A%2F%2Fu%3Apw2%40db%2Fx",
        );
        assert!(
            !shown.contains("s3cret") && !shown.contains("pw2"),
            "{shown}"
        );
        assert!(
            shown.contains("h%3A1") && shown.contains("db%2Fx"),
            "{shown}"
        );
        let shown = redact_url("migrate://?from=redis://:s3cret@h:1&to=etcd://h:2");
        assert!(!shown.contains("s3cret"), "{shown}");
        let shown = redact_url("migrate://?from=redis://:s3c&ret@h:1&to=etcd://h:2");
        assert!(!shown.contains("s3c") && !shown.contains("ret@"), "{shown}");
    }

    #[test]
    fn escapes_decode_and_bad_ones_are_errors() {
        assert_eq!(percent_decode("a%20b%3A").as_deref(), Ok("a b:"));
        assert_eq!(percent_decode("plain").as_deref(), Ok("plain"));
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%4").is_err());
        assert!(percent_decode("%FF").is_err(), "not UTF-8");
    }

    #[test]
    fn passwords_never_survive() {
        for (url, secret) in [
            ("redis://:hunter2@localhost:6379/0", "hunter2"),
            ("postgres://u:p%40ss@h/db", "p%40ss"),
            ("redlock://u:topsecret@a:1,b:2,c:3", "topsecret"),
            ("redis://u:bad pass@host", "bad pass"),
            ("weird:u:pw@host", "pw"),
            ("redis://:pa/ssword@host:6379", "ssword"),
            ("postgres://u:pa?ss@db/x", "ss@"),
            ("mysql://u:p#w@db/x", "p#w"),
            ("zk://u:a@b/c@h:2181", "a@b"),
            ("redis://user:12/x@host", "12/x"),
            ("redlock://u:p/w@a:1,b:2,c:3", "p/w"),
            ("memory://u:MARK@MARK#@MARK&MARK@host", "MARK"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
