//! Credentials never leak: for every URL scheme, generated passwords that
//! hold unencoded reserved characters (`/`, `?`, `#`, `@`, `:`), spaces and
//! control characters never appear in an error's `Display` or `Debug`, nor
//! in anything the library logs while failing to connect.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::Captured;

/// The characters a generated password mixes with its marker: reserved
/// URL characters left unencoded, a space, control characters, non-ASCII.
const AWKWARD: &[char] = &[
    '/', '?', '#', '@', ':', '%', ' ', '\n', '\t', '\u{1}', '\u{7f}', '&', '=', ',', ';', 'é', '[',
    ']',
];

/// A password whose every part is marked: `MARK`, then awkward characters
/// between further `MARK`s, so that any fragment of it long enough to
/// matter contains a marker.
fn password(rng: &mut StdRng) -> String {
    let mut pw = String::from("MARK");
    for _ in 0..rng.random_range(1..4) {
        for _ in 0..rng.random_range(1..3) {
            pw.push(AWKWARD[rng.random_range(0..AWKWARD.len())]);
        }
        pw.push_str("MARK");
    }
    pw
}

/// The URL templates, one or two per scheme; `{pw}` is the password.
/// Nothing listens on port 1, so a URL that parses fails to connect fast;
/// a scheme whose backend is not compiled in fails with `InvalidUrl`,
/// which must not show the password either.
fn templates() -> Vec<&'static str> {
    vec![
        "memory://u:{pw}@host",
        "nosuch://u:{pw}@host",
        "sqlite://u:{pw}@/tmp/distlock-credentials-test.db?busy_timeout_ms=x",
        "redis://u:{pw}@127.0.0.1:1/0?connect_timeout_ms=200",
        "rediss://:{pw}@127.0.0.1:1?connect_timeout_ms=200",
        "redis+sentinel://u:{pw}@127.0.0.1:1,127.0.0.1:1/group?connect_timeout_ms=200",
        "redis+cluster://u:{pw}@127.0.0.1:1,127.0.0.1:1?connect_timeout_ms=200",
        "redlock://u:{pw}@127.0.0.1:1,127.0.0.1:1,127.0.0.1:1?connect_timeout_ms=200",
        "postgres://u:{pw}@127.0.0.1:1/db?connect_timeout_ms=200",
        "mysql://u:{pw}@127.0.0.1:1/db?connect_timeout_ms=200",
        "mariadb://u:{pw}@127.0.0.1:1/db?connect_timeout_ms=200",
        "etcd://u:{pw}@127.0.0.1:1?connect_timeout_ms=200",
        "zk://u:{pw}@127.0.0.1:1/root?session_timeout_ms=1000",
    ]
}

#[test]
fn generated_passwords_never_appear_in_errors_or_logs() {
    let captured = Captured::default();
    let _default = tracing::subscriber::set_default(captured.subscriber(tracing::Level::TRACE));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rng = StdRng::seed_from_u64(0x5ec2e7);
    let mut checked = 0;
    let mut leaks = Vec::new();
    for template in templates() {
        for _ in 0..16 {
            let url = template.replace("{pw}", &password(&mut rng));
            let outcome = rt.block_on(async {
                tokio::time::timeout(Duration::from_millis(500), distlock::connect(&url)).await
            });
            let text = match outcome {
                Ok(Err(e)) => format!("{e}\n{e:?}"),
                Ok(Ok(_)) => panic!("{url:?}: connected to nothing"),
                // Still trying to connect: nothing to show but the logs.
                Err(_) => String::new(),
            };
            if text.contains("MARK") {
                leaks.push(format!("{url:?}: {text}"));
            }
            checked += 1;
        }
    }
    assert!(
        leaks.is_empty(),
        "{} passwords leaked into errors:\n{}",
        leaks.len(),
        leaks.join("\n")
    );
    let logs = captured.text();
    assert!(
        !logs.contains("MARK"),
        "a password leaked into the logs:\n{}",
        logs.lines()
            .filter(|l| l.contains("MARK"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(checked, 16 * templates().len());
}
