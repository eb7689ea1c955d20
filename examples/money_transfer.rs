//! Moving money between two accounts under a Postgres row lock, with the
//! transfer committed in the lock's own transaction: the write and the
//! release happen together or not at all.
//!
//! ```sh
//! export $(scripts/services.sh env | xargs)
//! DISTLOCK_URL=$DISTLOCK_TEST_POSTGRES_URL cargo run --example money_transfer --features postgres
//! ```
//!
//! Several workers transfer concurrently; each locks both accounts (in a
//! fixed order, so two transfers never wait on each other in a cycle),
//! checks the balance, writes both rows and commits. The total never
//! changes, and no balance goes below zero.

use std::time::Duration;

use distlock::{LockOptions, PgLock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DISTLOCK_URL")
        .map_err(|_| "set DISTLOCK_URL to a postgres:// URL (row mode)")?;
    let locks = PgLock::connect(&url).await?;

    // The application's own table.
    let mut setup = locks.begin("example/setup", &LockOptions::new()).await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS example_accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL);
         INSERT INTO example_accounts VALUES ('alice', 100), ('bob', 100)
           ON CONFLICT (id) DO UPDATE SET balance = 100",
    )
    .execute(setup.conn()?)
    .await?;
    setup.commit().await?;

    let mut workers = Vec::new();
    for (i, (from, to, amount)) in [
        ("alice", "bob", 30),
        ("bob", "alice", 50),
        ("alice", "bob", 80),
    ]
    .into_iter()
    .enumerate()
    {
        let locks = locks.clone();
        workers.push(tokio::spawn(async move {
            let outcome = transfer(&locks, from, to, amount).await;
            println!("transfer {i}: {amount} from {from} to {to}: {outcome:?}");
        }));
    }
    for w in workers {
        w.await?;
    }
    let balances: Vec<(String, i64)> =
        sqlx::query_as("SELECT id, balance FROM example_accounts ORDER BY id")
            .fetch_all(
                &mut *locks
                    .begin("example/read", &LockOptions::new())
                    .await?
                    .conn()?,
            )
            .await?;
    let total: i64 = balances.iter().map(|(_, b)| b).sum();
    println!("balances {balances:?}, total {total}");
    assert_eq!(total, 200, "money was created or destroyed");
    Ok(())
}

/// Move `amount` from `from` to `to`, or refuse if `from` is short.
async fn transfer(
    locks: &PgLock,
    from: &str,
    to: &str,
    amount: i64,
) -> Result<&'static str, Box<dyn std::error::Error + Send + Sync>> {
    // One lock for the pair, named in a fixed order.
    let (a, b) = if from < to { (from, to) } else { (to, from) };
    let opts = LockOptions::new().wait_timeout(Duration::from_secs(10));
    let mut tx = locks.begin(&format!("accounts/{a}+{b}"), &opts).await?;
    let balance: i64 = sqlx::query_scalar("SELECT balance FROM example_accounts WHERE id = $1")
        .bind(from)
        .fetch_one(tx.conn()?)
        .await?;
    if balance < amount {
        tx.rollback().await?;
        return Ok("refused: not enough money");
    }
    for (id, delta) in [(from, -amount), (to, amount)] {
        sqlx::query("UPDATE example_accounts SET balance = balance + $2 WHERE id = $1")
            .bind(id)
            .bind(delta)
            .execute(tx.conn()?)
            .await?;
    }
    // The transfer and the release, atomically.
    tx.commit().await?;
    Ok("done")
}
