//! Random inputs for every URL parser, outside the test suite:
//! `scripts/fuzz.sh N` (N inputs, default 1 000 000) builds this in release
//! mode and runs it. Each input is a URL-shaped text spliced from real
//! schemes, user-info with a marked password, hosts, ports, paths and
//! options (known names with hostile values), cut and mutated at random.
//! Every parser (the shared `LockUrl`, the redaction, each backend's
//! `*Config::from_url`, lock names) must give a value or a typed error:
//! a panic is counted, and so is any error, `Debug` or redaction that
//! shows a piece of a password still written as one (`:PASSWORD@`). Exit status 1 if either count is not 0.
//!
//! ```text
//! cargo run --release --example fuzz_urls --features full -- 10000000 [SEED]
//! ```

use std::panic::{AssertUnwindSafe, catch_unwind};

use distlock::LockError;
use lock_core::raw::{LockUrl, validate_name};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SCHEMES: &[&str] = &[
    "memory",
    "sqlite",
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
    "redlock",
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "etcd",
    "etcd+https",
    "zk",
    "zk+tls",
    "migrate",
    "REDIS",
    "x",
    "1bad",
    "",
];
const OPTIONS: &[&str] = &[
    "prefix",
    "connect_timeout",
    "connect_timeout_ms",
    "response_timeout",
    "handoff_window",
    "node_timeout",
    "drift_factor",
    "min_validity",
    "tls",
    "session_ttl",
    "session_ttl_s",
    "request_timeout",
    "session_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "table",
    "mode",
    "max_connections",
    "sessions",
    "fencing",
    "busy_timeout",
    "busy_timeout_ms",
    "fencing_epoch",
    "from",
    "to",
    "protocol",
    "sslmode",
];
const VALUES: &[&str] = &[
    "0",
    "1",
    "-1",
    "250ms",
    "5s",
    "1m 30s",
    "1e999s",
    "99999999999999999999ms",
    "18446744073709551615",
    "18446744073709551616s",
    "NaN",
    "inf",
    "0.5",
    "1.0000001",
    "on",
    "off",
    "maybe",
    "row",
    "advisory",
    "",
    "%",
    "%zz",
    "%FF",
    "a%20b",
    "redis://:x@h",
    "migrate%3A%2F%2F",
    "{}",
    "app:",
    "65535",
    "65536",
    "1d",
];
/// Characters that end, split or escape parts of a URL.
const AWKWARD: &[char] = &[
    ':', '/', '?', '#', '@', '&', '=', '%', '+', ',', '[', ']', ' ', '\n', '\0', '\u{7f}', 'é',
    '.', ';', '\\', '"', '*',
];

/// The marker every generated password is made of (and nothing else is).
const MARK: &str = "SECRET";

fn pick<'a>(rng: &mut StdRng, items: &[&'a str]) -> &'a str {
    items[rng.random_range(0..items.len())]
}

fn awkward(rng: &mut StdRng, max: usize) -> String {
    (0..rng.random_range(0..=max))
        .map(|_| AWKWARD[rng.random_range(0..AWKWARD.len())])
        .collect()
}

/// A password of markers and awkward characters.
fn password(rng: &mut StdRng) -> String {
    let mut pw = String::from(MARK);
    for _ in 0..rng.random_range(0..3) {
        pw.push_str(&awkward(rng, 3));
        pw.push_str(MARK);
    }
    pw
}

fn host(rng: &mut StdRng) -> String {
    let name = match rng.random_range(0..6) {
        0 => "127.0.0.1".to_string(),
        1 => "[::1]".to_string(),
        2 => "[::1".to_string(),
        3 => format!("h{}", rng.random_range(0..10)),
        4 => awkward(rng, 2),
        _ => "db.example".to_string(),
    };
    match rng.random_range(0..4) {
        0 => name,
        1 => format!("{name}:{}", rng.random_range(0..70_000)),
        2 => format!("{name}:{}", awkward(rng, 2)),
        _ => format!("{name}:{}", rng.random::<u64>()),
    }
}

/// One URL-shaped input, and its password if it has one still written
/// as a password (`:PASSWORD@` after the mutations).
fn input(rng: &mut StdRng) -> (String, Option<String>) {
    let mut url = String::new();
    url.push_str(pick(rng, SCHEMES));
    url.push_str(match rng.random_range(0..10) {
        0 => ":",
        1 => ":/",
        _ => "://",
    });
    let pw = rng.random_bool(0.7).then(|| password(rng));
    if let Some(pw) = &pw {
        if rng.random_bool(0.8) {
            url.push_str(&format!("u{}", awkward(rng, 1)));
        }
        url.push(':');
        url.push_str(pw);
        url.push('@');
    }
    let hosts = rng.random_range(0..4);
    for i in 0..hosts {
        if i > 0 {
            url.push(',');
        }
        url.push_str(&host(rng));
    }
    for _ in 0..rng.random_range(0..3) {
        url.push('/');
        url.push_str(if rng.random_bool(0.5) { "locks" } else { "0" });
        url.push_str(&awkward(rng, 1));
    }
    if rng.random_bool(0.8) {
        url.push('?');
        for i in 0..rng.random_range(0..4) {
            if i > 0 {
                url.push('&');
            }
            url.push_str(pick(rng, OPTIONS));
            url.push('=');
            url.push_str(pick(rng, VALUES));
        }
    }
    // Mutate: cut, splice awkward characters, or repeat a slice.
    for _ in 0..rng.random_range(0..3) {
        let at = (0..=url.len())
            .filter(|&i| url.is_char_boundary(i))
            .nth(rng.random_range(0..=url.chars().count()))
            .unwrap_or(url.len());
        match rng.random_range(0..3) {
            0 => url.truncate(at),
            1 => url.insert_str(at, &awkward(rng, 2)),
            _ => {
                let tail = url[at..].chars().take(6).collect::<String>();
                url.insert_str(at, &tail);
            }
        }
    }
    let still = pw.filter(|pw| url.contains(&format!(":{pw}@")));
    (url, still)
}

/// Every parser on `raw`: what each showed of it (its errors, `Debug`s and
/// redaction), for the leak check.
fn parse_all(raw: &str) -> Vec<String> {
    let mut shown = vec![distlock::redact_url(raw)];
    let mut keep = |r: Result<String, LockError>| match r {
        Ok(text) => shown.push(text),
        Err(e) => shown.push(format!("{e} {e:?}")),
    };
    keep(LockUrl::parse(raw).and_then(|u| {
        let mut options = u.options()?;
        for key in OPTIONS {
            let _ = options.duration(key);
        }
        let _ = LockUrl::parse(&u.to_url_with_credentials());
        Ok(format!("{u} {u:?} {}", u.shown()))
    }));
    keep(LockUrl::parse_file(raw).map(|u| format!("{u:?}")));
    keep(LockUrl::take_option(raw, "fencing_epoch").map(|(_, v)| format!("{v:?}")));
    keep(distlock::RedisConfig::from_url(raw).map(|c| format!("{c:?}")));
    keep(distlock::RedlockConfig::from_url(raw).map(|c| format!("{c:?}")));
    keep(distlock::EtcdConfig::from_url(raw).map(|c| format!("{c:?}")));
    keep(distlock::SqlConfig::from_url(raw).map(|c| format!("{c:?}")));
    keep(distlock::SqliteConfig::from_url(raw).map(|c| format!("{c:?}")));
    keep(distlock::ZkConfig::from_url(raw).map(|c| format!("{c:?}")));
    // A lock name is not a URL: its error quotes it (checked for panics only).
    let _ = validate_name(raw);
    shown
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    // A panic is counted, not printed for every input.
    std::panic::set_hook(Box::new(|_| {}));
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut panics, mut leaks) = (0u64, 0u64);
    let mut examples = Vec::new();
    for _ in 0..n {
        let (raw, pw) = input(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| parse_all(&raw))) {
            Err(_) => {
                panics += 1;
                if examples.len() < 5 {
                    examples.push(format!("panic: {raw:?}"));
                }
            }
            Ok(shown) if pw.is_some() && shown.iter().any(|s| s.contains(MARK)) => {
                leaks += 1;
                if examples.len() < 5 {
                    examples.push(format!("leak: {raw:?}"));
                }
            }
            Ok(_) => {}
        }
    }
    println!("{n} inputs (seed {seed}), 10 parsers each: {panics} panics, {leaks} leaks");
    for e in &examples {
        println!("  {e}");
    }
    if panics + leaks > 0 {
        std::process::exit(1);
    }
}
