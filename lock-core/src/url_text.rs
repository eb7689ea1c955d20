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
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() && parsed.set_password(Some("***")).is_ok() {
            return parsed.to_string();
        }
        if parsed.password().is_none() && !url.contains('@') {
            return url.to_string();
        }
    }
    // Unparsable (or multi-host, which `url` does not model): cut user-info
    // by hand from every authority, i.e. anything between `://` or `,` and `@`.
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains('@') {
            "<redacted>".to_string()
        } else {
            url.to_string()
        };
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let hosts: Vec<String> = authority
        .split(',')
        .map(|h| match h.rsplit_once('@') {
            Some((_, host)) => format!("***@{host}"),
            None => h.to_string(),
        })
        .collect();
    format!("{scheme}://{}{tail}", hosts.join(","))
}

/// `s` with every `%XX` escape decoded (user names, passwords and paths
/// that hold `:`, `@`, `/` or spaces); an error says what is wrong.
///
/// ```
/// assert_eq!(lock_core::percent_decode("p%40ss%2Fw").as_deref(), Ok("p@ss/w"));
/// assert!(lock_core::percent_decode("50%").is_err());
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
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
