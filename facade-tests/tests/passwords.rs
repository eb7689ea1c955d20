//! Passwords reach the server's authentication intact: a password made of
//! every printable ASCII character and one non-ASCII character, written
//! into the URL as it is (the library encodes the user-info) and written
//! percent-encoded, is accepted by each backend's server with
//! authentication on: an etcd with authentication enabled, a Redis ACL
//! user, a Postgres role, a MariaDB user and a ZooKeeper digest identity.
//! The accounts are made here, on the servers of `scripts/services.sh`.

use std::time::Duration;

use distlock::{LockError, LockOptions, Wait};
use lock_testkit::faults::{env, unique, upstreams_of};

/// Every printable ASCII character, in order, then a non-ASCII one.
fn password() -> String {
    let mut pw: String = (0x20u8..=0x7e).map(char::from).collect();
    pw.push('é');
    pw
}

/// `s` with every byte but ASCII letters and digits percent-encoded.
fn encoded(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The two ways a user writes the password into a URL.
fn forms() -> [(&'static str, String); 2] {
    [
        ("as it is", password()),
        ("percent-encoded", encoded(&password())),
    ]
}

/// Connect with `url` and take and give back one lock: only a client the
/// server authenticated gets that far.
async fn authenticated(url: &str, form: &str) {
    let locks = distlock::connect(url)
        .await
        .unwrap_or_else(|e| panic!("password written {form}: {e}"));
    let guard = locks
        .try_acquire(&unique("password"), &LockOptions::new().wait(Wait::No))
        .await
        .unwrap_or_else(|e| panic!("password written {form}: {e}"))
        .expect("a new name is free");
    assert!(guard.release().await.expect("release"));
}

fn host_of(env_var: &str) -> String {
    upstreams_of(&env(env_var)).remove(0)
}

#[tokio::test]
async fn etcd_with_authentication() {
    let admin_url = env("DISTLOCK_TEST_ETCD_AUTH_URL");
    let host = host_of("DISTLOCK_TEST_ETCD_AUTH_URL");
    let (user, root_pw) = admin_url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(info, _)| info.split_once(':'))
        .expect("DISTLOCK_TEST_ETCD_AUTH_URL names the root user");
    let options = etcd_client::ConnectOptions::new().with_user(user, root_pw);
    let mut admin = etcd_client::Client::connect([host.as_str()], Some(options))
        .await
        .expect("root connects");
    let _ = admin.user_delete("distlock_pw").await;
    admin
        .user_add("distlock_pw", password(), None)
        .await
        .expect("add the user");
    admin
        .user_grant_role("distlock_pw", "root")
        .await
        .expect("grant the user a role");
    for (form, pw) in forms() {
        authenticated(&format!("etcd://distlock_pw:{pw}@{host}"), form).await;
    }
    // The check is real: a wrong password is refused, as a configuration
    // error.
    let refused = match distlock::connect(&format!("etcd://distlock_pw:wrong@{host}")).await {
        Ok(locks) => locks
            .try_acquire(&unique("password"), &LockOptions::new())
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    wrong_password_is_a_configuration_error(refused);
}

#[tokio::test]
async fn redis_acl_user() {
    let url = env("DISTLOCK_TEST_REDIS_URL");
    let host = host_of("DISTLOCK_TEST_REDIS_URL");
    let client = redis::Client::open(url.as_str()).expect("redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect as the default user");
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("distlock_pw")
        .arg("reset")
        .arg("on")
        .arg(format!(">{}", password()))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    for (form, pw) in forms() {
        authenticated(&format!("redis://distlock_pw:{pw}@{host}/0"), form).await;
    }
    let refused = distlock::connect(&format!("redis://distlock_pw:wrong@{host}/0")).await;
    let refused = match refused {
        Ok(locks) => locks
            .try_acquire(&unique("password"), &LockOptions::new())
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    wrong_password_is_a_configuration_error(refused);
}

/// A SQL string literal of `s` (quotes doubled; `backslash` doubled too
/// where the server reads it as an escape).
fn literal(s: &str, backslash_escapes: bool) -> String {
    let mut out = s.replace('\'', "''");
    if backslash_escapes {
        out = out.replace('\\', "\\\\");
    }
    format!("'{out}'")
}

/// A wrong password is the configuration's to fix, not the server's
/// (retrying unchanged cannot help): `is_config()`, exit 78 in the
/// command; its message shows no password.
fn wrong_password_is_a_configuration_error<T>(refused: Result<T, LockError>) {
    match refused {
        Ok(_) => panic!("a wrong password was accepted"),
        Err(e) => {
            let said = e.report().to_string();
            assert!(e.is_config(), "not a configuration error: {said}");
            assert!(!said.contains("wrong"), "the password shows in: {said}");
        }
    }
}

#[tokio::test]
async fn postgres_role() {
    use sqlx::Connection;
    let url = env("DISTLOCK_TEST_POSTGRES_URL");
    let host = host_of("DISTLOCK_TEST_POSTGRES_URL");
    let mut admin = sqlx::PgConnection::connect(&url).await.expect("connect");
    // DDL takes no bind parameters: the password is a quoted literal
    // (standard_conforming_strings is on: backslashes are plain).
    let pw = literal(&password(), false);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP ROLE IF EXISTS distlock_pw; CREATE ROLE distlock_pw LOGIN PASSWORD {pw}; \
         GRANT distlock TO distlock_pw"
    )))
    .execute(&mut admin)
    .await
    .expect("create the role");
    for (form, pw) in forms() {
        let url =
            format!("postgres://distlock_pw:{pw}@{host}/distlock?mode=advisory&fencing=false");
        authenticated(&url, form).await;
    }
    let refused = distlock::connect(&format!(
        "postgres://distlock_pw:wrong@{host}/distlock?mode=advisory"
    ))
    .await;
    wrong_password_is_a_configuration_error(refused);
}

#[tokio::test]
async fn mysql_user() {
    use sqlx::Connection;
    let url = env("DISTLOCK_TEST_MYSQL_URL");
    let host = host_of("DISTLOCK_TEST_MYSQL_URL");
    let mut admin = sqlx::MySqlConnection::connect(&url).await.expect("connect");
    let pw = literal(&password(), true);
    for statement in [
        "DROP USER IF EXISTS 'distlock_pw'@'127.0.0.1'".to_string(),
        format!("CREATE USER 'distlock_pw'@'127.0.0.1' IDENTIFIED BY {pw}"),
        "GRANT ALL ON distlock.* TO 'distlock_pw'@'127.0.0.1'".to_string(),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .expect("make the user");
    }
    for (form, pw) in forms() {
        let url = format!("mysql://distlock_pw:{pw}@{host}/distlock?mode=advisory&fencing=false");
        authenticated(&url, form).await;
    }
    let refused = distlock::connect(&format!(
        "mysql://distlock_pw:wrong@{host}/distlock?mode=advisory"
    ))
    .await;
    wrong_password_is_a_configuration_error(refused);
}

#[tokio::test]
async fn zookeeper_digest() {
    let host = host_of("DISTLOCK_TEST_ZK_URL");
    let root = format!("/{}", unique("password").replace('/', "-"));
    let opts = LockOptions::new().wait(Wait::No);
    let [(_, raw), (_, escaped)] = forms();
    // Nodes made under a digest identity carry a creator-only ACL: a
    // client with the password written the other way is the same identity
    // (it sees the lock held), one with another password is refused.
    let first = distlock::connect(&format!("zk://app:{raw}@{host}{root}"))
        .await
        .expect("connect, the password as it is");
    let guard = first.acquire("job", &opts).await.expect("acquire");
    let same = distlock::connect(&format!("zk://app:{escaped}@{host}{root}"))
        .await
        .expect("connect, the password percent-encoded");
    assert!(
        same.try_acquire("job", &opts)
            .await
            .expect("the same identity")
            .is_none()
    );
    let stranger = distlock::connect(&format!("zk://app:wrong@{host}{root}"))
        .await
        .expect("connect");
    assert!(
        matches!(
            stranger.try_acquire("job", &opts).await,
            Err(LockError::Backend { .. })
        ),
        "another password is another identity"
    );
    assert!(guard.release().await.expect("release"));
    let next = same
        .acquire(
            "job",
            &opts.clone().wait(Wait::UpTo(Duration::from_secs(5))),
        )
        .await
        .expect("the same identity acquires after the release");
    assert!(next.release().await.expect("release"));
}
