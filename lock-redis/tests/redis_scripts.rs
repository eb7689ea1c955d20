//! The acquire script against the project's Redis, run as a client that
//! resends requests runs it: the redis-rs cluster client sends a request
//! again when its connection drops before the reply, so one attempt's
//! script can run twice.

use lock_redis::raw::{ACQUIRE, Keys, ScriptCall};
use lock_testkit::faults::{env, unique};

async fn acquire_once(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    owner: &str,
) -> (i64, i64) {
    let keys = Keys::new("distlock:").all(name);
    let mut call = ScriptCall::new(
        &ACQUIRE,
        &[
            &keys.lock,
            &keys.fence,
            &keys.queue,
            &keys.handoff,
            &keys.holder,
        ],
        6,
    );
    call.arg(owner)
        .arg(5_000u64)
        .arg("")
        .arg(30_000u64)
        .arg("")
        .arg("record");
    call.invoke(conn).await.expect("the acquire script")
}

/// The same attempt's script run twice is granted twice with the one
/// token of its grant (before, the second run answered "held", and the
/// attempt, granted, took its own lock for someone else's); another
/// owner is still refused.
#[tokio::test]
async fn an_acquire_sent_again_is_the_same_grant() {
    let mut conn = redis::Client::open(env("DISTLOCK_TEST_REDIS_URL"))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let name = unique("resent-acquire");
    let (granted, token) = acquire_once(&mut conn, &name, "00112233445566778899aabbccddeeff").await;
    assert_eq!(granted, 1, "the first run is granted");
    let again = acquire_once(&mut conn, &name, "00112233445566778899aabbccddeeff").await;
    assert_eq!(again, (1, token), "the run sent again is the same grant");
    let other = acquire_once(&mut conn, &name, "ffeeddccbbaa99887766554433221100").await;
    assert_eq!(other.0, 0, "another owner is refused");
}
