//! The example service (`examples/job_service.rs`: the application's own
//! pool and client, layers, one lock per job, fenced `BIGINT` writes to
//! Postgres, `with_lock`) runs against the project's servers.

#![cfg(all(feature = "postgres", feature = "redis"))]

#[path = "../examples/job_service.rs"]
mod job_service;

fn env(var: &str) -> String {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("{var} is not set: run the tests through scripts/test.sh"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_service_does_every_job_once_on_each_backend() {
    let done = job_service::run(
        &env("DISTLOCK_TEST_POSTGRES_URL"),
        &env("DISTLOCK_TEST_REDIS_URL"),
    )
    .await
    .expect("the example service");
    assert_eq!(
        done,
        vec![
            ("postgres", job_service::JOBS),
            ("redis", job_service::JOBS)
        ]
    );
}
