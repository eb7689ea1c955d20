//! The replicas' acknowledgement of a master's writes, for the failover
//! tests of Sentinel and Cluster.

use redis::aio::ConnectionLike;

/// `WAIT want` on `conn` for up to about 2 s, in steps the client's
/// 500 ms response timeout allows: how many replicas acknowledged every
/// write made on `conn` so far (the caller writes first: on a connection
/// that made none, `WAIT` answers at once).
pub(crate) async fn acked(conn: &mut impl ConnectionLike, want: i64) -> i64 {
    let mut acked = 0;
    for _ in 0..5 {
        acked = redis::cmd("WAIT")
            .arg(want)
            .arg(400)
            .query_async(&mut *conn)
            .await
            .expect("WAIT");
        if acked == want {
            break;
        }
    }
    acked
}
