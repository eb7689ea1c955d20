//! A lock service URL, parsed once for every backend: the scheme, the
//! decoded user and password, the hosts with their ports, the path and the
//! query (read through [`UrlOptions`]). The same split gives the URL as
//! errors and logs show it ([`LockUrl::shown`], [`redact_url`]), so what
//! is hidden is exactly what the parser took for credentials.
//!
//! The rules, for every scheme:
//!
//! - `SCHEME://[USERINFO@]HOSTS[/PATH][?QUERY]`. The user-info is
//!   everything between `://` and the **last** `@`, so a generated
//!   password may hold unencoded `/`, `?`, `#`, `@`, `:` or spaces; an `@`
//!   anywhere else must be written `%40`. Its first `:` separates the user
//!   from the password; both are percent-decoded (`+` and `&` are their
//!   own characters: user-info is not form data), and a `%` not followed
//!   by two hex digits is a `%` of the password.
//! - A URL whose text after `://` starts with `/`, `?` or `#` has no
//!   user-info or hosts (`sqlite:///var/lib/locks.db`,
//!   `migrate://?from=…&to=…`); an `@` in its path is refused (it must be
//!   written `%40`), and one in its query hides the query up to it.
//! - `HOSTS` is `host[:port]` separated by commas; a host is a name, an
//!   IPv4 address or a bracketed IPv6 address (`[::1]:2379`).
//! - A `#` outside the user-info is refused: no lock URL has a fragment.

use std::fmt;

use crate::error::LockError;
use crate::raw::UrlOptions;

/// One `host[:port]` of a URL's authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// The host as written: a name (lower-cased), an IPv4 address or an
    /// IPv6 address in brackets.
    pub host: String,
    /// The port, if one was written.
    pub port: Option<u16>,
}

impl HostPort {
    /// `host:port`, with `default` when no port was written.
    pub fn with_default_port(&self, default: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(default))
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// A parsed lock service URL. Neither its `Debug` nor its `Display`
/// shows the password.
///
/// ```
/// use lock_core::raw::LockUrl;
///
/// let url = LockUrl::parse("etcd://app:p+q&r/s@h1:2379,[::1]:2380/locks?session_ttl=5s")?;
/// assert_eq!(url.scheme(), "etcd");
/// assert_eq!(url.user(), Some("app"));
/// assert_eq!(url.password(), Some("p+q&r/s"));
/// assert_eq!(url.hosts()[1].to_string(), "[::1]:2380");
/// assert_eq!(url.path(), "/locks");
/// assert_eq!(url.to_string(), "etcd://app:***@h1:2379,[::1]:2380/locks?session_ttl=5s");
/// let mut options = url.options()?;
/// assert!(options.duration("session_ttl")?.is_some());
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone)]
pub struct LockUrl {
    scheme: String,
    user: Option<String>,
    password: Option<String>,
    hosts: Vec<HostPort>,
    path: String,
    query: Option<String>,
    shown: String,
    /// Whether `shown` hides more than the password (see `Parts`).
    hides_parts: bool,
}

/// The text of a URL cut where [`LockUrl`]'s rules cut it, before any of
/// it is decoded or checked. Never fails for a URL with `://`.
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    authority: &'a str,
    path: &'a str,
    query: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn split(raw: &'a str) -> Option<Parts<'a>> {
        let (scheme, rest) = raw.split_once("://")?;
        let no_authority = rest.starts_with(['/', '?', '#']);
        let (userinfo, after) = match rest.rsplit_once('@') {
            Some((info, after)) if !no_authority => (Some(info), after),
            _ => (None, rest),
        };
        let authority_end = after.find(['/', '?']).unwrap_or(after.len());
        let (authority, tail) = after.split_at(authority_end);
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        Some(Parts {
            scheme,
            userinfo,
            authority,
            path,
            query,
        })
    }

    /// The URL as errors and logs show it: the password replaced by `***`
    /// (and the whole user-info, if it has no `:` or its user part is not
    /// plain text), and
    /// URLs nested in the query shown the same way.
    /// Whether [`shown`](Self::shown) hides more than the user-info: then
    /// errors must not quote any part of the URL either.
    fn hides_parts(&self) -> bool {
        let rest = [self.authority, self.path, self.query.unwrap_or("")].concat();
        let at = self.userinfo.is_some() || rest.contains('@') || self.scheme.contains('@');
        (check_scheme(self.scheme).is_err() && at)
            || (self.userinfo.is_none() && rest.contains('@'))
            || self.query.is_some_and(|q| shown_query(q) == "***")
    }

    /// `reason` if errors may quote parts of this URL, else a reason that
    /// quotes none.
    fn reason(&self, reason: String) -> String {
        if self.hides_parts() {
            HIDDEN_REASON.to_string()
        } else {
            reason
        }
    }

    fn shown(&self) -> String {
        let rest = [self.authority, self.path, self.query.unwrap_or("")].concat();
        // Text before `://` that is not a scheme may hold a password with
        // a `://` of its own: with any `@` about, none of it is shown.
        let at = self.userinfo.is_some() || rest.contains('@') || self.scheme.contains('@');
        if check_scheme(self.scheme).is_err() && at {
            return "<redacted>".to_string();
        }
        if self.userinfo.is_none() && rest.contains('@') {
            // No user-info by the rules, yet an `@`: a path or query that
            // may hold credentials written where they do not belong (or
            // nested URLs not percent-encoded). Hidden up to the last `@`.
            let after = rest.rsplit_once('@').map_or("", |(_, after)| after);
            return format!("{}://***@{after}", self.scheme);
        }
        let mut out = format!("{}://", self.scheme);
        if let Some(info) = self.userinfo {
            match info.split_once(':') {
                Some((user, _)) if plain_user(user) => {
                    out.push_str(user);
                    out.push_str(":***@");
                }
                // A user-info without `:` may be a token: hidden whole.
                _ => out.push_str("***@"),
            }
        }
        out.push_str(self.authority);
        out.push_str(self.path);
        if let Some(query) = self.query {
            out.push('?');
            out.push_str(&shown_query(query));
        }
        out
    }
}

/// A scheme is a letter, then letters, digits, `+`, `-` or `.`.
fn check_scheme(scheme: &str) -> Result<(), String> {
    let ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if ok {
        Ok(())
    } else {
        // Not quoted: what stands before a `://` that is not a scheme may
        // be anything, credentials included.
        Err("the text before `://` is not a URL scheme (a letter, then letters, digits, `+`, `-` or `.`)".to_string())
    }
}

/// The reason given for a malformed URL whose shown form hides more than
/// its password.
const HIDDEN_REASON: &str = "malformed (no part of it is quoted: an `@` outside the user-info may mean credentials stand elsewhere; write an `@` that is not the user-info's end as %40)";

/// A user name shown as written: letters, digits and `-._~%+` (a user
/// name holding anything else may be a password cut at a stray `:`).
fn plain_user(user: &str) -> bool {
    user.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-._~%+".contains(c))
}

/// A query as errors show it. Option names are identifiers; a query whose
/// names are not, or whose values hold an `@` outside a nested URL, holds
/// the pieces of a nested password cut at an unencoded `&` and is hidden
/// whole. Nested URLs (`from=redis://…`) are shown by the same rules.
fn shown_query(query: &str) -> String {
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect();
    let suspicious = pairs.iter().any(|(key, value)| {
        !key.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            || (value.contains('@') && !value.contains("://"))
    });
    if suspicious {
        return "***".to_string();
    }
    if !pairs.iter().any(|(_, value)| value.contains("://")) {
        return query.to_string();
    }
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs.iter().map(|(key, value)| {
            let value = if value.contains("://") {
                redact_url(value)
            } else {
                value.clone()
            };
            (key.clone(), value)
        }))
        .finish()
}

impl LockUrl {
    /// The scheme of `raw`, lower-cased, read as [`parse`](Self::parse)
    /// reads it; for a registry that picks the parser by scheme.
    pub fn scheme_of(raw: &str) -> Result<String, LockError> {
        let parts = Parts::split(raw).ok_or_else(|| LockError::InvalidUrl {
            url: redact_url(raw),
            reason: "expected SCHEME://…, e.g. sqlite:///var/lib/app/locks.db".into(),
        })?;
        check_scheme(parts.scheme).map_err(|reason| LockError::InvalidUrl {
            url: parts.shown(),
            reason,
        })?;
        Ok(parts.scheme.to_ascii_lowercase())
    }

    /// `raw` without its option `key`, and that option's value (decoded)
    /// if it was given; the rest of the text is kept as written, for the
    /// parser it goes to next. Given twice is [`LockError::InvalidUrl`].
    ///
    /// ```
    /// use lock_core::raw::LockUrl;
    /// let (rest, epoch) = LockUrl::take_option("etcd://h:1/p?fencing_epoch=2&session_ttl=5s", "fencing_epoch")?;
    /// assert_eq!((rest.as_str(), epoch.as_deref()), ("etcd://h:1/p?session_ttl=5s", Some("2")));
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn take_option(raw: &str, key: &str) -> Result<(String, Option<String>), LockError> {
        let Some(parts) = Parts::split(raw) else {
            return Ok((raw.to_string(), None));
        };
        let Some(query) = parts.query else {
            return Ok((raw.to_string(), None));
        };
        let mut value = None;
        let mut kept = Vec::new();
        for piece in query.split('&') {
            let (name, given) = piece.split_once('=').unwrap_or((piece, ""));
            if name != key {
                kept.push(piece);
                continue;
            }
            let decoded = url::form_urlencoded::parse(format!("x={given}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            if value.replace(decoded).is_some() {
                return Err(LockError::InvalidUrl {
                    url: parts.shown(),
                    reason: format!("`{key}` given twice"),
                });
            }
        }
        let base = &raw[..raw.len() - query.len() - 1];
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((rest, value))
    }

    /// Parse `raw` by the rules above. A malformed URL is
    /// [`LockError::InvalidUrl`], quoting the URL without its credentials.
    pub fn parse(raw: &str) -> Result<LockUrl, LockError> {
        Self::parse_as(raw, false)
    }

    /// Parse the URL of a file (`sqlite://rel/path.db`,
    /// `sqlite:///abs/path.db`): what stands where the hosts would is the
    /// start of the path, so the path is everything between `://` and `?`,
    /// decoded. A user-info is split off and hidden as in [`parse`](Self::parse)
    /// (the backend refuses it).
    pub fn parse_file(raw: &str) -> Result<LockUrl, LockError> {
        Self::parse_as(raw, true)
    }

    fn parse_as(raw: &str, authority_is_path: bool) -> Result<LockUrl, LockError> {
        let Some(parts) = Parts::split(raw) else {
            return Err(LockError::InvalidUrl {
                url: redact_url(raw),
                reason: "expected SCHEME://…, e.g. sqlite:///var/lib/app/locks.db".into(),
            });
        };
        let shown = parts.shown();
        let invalid = |reason: String| LockError::InvalidUrl {
            url: shown.clone(),
            reason: parts.reason(reason),
        };
        check_scheme(parts.scheme).map_err(invalid)?;
        let (user, password) = match parts.userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(password)),
                    None => (info, None),
                };
                let user =
                    decode_userinfo(user).map_err(|e| invalid(format!("the user name: {e}")))?;
                let password = password
                    .map(decode_userinfo)
                    .transpose()
                    .map_err(|e| invalid(format!("the password: {e}")))?;
                (Some(user), password)
            }
        };
        if parts.userinfo.is_none() && parts.path.contains('@') {
            return Err(invalid(
                "an `@` in the path must be written %40 (only credentials end with `@`)".into(),
            ));
        }
        let rest = [parts.authority, parts.path, parts.query.unwrap_or("")].concat();
        if rest.contains('#') {
            return Err(invalid(
                "a `#` outside the user-info must be written %23 (lock URLs have no fragment)"
                    .into(),
            ));
        }
        let (hosts, path) = if authority_is_path {
            (Vec::new(), [parts.authority, parts.path].concat())
        } else {
            if parts.authority.is_empty()
                && parts.userinfo.is_some()
                && !parts.path.starts_with('/')
            {
                return Err(invalid("credentials but no host".into()));
            }
            let mut hosts = Vec::new();
            for member in parts
                .authority
                .split(',')
                .filter(|_| !parts.authority.is_empty())
            {
                hosts.push(host_port(member).map_err(|reason| {
                    invalid(format!(
                        "host {:?}: {reason}",
                        member.escape_debug().to_string()
                    ))
                })?);
            }
            (hosts, parts.path.to_string())
        };
        let path = percent_decode(&path).map_err(|e| invalid(format!("the path: {e}")))?;
        Ok(LockUrl {
            scheme: parts.scheme.to_ascii_lowercase(),
            user: user.filter(|u| !u.is_empty() || password.is_some()),
            password,
            hosts,
            path,
            query: parts.query.map(str::to_string),
            shown,
            hides_parts: parts.hides_parts(),
        })
    }

    /// The scheme, lower-cased (`redis`, `etcd+https`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The decoded user name, if the URL has user-info (`Some("")` for
    /// `redis://:password@…`).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The decoded password, if one was written.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The hosts, in the URL's order (empty for `sqlite:///…`).
    pub fn hosts(&self) -> &[HostPort] {
        &self.hosts
    }

    /// The decoded path, with its leading `/` (empty if none was written).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The query as written (still encoded), if there is a `?`.
    pub fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// The query's options, to be taken one by one and then
    /// [`finish`](UrlOptions::finish)ed.
    pub fn options(&self) -> Result<UrlOptions, LockError> {
        UrlOptions::parse_quoting(
            &self.shown,
            self.query.as_deref().unwrap_or(""),
            !self.hides_parts,
        )
    }

    /// The URL as errors and logs show it: `***` for the password.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// The [`LockError::InvalidUrl`] of this URL, for `reason`.
    pub fn invalid(&self, reason: impl Into<String>) -> LockError {
        let reason = if self.hides_parts {
            HIDDEN_REASON.to_string()
        } else {
            reason.into()
        };
        LockError::InvalidUrl {
            url: self.shown.clone(),
            reason,
        }
    }

    /// Check the scheme is one of `schemes`, else the error names them.
    pub fn expect_scheme(&self, schemes: &[&str]) -> Result<(), LockError> {
        if schemes.contains(&self.scheme.as_str()) {
            return Ok(());
        }
        let listed: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        Err(self.invalid(format!("expected a {} URL", listed.join(" or "))))
    }

    /// The members of a cluster URL as `host:port`, in the URL's order: at
    /// least one, each with its port written.
    pub fn members(&self) -> Result<Vec<String>, LockError> {
        if self.hosts.is_empty() {
            return Err(self.invalid("the URL names no host"));
        }
        if self.hosts.iter().any(|h| h.port.is_none()) {
            return Err(self.invalid("every member needs host:port"));
        }
        Ok(self.hosts.iter().map(HostPort::to_string).collect())
    }

    /// The one host of a single-server URL.
    pub fn single_host(&self) -> Result<&HostPort, LockError> {
        match self.hosts.as_slice() {
            [one] => Ok(one),
            [] => Err(self.invalid("the URL names no host")),
            _ => Err(self.invalid("one host expected, not a list")),
        }
    }

    /// This URL without its query (options and all).
    pub fn without_query(&self) -> LockUrl {
        let mut url = self.clone();
        url.query = None;
        if !self.hides_parts
            && let Some((base, _)) = self.shown.split_once('?')
        {
            url.shown = base.to_string();
        }
        url
    }

    /// `user:password@` (or `user@`, or nothing), each part percent-encoded
    /// so that any URL parser decodes it to what this one did; for a client
    /// library that takes a URL. Not for display: it holds the password.
    pub fn userinfo_for_client(&self) -> String {
        let Some(user) = &self.user else {
            return String::new();
        };
        let mut out = encode_component(user);
        if let Some(password) = &self.password {
            out.push(':');
            out.push_str(&encode_component(password));
        }
        out.push('@');
        out
    }

    /// The URL written back with its credentials, user-info encoded so
    /// that any parser reads it as this one did; for a client library that
    /// takes a URL. Not for display: it holds the password.
    pub fn to_url_with_credentials(&self) -> String {
        let mut out = format!("{}://{}", self.scheme, self.userinfo_for_client());
        let hosts: Vec<String> = self.hosts.iter().map(HostPort::to_string).collect();
        out.push_str(&hosts.join(","));
        out.push_str(&encode_path(&self.path));
        if let Some(query) = &self.query {
            out.push('?');
            out.push_str(query);
        }
        out
    }
}

/// A user name or password decoded: `%XX` escapes, and a `%` that starts
/// none is itself (a generated password written as it is).
fn decode_userinfo(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = (bytes[i] == b'%')
            .then(|| s.get(i + 1..i + 3))
            .flatten()
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match escape {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "percent-escapes do not decode to UTF-8".to_string())
}

/// `s` with every `%XX` escape decoded (user names, passwords and paths
/// that hold `:`, `@`, `/` or spaces); an error says what is wrong.
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
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

/// Every byte but ASCII letters, digits and `-._~` percent-encoded.
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A decoded path encoded again: `/` kept, what a parser would read as
/// the query or a fragment, `%` and anything not printable ASCII encoded.
fn encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_graphic() && !b"?#%".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One `host[:port]`.
fn host_port(member: &str) -> Result<HostPort, String> {
    if member.is_empty() {
        return Err("empty".into());
    }
    let (host, port) = if let Some(rest) = member.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| "an IPv6 address needs its closing `]`".to_string())?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| "expected `:port` after the address".to_string())?,
            ),
        };
        (format!("[{inside}]"), port)
    } else {
        match member.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (member.to_string(), None),
        }
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("the port must be a number from 0 to 65535, got {p:?}"))
        })
        .transpose()?;
    let host = url::Host::parse(&host).map_err(|e| e.to_string())?;
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// Two URLs are equal when they say the same (however they were written).
impl PartialEq for LockUrl {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.scheme,
            &self.user,
            &self.password,
            &self.hosts,
            &self.path,
            &self.query,
        ) == (
            &other.scheme,
            &other.user,
            &other.password,
            &other.hosts,
            &other.path,
            &other.query,
        )
    }
}

impl Eq for LockUrl {}

impl fmt::Display for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for LockUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockUrl").field(&self.shown).finish()
    }
}

/// `url` as errors and logs may show it: the password (and, where the
/// user part is not plain text, the whole user-info) replaced by `***`,
/// by the same split [`LockUrl::parse`] makes, so what the parser takes
/// for a password is always what is hidden. Text without `://` that holds
/// an `@` is hidden whole.
///
/// ```
/// assert_eq!(
///     lock_core::redact_url("postgres://app:s3cret@db:5432/locks"),
///     "postgres://app:***@db:5432/locks"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    match Parts::split(url) {
        Some(parts) => parts.shown(),
        None if url.contains('@') => "<redacted>".to_string(),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_of_a_multi_host_url() {
        let u = LockUrl::parse("zk://app:a@b/c?d#e@h1:2181,H2,[::1]:3/svc/locks?x=1").expect("ok");
        assert_eq!(u.user(), Some("app"));
        assert_eq!(u.password(), Some("a@b/c?d#e"));
        let hosts: Vec<String> = u.hosts().iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["h1:2181", "h2", "[::1]:3"]);
        assert_eq!(u.path(), "/svc/locks");
        assert_eq!(u.query(), Some("x=1"));
        assert_eq!(u.shown(), "zk://app:***@h1:2181,H2,[::1]:3/svc/locks?x=1");
    }

    #[test]
    fn no_authority_after_a_slash_or_question_mark() {
        let s = LockUrl::parse("sqlite:///var/tmp/a%40b.db?table=t").expect("ok");
        assert!(s.hosts().is_empty() && s.user().is_none());
        assert_eq!(s.path(), "/var/tmp/a@b.db");
        assert!(LockUrl::parse("sqlite:///var/tmp/a@b.db").is_err());
        let m = LockUrl::parse("migrate://?from=redis://:pw@h:1&to=etcd://h:2").expect("ok");
        assert_eq!(m.path(), "");
        assert_eq!(m.shown(), "migrate://***@h:1&to=etcd://h:2");
        let c = LockUrl::parse("sqlite://u:pw@/tmp/x.db").expect("ok");
        assert_eq!(c.password(), Some("pw"));
        assert_eq!(c.path(), "/tmp/x.db");
    }

    #[test]
    fn bad_parts_are_typed_and_hidden() {
        for bad in [
            "nourl",
            "1x://h",
            "redis://u:secretpw@h:port",
            "redis://u:secretpw@h:70000",
            "redis://u:secretpw@h:1#frag",
            "redis://u:secretpw@[::1",
            "redis://u:secret%FF@h",
            "redis://u:secretpw@",
            "redis://u:secretpw@h1,,h2",
        ] {
            match LockUrl::parse(bad) {
                Err(LockError::InvalidUrl { url, reason }) => {
                    assert!(!url.contains("secret"), "{bad}: {url}");
                    assert!(!reason.contains("secret"), "{bad}: {reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn taking_an_option_out() {
        let raw = "etcd://u:p?w@h:1/p?fencing_epoch=2&session_ttl=5s";
        let (rest, epoch) = LockUrl::take_option(raw, "fencing_epoch").expect("once");
        assert_eq!(epoch.as_deref(), Some("2"));
        assert_eq!(rest, "etcd://u:p?w@h:1/p?session_ttl=5s");
        let (same, none) = LockUrl::take_option(&rest, "fencing_epoch").expect("none");
        assert_eq!((same.as_str(), none), (rest.as_str(), None));
        let (bare, _) =
            LockUrl::take_option("zk://h:1?fencing_epoch=1", "fencing_epoch").expect("once");
        assert_eq!(bare, "zk://h:1");
        let twice = "etcd://h:1?fencing_epoch=2&fencing_epoch=3";
        assert!(LockUrl::take_option(twice, "fencing_epoch").is_err());
    }

    #[test]
    fn credentials_written_back_parse_the_same() {
        let pw: String = (0x20u8..=0x7e).map(char::from).chain(['é']).collect();
        let raw = format!("redis://us%3Aer:{pw}@h:1/0?prefix=a");
        let u = LockUrl::parse(&raw).expect("ok");
        assert_eq!(u.password(), Some(pw.as_str()));
        assert_eq!(u.user(), Some("us:er"));
        let again = LockUrl::parse(&u.to_url_with_credentials()).expect("ok");
        assert_eq!(again, u);
        let with_url = url::Url::parse(&u.to_url_with_credentials()).expect("the url crate");
        assert_eq!(
            percent_decode(with_url.password().expect("pw")).as_deref(),
            Ok(pw.as_str())
        );
    }

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
            ("etcd:/u:MARK]MARK://MARK@h9:5", "MARK"),
        ] {
            let shown = redact_url(url);
            assert!(!shown.contains(secret), "{url} -> {shown}");
        }
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }

    #[test]
    fn escapes_decode_and_bad_ones_are_errors() {
        assert_eq!(percent_decode("a%20b%3A").as_deref(), Ok("a b:"));
        assert_eq!(percent_decode("plain").as_deref(), Ok("plain"));
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%4").is_err());
        assert!(percent_decode("%+1").is_err(), "a sign is not a hex digit");
        assert!(percent_decode("%FF").is_err(), "not UTF-8");
    }

    /// URL-shaped text spliced from the characters that end or split a
    /// user-info, with a password in the user-info's place: neither the
    /// redaction nor the parser's errors show any of it.
    #[test]
    fn spliced_text_never_shows_the_password() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let alphabet: Vec<char> = "abc:/?#@&=%.,[] 1".chars().collect();
        let pieces = ["://", "?", "#", "@", "&from=", "x=", "redis://"];
        let text = |rng: &mut rand::rngs::StdRng, n: usize| -> String {
            let mut s = String::new();
            for _ in 0..rng.random_range(0..n) {
                if rng.random_bool(0.2) {
                    s.push_str(pieces[rng.random_range(0..pieces.len())]);
                } else {
                    s.push(alphabet[rng.random_range(0..alphabet.len())]);
                }
            }
            s
        };
        for _ in 0..100_000 {
            let user = text(&mut rng, 4);
            let pw = format!("SECRET{}SECRET", text(&mut rng, 4));
            let tail = text(&mut rng, 8);
            let url = format!("redis://{user}:{pw}@{tail}");
            let shown = redact_url(&url);
            assert!(!shown.contains("SECRET"), "{url} -> {shown}");
            if let Err(e) = LockUrl::parse(&url).and_then(|u| u.options()?.finish()) {
                let text = format!("{e} {e:?}");
                assert!(!text.contains("SECRET"), "{url} -> {text}");
            }
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Characters a generated password mixes: every printable ASCII
        /// character but the marker's letters, a non-ASCII letter, controls.
        fn password() -> impl Strategy<Value = String> {
            let awkward = proptest::collection::vec(
                prop_oneof![
                    (0x20u8..0x7f).prop_map(char::from),
                    Just('é'),
                    Just('\n'),
                    Just('\u{1}'),
                ]
                .prop_filter("no marker letters", |c| !"SECRT".contains(*c)),
                0..12,
            );
            (awkward.clone(), awkward).prop_map(|(a, b)| {
                format!(
                    "SECRET{}SECRET{}SECRET",
                    a.into_iter().collect::<String>(),
                    b.into_iter().collect::<String>()
                )
            })
        }

        fn host() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z][a-z0-9-]{0,8}(\\.[a-z]{2,3})?",
                Just("127.0.0.1".to_string()),
                Just("[::1]".to_string()),
            ]
        }

        fn hosts() -> impl Strategy<Value = String> {
            proptest::collection::vec(
                (host(), proptest::option::of(any::<u16>())).prop_map(|(h, p)| match p {
                    Some(p) => format!("{h}:{p}"),
                    None => h,
                }),
                1..4,
            )
            .prop_map(|v| v.join(","))
        }

        fn url_with_password() -> impl Strategy<Value = (String, String)> {
            (
                "[a-z][a-z0-9+]{0,6}",
                "[a-z0-9_]{0,6}",
                password(),
                hosts(),
                "(/[a-z0-9_]{1,6}){0,3}",
                "([a-z_]{1,8}=[a-z0-9]{0,4}(&[a-z_]{1,8}=[a-z0-9]{0,4}){0,2})?",
            )
                .prop_map(|(scheme, user, pw, hosts, path, query)| {
                    let query = if query.is_empty() {
                        String::new()
                    } else {
                        format!("?{query}")
                    };
                    (format!("{scheme}://{user}:{pw}@{hosts}{path}{query}"), pw)
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Any text: a URL or a typed error, and a redaction; never a panic.
            #[test]
            fn any_text_parses_or_is_refused(raw in any::<String>()) {
                let _ = redact_url(&raw);
                let _ = LockUrl::scheme_of(&raw);
                let _ = LockUrl::take_option(&raw, "fencing_epoch");
                let _ = LockUrl::parse_file(&raw);
                if let Ok(url) = LockUrl::parse(&raw) {
                    let _ = url.options();
                    let _ = LockUrl::parse(&url.to_url_with_credentials());
                }
            }

            /// Text shaped like a URL, cut and spliced anywhere: the same.
            #[test]
            fn url_like_text_parses_or_is_refused(
                raw in "[a-z+]{0,5}(:|://)?([a-z%@:/?#&=,\\[\\]. ]|[0-9]){0,40}"
            ) {
                let _ = redact_url(&raw);
                if let Ok(url) = LockUrl::parse(&raw) {
                    let _ = url.options().and_then(UrlOptions::finish);
                    let again = LockUrl::parse(&url.to_url_with_credentials());
                    prop_assert_eq!(again.as_ref().ok(), Some(&url));
                }
            }

            /// The password, written as it is, is read back whole, and shows
            /// in no `Display`, `Debug`, error or redaction.
            #[test]
            fn passwords_are_read_whole_and_never_shown((raw, pw) in url_with_password()) {
                prop_assert!(!redact_url(&raw).contains("SECRET"), "{}", redact_url(&raw));
                match LockUrl::parse(&raw) {
                    Ok(url) => {
                        // Written as it is: `%XX` escapes are decoded, any other `%` kept.
                        let expected = decode_userinfo(&pw).expect("UTF-8");
                        prop_assert_eq!(url.password(), Some(expected.as_str()));
                        let shown = format!("{url} {url:?} {}", url.shown());
                        prop_assert!(!shown.contains("SECRET"), "{}", shown);
                        if let Err(e) = url.options().and_then(UrlOptions::finish) {
                            let text = format!("{e} {e:?}");
                            prop_assert!(!text.contains("SECRET"), "{}", text);
                        }
                        // What is shown parses again to the same settings.
                        let again = LockUrl::parse(url.shown()).expect("the shown URL parses");
                        prop_assert_eq!(again.scheme(), url.scheme());
                        prop_assert_eq!(again.user(), url.user());
                        prop_assert_eq!(again.password(), Some("***"));
                        prop_assert_eq!(again.hosts(), url.hosts());
                        prop_assert_eq!(again.path(), url.path());
                        prop_assert_eq!(again.query(), url.query());
                        // Written back for a client, it parses the same.
                        let back = LockUrl::parse(&url.to_url_with_credentials()).expect("parses");
                        prop_assert_eq!(back, url);
                    }
                    Err(e) => {
                        let text = format!("{e} {e:?}");
                        prop_assert!(!text.contains("SECRET"), "{}", text);
                    }
                }
            }
        }
    }
}
