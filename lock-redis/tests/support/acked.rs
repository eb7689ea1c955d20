//! The replicas' acknowledgement of a master's writes, for the failover
//! tests of Sentinel and Cluster.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

/// How long a replica back from a previous test's failover may take to
/// catch up with its master.
pub(crate) const SETTLE: Duration = Duration::from_secs(10);

/// How long one `WAIT` blocks on the server: half the client's default
/// 500 ms response timeout, leaving the reply the other half to arrive on
/// a loaded machine.
const STEP_MS: u64 = 250;

/// `WAIT want` on `conn` for up to about `within`, in steps of [`STEP_MS`]:
/// how many replicas acknowledged every write made on `conn` so far (the
/// caller writes first: on a connection that made none, `WAIT` answers at
/// once). A step whose reply outlasts the client's response timeout (the
/// machine busy) counts as no answer and is tried again; the count is the
/// last answered step's.
pub(crate) async fn acked(conn: &mut impl ConnectionLike, want: i64, within: Duration) -> i64 {
    let start = Instant::now();
    let mut acked = 0;
    loop {
        match redis::cmd("WAIT")
            .arg(want)
            .arg(STEP_MS)
            .query_async::<i64>(&mut *conn)
            .await
        {
            Ok(n) => acked = n,
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("WAIT: {e}"),
        }
        if acked == want || start.elapsed() >= within {
            return acked;
        }
    }
}
