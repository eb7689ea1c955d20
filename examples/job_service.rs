//! A service as a new user writes it: its own Postgres pool and Redis
//! client, the tracing and metrics layers, one lock per job, and each job's
//! result written to Postgres only with a fencing token (a `BIGINT`) no
//! lower than the last one the row accepted.
//!
//! ```sh
//! export DATABASE_URL=postgres://app:secret@127.0.0.1/app REDIS_URL=redis://127.0.0.1:6379
//! cargo run --example job_service --features postgres,redis
//! ```
//!
//! Three replicas (tasks, each with a lock client of its own, as three
//! processes would have) race for the same jobs; a job is done once, by
//! whoever holds its lock, and a replica that finds a job's lock taken
//! skips it. The same code runs on the Postgres lock (correctness: the
//! tokens are durable) and on the Redis lock (efficiency), built on the
//! application's own pool and client. The facade's test
//! `tests/job_service.rs` runs it against the project's servers.

use std::sync::Arc;
use std::time::Duration;

use distlock::layers::{LayerExt, MetricsLayer, TracingLayer};
use distlock::sqlx::{self, PgPool};
use distlock::{
    DistributedLock, LockError, LockOptions, PgLock, RedisConfig, RedisLock, SqlConfig, Wait, redis,
};

/// How many jobs the replicas share.
pub(crate) const JOBS: i64 = 12;

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter("info,distlock=info")
        .init();
    let database = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let redis_url = std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL")?;
    for (backend, done) in run(&database, &redis_url).await? {
        println!("{backend}: {done} jobs done, each once, with rising tokens");
    }
    Ok(())
}

/// Run the jobs on each lock backend in turn; the jobs done per backend.
pub(crate) async fn run(
    database: &str,
    redis_url: &str,
) -> Result<Vec<(&'static str, i64)>, Box<dyn std::error::Error>> {
    // The application's own pool and client, made as it makes them.
    let pool = PgPool::connect(database).await?;
    let client = redis::Client::open(redis_url)?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS example_jobs \
         (id BIGINT PRIMARY KEY, result TEXT, done_by INT, token BIGINT NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await?;

    let mut outcome = Vec::new();
    for backend in ["postgres", "redis"] {
        sqlx::query("DELETE FROM example_jobs")
            .execute(&pool)
            .await?;
        let mut replicas = Vec::new();
        for replica in 0..3 {
            // Each replica has a lock client of its own, with layers.
            let locks: Arc<dyn DistributedLock> = match backend {
                "postgres" => {
                    Arc::new(PgLock::with_pool(pool.clone(), SqlConfig::default()).await?)
                        .layer(MetricsLayer)
                        .layer(TracingLayer)
                        .into_dyn()
                }
                _ => {
                    Arc::new(RedisLock::with_client(client.clone(), RedisConfig::default()).await?)
                        .layer(MetricsLayer)
                        .layer(TracingLayer)
                        .into_dyn()
                }
            };
            replicas.push(tokio::spawn(replica_loop(locks, pool.clone(), replica)));
        }
        let mut done = 0;
        for replica in replicas {
            done += replica.await??;
        }
        let (rows, written): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE result IS NOT NULL AND token > 0) FROM example_jobs",
        )
        .fetch_one(&pool)
        .await?;
        if done != JOBS || rows != JOBS || written != JOBS {
            return Err(format!(
                "{backend}: {done} jobs reported done, {rows} rows, {written} written with a token; {JOBS} expected"
            )
            .into());
        }
        outcome.push((backend, done));
    }
    Ok(outcome)
}

/// One replica: every job it can lock and finds not done, it does.
async fn replica_loop(
    locks: Arc<dyn DistributedLock>,
    pool: PgPool,
    replica: i32,
) -> Result<i64, LockError> {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::UpTo(Duration::from_secs(5)));
    let mut done = 0;
    for job in 1..=JOBS {
        let name = format!("example/job/{job}");
        let did = locks
            .with_lock(&name, &opts, async |guard| {
                guard.ensure_held()?;
                let token = guard.fencing_token_i64().unwrap_or(0);
                do_job(&pool, job, replica, token).await
            })
            .await??;
        done += i64::from(did);
    }
    Ok(done)
}

/// The job, unless another replica did it: its result written only if the
/// row accepts this token (none higher seen). `true` if this call did it.
async fn do_job(pool: &PgPool, job: i64, replica: i32, token: i64) -> Result<bool, LockError> {
    let failed = |e: sqlx::Error| LockError::Backend {
        backend: "application",
        reason: format!("writing job {job}"),
        source: Some(Box::new(e)),
    };
    sqlx::query("INSERT INTO example_jobs (id) VALUES ($1) ON CONFLICT DO NOTHING")
        .bind(job)
        .execute(pool)
        .await
        .map_err(failed)?;
    tokio::time::sleep(Duration::from_millis(5)).await; // the work
    let written = sqlx::query(
        "UPDATE example_jobs SET result = $2, done_by = $3, token = $4 \
         WHERE id = $1 AND result IS NULL AND token <= $4",
    )
    .bind(job)
    .bind(format!("report {job}"))
    .bind(replica)
    .bind(token)
    .execute(pool)
    .await
    .map_err(failed)?;
    Ok(written.rows_affected() == 1)
}
