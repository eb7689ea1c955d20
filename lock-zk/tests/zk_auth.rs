//! Digest credentials from the URL: the nodes carry a creator-only ACL, so
//! clients with the same credentials share the locks and others are
//! refused with a typed error; the password shows nowhere.

use std::time::Duration;

use lock_core::{DistributedLock, LockError, LockOptions, Wait};
use lock_testkit::faults::{env, unique, upstreams_of};
use lock_zk::ZkLock;
use zookeeper_client::{Client, Permission};

/// `zk://[userinfo@]host:port/root` on the standalone server.
fn url(userinfo: &str, root: &str) -> String {
    let hosts = upstreams_of(&env("DISTLOCK_TEST_ZK_URL")).join(",");
    format!("zk://{userinfo}{hosts}{root}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_guard_the_nodes() {
    let root = format!("/{}", unique("auth").replace('/', "-"));
    let opts = LockOptions::new().wait(Wait::No);
    let app = ZkLock::connect(&url("app:s3cr%40t@", &root))
        .await
        .expect("connect with credentials");
    assert!(!format!("{app:?}").contains("s3cr"), "{app:?}");
    let g = app.acquire("job", &opts).await.expect("acquire");

    // The same credentials: the same lock.
    let peer = ZkLock::connect(&url("app:s3cr%40t@", &root))
        .await
        .expect("connect");
    assert!(peer.try_acquire("job", &opts).await.expect("try").is_none());

    // Other credentials, or none: refused, not silently a second lock.
    for userinfo in ["app:wrong@", "other:s3cr%40t@", ""] {
        let stranger = ZkLock::connect(&url(userinfo, &root))
            .await
            .expect("connect");
        match stranger.try_acquire("job", &opts).await {
            Err(e @ LockError::Backend { .. }) => {
                let text = format!("{e} {e:?}");
                assert!(text.contains("not authorised"), "{text}");
                assert!(!text.contains("s3cr"), "{text}");
            }
            other => panic!("{userinfo:?}: expected a refusal, got {other:?}"),
        }
    }

    // The ACL on our node names the digest identity (user:base64(sha1)),
    // with every permission, and nothing for anyone else.
    let hosts = upstreams_of(&env("DISTLOCK_TEST_ZK_URL")).join(",");
    let raw = Client::connector()
        .with_auth("digest", b"app:s3cr@t")
        .connect(&hosts)
        .await
        .expect("plain client");
    let dir = format!("{root}/njob");
    let child = raw.list_children(&dir).await.expect("list")[0].clone();
    let (acls, _) = raw
        .get_acl(&format!("{dir}/{child}"))
        .await
        .expect("read the ACL");
    assert_eq!(acls.len(), 1, "{acls:?}");
    assert_eq!(acls[0].scheme(), "digest", "{acls:?}");
    assert!(acls[0].id().starts_with("app:"), "{acls:?}");
    assert_eq!(acls[0].permission(), Permission::ALL);

    assert!(g.release().await.expect("release"));
    let next = peer
        .acquire("job", &opts.clone().wait_timeout(Duration::from_secs(5)))
        .await
        .expect("the peer acquires after the release");
    assert!(next.release().await.expect("release"));
}
