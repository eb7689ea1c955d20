//! The replicas' acknowledgement of a master's writes, for the failover
//! tests of Sentinel and Cluster.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

/// How long a replica back from a previous test's failover may take to
/// catch up with its master.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);

/// `WAIT want` on `conn` for up to about `within`, in steps the client's
/// 500 ms response timeout allows: how many replicas acknowledged every
/// write made on `conn` so far (the caller writes first: on a connection
/// that made none, `WAIT` answers at once).
pub(crate) async fn acked(conn: &mut impl ConnectionLike, want: i64, within: Duration) -> i64 {
    let start = Instant::now();
    loop {
        let acked: i64 = redis::cmd("WAIT")
            .arg(want)
            .arg(400)
            .query_async(&mut *conn)
            .await
            .expect("WAIT");
        if acked == want || start.elapsed() >= within {
            return acked;
        }
    }
}
