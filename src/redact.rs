//! Removing credentials from URLs before they appear in errors or logs.

/// `url` with any password (and, for unparsable URLs, the whole user-info
/// part) replaced by `***`.
///
/// ```
/// assert_eq!(
///     distlock::redact_url("postgres://app:s3cret@db:5432/locks"),
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

#[cfg(test)]
mod tests {
    use super::redact_url;

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
