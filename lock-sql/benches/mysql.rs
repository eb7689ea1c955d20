//! MySQL/MariaDB lock benchmark: the session-lock body
//! (`suites/session_bench.rs`: distlock in both modes against hand-written
//! floors, then contended hand-offs) on MySQL's floors: `GET_LOCK`, and
//! row locks with the token's upsert beside the transaction.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! cargo bench -p lock-sql --features mysql --bench mysql
//! ```

#[path = "suites/session_bench.rs"]
mod session_bench;

use lock_core::Access;
use lock_sql::MySqlLock;
use lock_testkit::bench::cycles::Cycles;
use session_bench::{Floors, PERMITS, now_ms, rw_counter};
use sqlx::{Connection, MySqlConnection};

/// The row lock without a token, ended with COMMIT.
const ROW_COMMIT: &str = "row, no token: BEGIN; FOR UPDATE; COMMIT";

fn url() -> String {
    std::env::var("DISTLOCK_TEST_MYSQL_URL")
        .expect("DISTLOCK_TEST_MYSQL_URL (see scripts/services.sh env)")
}

/// The counter's upsert a grant makes: in the `MEMORY` counters table, in
/// the epoch the counters count in (see `lock-sql/src/mysql/tokens.rs`),
/// with the grant's holder record beside the token.
const TOKEN_UPSERT: &str = "INSERT INTO distlock_locks_counters (name, token, holder) VALUES \
     (?, LAST_INSERT_ID((COALESCE((SELECT epoch FROM distlock_locks_run WHERE id = 1), 0) << 32) | 1), ?) \
     ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = VALUES(holder)";

/// The holder record distlock writes with a grant on default options.
fn holder_record() -> Vec<u8> {
    lock_core::LockOptions::new()
        .holder_record()
        .as_bytes()
        .to_vec()
}

/// Advance `name`'s counter in one statement: the token.
async fn draw_token(conn: &mut MySqlConnection, name: &str) -> u64 {
    sqlx::query(TOKEN_UPSERT)
        .bind(name.as_bytes())
        .bind(holder_record())
        .execute(&mut *conn)
        .await
        .expect("token")
        .last_insert_id()
}

/// Open a read-committed transaction on `conn`, with distlock's timeouts
/// (as a permit's or a reader-writer grant's).
async fn begin_read_committed(conn: &mut MySqlConnection) {
    sqlx::raw_sql(
        "SET SESSION tx_isolation = 'READ-COMMITTED', SESSION innodb_lock_wait_timeout = 50, \
         SESSION idle_transaction_timeout = 30; START TRANSACTION",
    )
    .execute(&mut *conn)
    .await
    .expect("begin");
}

/// Lock `name`'s row in the open transaction on `conn`.
async fn lock_row(conn: &mut MySqlConnection, name: &str) {
    let row = sqlx::query("SELECT name FROM distlock_locks WHERE name = ? FOR UPDATE")
        .bind(name.as_bytes())
        .fetch_optional(&mut *conn)
        .await
        .expect("lock");
    assert!(row.is_some());
}

/// The hand-written row lock without a token on `conn`: its transaction
/// ended with COMMIT if `commit`, else ROLLBACK.
async fn row_no_token(conn: &mut MySqlConnection, name: &str, commit: bool) {
    let mut tx = conn.begin().await.expect("begin");
    lock_row(&mut tx, name).await;
    match commit {
        true => tx.commit().await.expect("end"),
        false => tx.rollback().await.expect("end"),
    }
}

/// `GET_LOCK` on `name` as a hand-written lock names it.
async fn get_lock(conn: &mut MySqlConnection, name: &str) {
    let granted: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 50)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("lock");
    assert_eq!(granted, Some(1));
}

/// `RELEASE_LOCK` of what [`get_lock`] took.
async fn release_lock(conn: &mut MySqlConnection, name: &str) {
    let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
        .bind(name.as_bytes())
        .fetch_one(&mut *conn)
        .await
        .expect("unlock");
    assert_eq!(released, Some(1));
}

impl Floors for MySqlFloors {
    /// `SELECT 1`: one round trip, its row read and dropped.
    async fn ping(&mut self) {
        let conn = &mut self.conn;
        sqlx::query("SELECT 1").execute(conn).await.expect("ping");
    }

    /// The cheapest hand-written row lock with a token that survives a
    /// restart: the lock's transaction on `conn` (with the same timeouts),
    /// the token's upsert on `tokens`, then the end of the lock's
    /// transaction.
    async fn fenced_row(&mut self, name: &str) {
        let (conn, tokens) = (&mut self.conn, &mut self.tokens);
        sqlx::raw_sql(
            "SET SESSION innodb_lock_wait_timeout = 50, SESSION idle_transaction_timeout = 30; START TRANSACTION",
        )
        .execute(&mut *conn)
        .await
        .expect("begin");
        lock_row(conn, name).await;
        assert!(draw_token(tokens, name).await > 0);
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("end");
    }

    /// The cheapest hand-written advisory lock with a token that survives
    /// a restart: `GET_LOCK` feeding the token's upsert in one statement,
    /// then `RELEASE_LOCK`.
    async fn fenced_advisory(&mut self, name: &str) {
        let conn = &mut self.conn;
        let done = sqlx::query(
            "INSERT INTO distlock_locks_counters (name, token, holder) \
             SELECT ?, LAST_INSERT_ID((COALESCE((SELECT epoch FROM distlock_locks_run WHERE id = 1), 0) << 32) | 1), ? \
             FROM (SELECT GET_LOCK(?, 50) AS got) AS l WHERE l.got = 1 \
             ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1), holder = VALUES(holder)",
        )
        .bind(name.as_bytes())
        .bind(holder_record())
        .bind(name.as_bytes())
        .execute(&mut *conn)
        .await
        .expect("lock and token");
        assert!(done.rows_affected() > 0 && done.last_insert_id() > 0);
        release_lock(conn, name).await;
    }

    /// The hand-written row lock without a fencing token.
    async fn row_plain(&mut self, name: &str) {
        row_no_token(&mut self.conn, name, false).await
    }

    /// The hand-written advisory lock without a fencing token.
    async fn advisory_plain(&mut self, name: &str) {
        let conn = &mut self.conn;
        get_lock(conn, name).await;
        release_lock(conn, name).await;
    }

    /// The hand-written row lock without a token ending its transaction as
    /// a user's own does, with COMMIT.
    async fn more(&mut self, m: &mut Cycles) {
        m.measure(ROW_COMMIT, async |_| {
            row_no_token(&mut self.conn, "bench/raw", true).await
        })
        .await;
    }

    fn more_comparisons(&self) -> &'static [(&'static str, &'static str)] {
        &[
            (session_bench::ROW, ROW_COMMIT),
            (session_bench::ROW_RENEWED, ROW_COMMIT),
        ]
    }

    /// The hand-written reader-writer lock, its transaction opened as the
    /// permit floor's (MariaDB's shared lock is `LOCK IN SHARE MODE`).
    async fn rw(&mut self, name: &str, access: Access) {
        let (conn, tokens) = (&mut self.conn, &mut self.tokens);
        begin_read_committed(conn).await;
        let now = now_ms();
        let counter = rw_counter(name);
        let token: u64 = if access == Access::Read {
            let marked: Option<i32> = sqlx::query_scalar(
                "SELECT 1 FROM distlock_locks_rw_marks WHERE name = ? AND expires > ? AND arrival <= ? LIMIT 1",
            )
            .bind(name.as_bytes())
            .bind(now)
            .bind(now)
            .fetch_optional(&mut *conn)
            .await
            .expect("marks");
            assert!(marked.is_none());
            let row = sqlx::query(
                "SELECT name FROM distlock_locks_rw WHERE name = ? LOCK IN SHARE MODE NOWAIT",
            )
            .bind(name.as_bytes())
            .fetch_optional(&mut *conn)
            .await
            .expect("share");
            assert!(row.is_some());
            sqlx::query_scalar("SELECT token FROM distlock_locks_counters WHERE name = ?")
                .bind(counter.as_bytes())
                .fetch_one(&mut *tokens)
                .await
                .expect("latest token")
        } else {
            let row =
                sqlx::query("SELECT name FROM distlock_locks_rw WHERE name = ? FOR UPDATE NOWAIT")
                    .bind(name.as_bytes())
                    .fetch_optional(&mut *conn)
                    .await
                    .expect("hold");
            assert!(row.is_some());
            draw_token(tokens, &counter).await
        };
        assert!(token > 0);
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("end");
    }

    /// The hand-written permit, its transaction opened as the row floor's
    /// (read committed, the same timeouts).
    async fn fenced_permit(&mut self, name: &str) {
        let (conn, tokens) = (&mut self.conn, &mut self.tokens);
        begin_read_committed(conn).await;
        let (slot, lim): (i32, i32) = sqlx::query_as(
            "SELECT slot, lim FROM distlock_locks_permits WHERE name = ? AND slot >= 0 AND slot < ? \
             ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .bind(name.as_bytes())
        .bind(PERMITS)
        .fetch_one(&mut *conn)
        .await
        .expect("a slot");
        assert_eq!(u32::try_from(lim), Ok(PERMITS));
        assert!(draw_token(tokens, &format!("{name}:{slot}")).await > 0);
        sqlx::raw_sql("ROLLBACK")
            .execute(&mut *conn)
            .await
            .expect("end");
    }
}

/// MySQL's floors, each on plain connections: `conn` for the locks, and
/// `tokens` where the row floor commits its tokens, outside the lock's
/// transaction.
struct MySqlFloors {
    conn: MySqlConnection,
    tokens: MySqlConnection,
}

#[tokio::main]
async fn main() {
    let connect = async || MySqlConnection::connect(&url()).await.expect("connection");
    let mut floors = MySqlFloors {
        conn: connect().await,
        tokens: connect().await,
    };
    session_bench::run(
        &url(),
        async |url| MySqlLock::connect(url).await.expect("distlock"),
        &mut floors,
    )
    .await;
}
