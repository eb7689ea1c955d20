//! The query options of a backend URL, read the same way for every scheme:
//! values by type, durations with their unit (`250ms`, `5s`, `1m`), the
//! older unit-suffixed names (`connect_timeout_ms=250`, `session_ttl_s=5`)
//! as aliases, and an option nobody reads refused by name.

use std::str::FromStr;
use std::time::Duration;

use crate::error::LockError;

/// A count of one unit as a duration (`Duration::from_millis`, …).
type Unit = fn(u64) -> Duration;

/// The options after a URL's `?`, taken one by one by the backend's parser
/// and then [`finish`](UrlOptions::finish)ed: whatever no parser took is
/// an unknown option, and the error lists the ones that are known.
///
/// ```
/// use std::time::Duration;
/// use lock_core::raw::UrlOptions;
///
/// let mut opts = UrlOptions::parse("x://h", "prefix=app&connect_timeout_ms=250&tls=on")?;
/// assert_eq!(opts.text("prefix")?.as_deref(), Some("app"));
/// assert_eq!(opts.duration("connect_timeout")?, Some(Duration::from_millis(250)));
/// assert_eq!(opts.flag("tls")?, Some(true));
/// opts.finish()?;
///
/// let mut opts = UrlOptions::parse("x://h?conect_timeout=1s", "conect_timeout=1s")?;
/// assert_eq!(opts.duration("connect_timeout")?, None);
/// let err = opts.finish().unwrap_err().to_string();
/// assert!(err.contains("unknown option `conect_timeout`"), "{err}");
/// assert!(err.contains("known: connect_timeout"), "{err}");
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Debug)]
pub struct UrlOptions {
    /// The URL as errors show it (credentials already removed).
    shown: String,
    /// The options not taken yet, decoded, in the URL's order.
    pairs: Vec<(String, String)>,
    /// The names asked for so far, for the unknown-option error.
    known: Vec<&'static str>,
    /// Whether `shown` shows the query as written, so that errors may
    /// quote its values (a query the redaction hid may hold credentials).
    values_shown: bool,
}

impl UrlOptions {
    /// Decode `query` (the text after `?`, `%`-escaped, `+` for a space).
    /// `shown` is the URL as errors may quote it, without credentials;
    /// option names and values are quoted only if it ends with `?query`. An
    /// option without a name, or one given twice, is
    /// [`LockError::InvalidUrl`].
    pub fn parse(shown: &str, query: &str) -> Result<Self, LockError> {
        let quotable = query.is_empty() || shown.ends_with(&format!("?{query}"));
        Self::parse_quoting(shown, query, quotable)
    }

    /// [`parse`](Self::parse), saying whether errors may quote option
    /// names and values (not where the URL as shown hides its query).
    pub(crate) fn parse_quoting(
        shown: &str,
        query: &str,
        quotable: bool,
    ) -> Result<Self, LockError> {
        let mut options = UrlOptions {
            shown: shown.to_string(),
            pairs: Vec::new(),
            known: Vec::new(),
            values_shown: quotable,
        };
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if key.is_empty() {
                return Err(options.invalid("an option without a name".into()));
            }
            if options.pairs.iter().any(|(k, _)| *k == key) {
                let key = options.name(&key);
                return Err(options.invalid(format!("option {key} is given twice")));
            }
            options.pairs.push((key.into_owned(), value.into_owned()));
        }
        Ok(options)
    }

    /// The [`LockError::InvalidUrl`] of this URL, for `reason`.
    pub fn invalid(&self, reason: String) -> LockError {
        LockError::InvalidUrl {
            url: self.shown.clone(),
            reason,
        }
    }

    /// Take option `key`'s text, if given.
    pub fn text(&mut self, key: &'static str) -> Result<Option<String>, LockError> {
        self.known.push(key);
        Ok(self.take(key))
    }

    /// Take option `key`, read by `read` (`None`: not what `expected`
    /// says, an error naming the option and the value).
    pub fn parsed<T>(
        &mut self,
        key: &'static str,
        expected: &str,
        read: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>, LockError> {
        self.known.push(key);
        let Some(value) = self.take(key) else {
            return Ok(None);
        };
        match read(&value) {
            Some(v) => Ok(Some(v)),
            None => {
                let value = self.value(&value);
                Err(self.invalid(format!("`{key}` must be {expected}, got {value}")))
            }
        }
    }

    /// Take option `key` as a number (or anything else with [`FromStr`]).
    pub fn number<T: FromStr>(&mut self, key: &'static str) -> Result<Option<T>, LockError> {
        self.parsed(key, "a number", |v| v.parse().ok())
    }

    /// Take option `key` as yes or no (`true`/`false`, `on`/`off`, `1`/`0`).
    pub fn flag(&mut self, key: &'static str) -> Result<Option<bool>, LockError> {
        self.parsed(key, "true or false", parse_flag)
    }

    /// Take option `key` as a duration with its unit (`250ms`, `5s`,
    /// `1m 30s`), or its older names `KEY_ms` (whole milliseconds) and
    /// `KEY_s` (whole seconds). Giving more than one of the three is an
    /// error, as is a bare number under `key` (which unit is meant?).
    pub fn duration(&mut self, key: &'static str) -> Result<Option<Duration>, LockError> {
        self.known.push(key);
        let millis = format!("{key}_ms");
        let secs = format!("{key}_s");
        let given: Vec<&str> = [key, millis.as_str(), secs.as_str()]
            .into_iter()
            .filter(|k| self.pairs.iter().any(|(p, _)| p == k))
            .collect();
        if given.len() > 1 {
            return Err(self.invalid(format!(
                "`{}` and `{}` are the same option, given twice",
                given[0], given[1]
            )));
        }
        if let Some(value) = self.take(key) {
            return match humantime::parse_duration(&value) {
                Ok(d) => Ok(Some(d)),
                Err(_) if value.parse::<u64>().is_ok() => Err(self.invalid(format!(
                    "`{key}` needs a unit, for example `{value}ms` or `{value}s`"
                ))),
                Err(e) => {
                    let value = self.value(&value);
                    Err(self.invalid(format!(
                        "`{key}` must be a duration such as `250ms` or `5s`, got {value}: {e}"
                    )))
                }
            };
        }
        let by_unit: [(String, Unit); 2] =
            [(millis, Duration::from_millis), (secs, Duration::from_secs)];
        for (name, unit) in by_unit {
            if let Some(value) = self.take(&name) {
                let n: u64 = value.parse().map_err(|_| {
                    let value = self.value(&value);
                    self.invalid(format!(
                        "`{name}` must be a whole number, got {value} (or write `{key}=` with a unit)"
                    ))
                })?;
                return Ok(Some(unit(n)));
            }
        }
        Ok(None)
    }

    /// Refuse whatever no parser took: an unknown option, named, with the
    /// known ones listed.
    pub fn finish(self) -> Result<(), LockError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((key, _)) => Err(self.invalid(format!(
                "unknown option {} (known: {})",
                self.name(key),
                self.known.join(", ")
            ))),
        }
    }

    /// What no parser took, in the URL's order, for a backend that hands
    /// the rest to its driver unread.
    pub fn into_rest(self) -> Vec<(String, String)> {
        self.pairs
    }

    /// Take the options the backend's driver reads itself (the SQL
    /// backends' `sslmode`, `application_name`, …), in the URL's order:
    /// those named in `names`, or starting with one of `prefixes` (as
    /// Postgres's `options[search_path]`). They count as known, so that
    /// [`finish`](Self::finish) still refuses a misspelt one by name.
    pub fn driver(
        &mut self,
        names: &[&'static str],
        prefixes: &[&'static str],
    ) -> Vec<(String, String)> {
        self.known.extend(names);
        self.known
            .extend(prefixes.iter().map(|p| p.trim_end_matches('[')));
        let (driver, ours) = std::mem::take(&mut self.pairs)
            .into_iter()
            .partition(|(key, _)| {
                names.contains(&key.as_str()) || prefixes.iter().any(|p| key.starts_with(p))
            });
        self.pairs = ours;
        driver
    }

    /// An option's name as errors quote it: `` `name` `` if it is a plain
    /// word and the URL as shown shows its query, else not at all (it may
    /// be a piece of a password).
    fn name(&self, key: &str) -> String {
        let plain = key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if plain && self.values_shown {
            format!("`{key}`")
        } else {
            "whose name is not a plain word".to_string()
        }
    }

    /// A value as errors quote it, if the URL as shown shows it.
    fn value(&self, value: &str) -> String {
        // A value with an `@` may be a nested URL's credentials.
        if self.values_shown && !value.contains('@') {
            format!("{value:?}")
        } else {
            "a value not shown here".to_string()
        }
    }

    fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        Some(self.pairs.remove(i).1)
    }
}

/// A URL option's yes or no: `true`/`false`, `on`/`off` or `1`/`0`.
fn parse_flag(value: &str) -> Option<bool> {
    match value {
        "true" | "on" | "1" => Some(true),
        "false" | "off" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(e: LockError) -> String {
        match e {
            LockError::InvalidUrl { reason, .. } => reason,
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }

    #[test]
    fn durations_take_units_and_the_old_names() {
        let mut o = UrlOptions::parse("x://h", "a=1.5s&b_ms=250&c_s=3&d=2m").expect("valid");
        assert_eq!(o.duration("a").unwrap(), Some(Duration::from_millis(1500)));
        assert_eq!(o.duration("b").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(o.duration("c").unwrap(), Some(Duration::from_secs(3)));
        assert_eq!(o.duration("d").unwrap(), Some(Duration::from_secs(120)));
        assert_eq!(o.duration("e").unwrap(), None);
        o.finish().expect("all taken");
    }

    #[test]
    fn bad_durations_are_named() {
        for (query, says) in [
            ("a=250", "needs a unit"),
            ("a=soon", "must be a duration"),
            ("a_ms=1.5", "whole number"),
            ("a_ms=-1", "whole number"),
            ("a=1s&a_ms=1000", "same option"),
        ] {
            let mut o = UrlOptions::parse("x://h", query).expect("valid");
            let r = reason(o.duration("a").unwrap_err());
            assert!(r.contains(says) && r.contains('a'), "{query}: {r}");
        }
    }

    #[test]
    fn unknown_empty_and_repeated_options_are_refused() {
        let mut o =
            UrlOptions::parse("x://h?prefix=p&tsl=true", "prefix=p&tsl=true").expect("valid");
        o.text("prefix").unwrap();
        o.flag("tls").unwrap();
        let r = reason(o.finish().unwrap_err());
        assert!(
            r.contains("unknown option `tsl`") && r.contains("known: prefix, tls"),
            "{r}"
        );
        assert!(reason(UrlOptions::parse("x://h", "=1").unwrap_err()).contains("without a name"));
        assert!(reason(UrlOptions::parse("x://h", "a=1&a=2").unwrap_err()).contains("twice"));
    }

    #[test]
    fn values_are_decoded_and_typed() {
        let mut o = UrlOptions::parse("x://h?p=a%2Fb+c&n=7&f=off&x=2", "p=a%2Fb+c&n=7&f=off&x=2")
            .expect("valid");
        assert_eq!(o.text("p").unwrap().as_deref(), Some("a/b c"));
        assert_eq!(o.number::<u32>("n").unwrap(), Some(7));
        assert_eq!(o.flag("f").unwrap(), Some(false));
        let r = reason(
            o.parsed("x", "odd", |v| v.parse::<u8>().ok().filter(|n| n % 2 == 1))
                .unwrap_err(),
        );
        assert!(r.contains("`x` must be odd, got \"2\""), "{r}");
        assert!(
            UrlOptions::parse("x://h", "n=seven")
                .unwrap()
                .number::<u32>("n")
                .is_err()
        );
    }
}
