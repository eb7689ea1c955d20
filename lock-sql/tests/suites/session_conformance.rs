//! The conformance suite of a session-lock dialect, written once for
//! Postgres and MySQL/MariaDB.

/// The conformance suite against the server in `url` (a variable of
/// `scripts/services.sh env`) for client type `lock`, whose `with_pool`
/// takes a pool made with `pool` options: in row and advisory mode, on the
/// application's own pool in both modes, and without fencing in both
/// modes. Defines `harness_for(query)`, a harness on clients of the URL
/// with `query` as options, for the dialect's own tests.
macro_rules! session_conformance {
    (lock: $lock:ty, url: $url:literal, pool: $pool:ty $(,)?) => {
        /// A harness on locks from the server's URL with `query` as its
        /// options.
        async fn harness_for(query: &str) -> ::lock_testkit::conformance::Harness {
            let url = format!("{}?{query}", ::lock_testkit::faults::env($url));
            ::lock_testkit::conformance::Harness::of(async || {
                <$lock>::connect(&url).await.expect("connect")
            })
            .await
        }

        mod row {
            async fn harness() -> ::lock_testkit::conformance::Harness {
                crate::harness_for("mode=row").await
            }

            ::lock_testkit::conformance_suite!(harness());
        }

        mod advisory {
            async fn harness() -> ::lock_testkit::conformance::Harness {
                crate::harness_for("mode=advisory").await
            }

            ::lock_testkit::conformance_suite!(harness());
        }

        /// The lock cases again, on locks built from a pool the application
        /// made itself (`with_pool`), in both modes.
        mod own_pool {
            use ::lock_sql::{SqlConfig, SqlMode};
            use ::lock_testkit::conformance::Harness;

            async fn harness_for(mode: SqlMode) -> Harness {
                let url = ::lock_testkit::faults::env($url);
                Harness::of(async || {
                    let pool = <$pool>::new()
                        .max_connections(32)
                        .connect(&url)
                        .await
                        .expect("the application's pool");
                    let config = SqlConfig::default().with_mode(mode);
                    <$lock>::with_pool(pool, config)
                        .await
                        .expect("a lock on the application's pool")
                })
                .await
            }

            // The lock cases: the other primitives run the same code on
            // the lock's connections, whichever pool they were taken from.
            mod row {
                async fn harness() -> super::Harness {
                    super::harness_for(super::SqlMode::Row).await
                }

                ::lock_testkit::lock_conformance_suite!(harness());
            }

            mod advisory {
                async fn harness() -> super::Harness {
                    super::harness_for(super::SqlMode::Advisory).await
                }

                ::lock_testkit::lock_conformance_suite!(harness());
            }
        }

        /// A suffix for a table of a case's own: the process and the clock.
        fn table_suffix() -> String {
            let nanos = ::std::time::SystemTime::now()
                .duration_since(::std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            format!("{:x}_{nanos:x}", ::std::process::id())
        }

        /// Drop the tables of a case's own lock table `table` (those of
        /// either dialect; missing ones are skipped).
        async fn drop_tables<'e, E: ::sqlx::Executor<'e> + Copy>(admin: E, table: &str) {
            for suffix in [
                "_rw_marks",
                "_rw",
                "_permits",
                "_holders",
                "_counters",
                "_run",
                "_epoch",
                "",
            ] {
                ::sqlx::raw_sql(::sqlx::AssertSqlSafe(format!(
                    "DROP TABLE IF EXISTS {table}{suffix}"
                )))
                .execute(admin)
                .await
                .expect("drop the case's tables");
            }
        }

        /// The schema under the application's control: with
        /// `create_schema=false` a lock on a database without its tables
        /// refuses to start, as configuration, naming the statements to
        /// run; once they have run (`ddl`), it works.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn without_create_schema_the_tables_come_from_ddl() {
            use ::lock_core::{DistributedLock, LockOptions};
            let base = ::lock_testkit::faults::env($url);
            let table = format!("schema_{}", table_suffix());
            let url = format!("{base}?create_schema=false&table={table}");
            let refused = <$lock>::connect(&url).await;
            let Err(e) = refused else {
                panic!("a lock without its tables started");
            };
            assert!(e.is_config(), "not a configuration error: {e:?}");
            let config = ::lock_sql::SqlConfig::from_url(&url).expect("config");
            let ddl = <$lock>::ddl(&config);
            assert!(
                e.to_string().contains(&ddl[0]),
                "the error does not name the statements: {e}"
            );
            let admin = <$pool>::new().connect(&base).await.expect("admin pool");
            for statement in &ddl {
                ::sqlx::raw_sql(::sqlx::AssertSqlSafe(statement.clone()))
                    .execute(&admin)
                    .await
                    .expect("the published DDL runs");
            }
            let locks = <$lock>::connect(&url)
                .await
                .expect("started on the DDL's tables");
            let g = locks
                .acquire("schema/check", &LockOptions::new())
                .await
                .expect("acquire");
            assert!(g.fencing_token().is_some());
            assert!(g.release().await.expect("release"));
            drop_tables(&admin, &table).await;
        }

        /// Tables from before the holder record (a counters table without
        /// its `holder` column): with `create_schema=false` the lock refuses
        /// to start, naming the statement that brings them up to date;
        /// otherwise it adds the column and keeps holder records at once.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn counters_without_the_holder_column_gain_it() {
            use ::lock_core::{DistributedLock, LockOptions};
            let base = ::lock_testkit::faults::env($url);
            let table = format!("old_{}", table_suffix());
            let admin = <$pool>::new().connect(&base).await.expect("admin pool");
            let config =
                ::lock_sql::SqlConfig::from_url(&format!("{base}?table={table}")).expect("config");
            for statement in <$lock>::ddl(&config) {
                ::sqlx::raw_sql(::sqlx::AssertSqlSafe(statement))
                    .execute(&admin)
                    .await
                    .expect("the published DDL runs");
            }
            ::sqlx::raw_sql(::sqlx::AssertSqlSafe(format!(
                "ALTER TABLE {table}_counters DROP COLUMN holder"
            )))
            .execute(&admin)
            .await
            .expect("make the counters table an earlier version's");
            let refused =
                <$lock>::connect(&format!("{base}?table={table}&create_schema=false")).await;
            let Err(e) = refused else {
                panic!("a lock on out-of-date tables started without create_schema");
            };
            assert!(e.is_config(), "not a configuration error: {e:?}");
            assert!(
                e.to_string().contains("ADD COLUMN"),
                "the error does not name the upgrade: {e}"
            );
            let locks = <$lock>::connect(&format!("{base}?table={table}"))
                .await
                .expect("started, the column added");
            let opts = LockOptions::new().identity("upgraded").value("v1");
            let g = locks
                .acquire("upgrade/check", &opts)
                .await
                .expect("acquire");
            let info = locks.inspect("upgrade/check").await.expect("inspect");
            let holder = info.holder.expect("a holder record on the upgraded table");
            assert_eq!(
                (holder.identity.as_str(), holder.value.as_slice()),
                ("upgraded", &b"v1"[..])
            );
            assert_eq!(info.fencing_token, g.fencing_token());
            assert!(g.release().await.expect("release"));
            drop_tables(&admin, &table).await;
        }

        /// `remove_unused` removes the per-name rows of names unused for the
        /// given time, keeps the others and held names, and tokens still
        /// rise for a removed name.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn removing_unused_names_keeps_tokens_rising() {
            use ::lock_core::{DistributedLock, LockOptions};
            use ::std::time::Duration;
            let base = ::lock_testkit::faults::env($url);
            let admin = <$pool>::new().connect(&base).await.expect("admin pool");
            for mode in ["row", "advisory"] {
                // A table of its own: the clean-up would remove other
                // tests' counters too.
                let table = format!("unused_{mode}_{}", table_suffix());
                let url = format!("{base}?mode={mode}&table={table}");
                let locks = <$lock>::connect(&url).await.expect("connect");
                let opts = LockOptions::new();
                let (old, held) = (
                    ::lock_testkit::conformance::unique_name("unused-old"),
                    ::lock_testkit::conformance::unique_name("unused-held"),
                );
                let mut last = 0;
                for _ in 0..3 {
                    let g = locks.acquire(&old, &opts).await.expect("acquire");
                    last = g.fencing_token().expect("token");
                    assert!(g.release().await.expect("release"));
                }
                let holding = locks.acquire(&held, &opts).await.expect("acquire held");
                let held_token = holding.fencing_token().expect("token");
                tokio::time::sleep(Duration::from_millis(1200)).await;
                let removed = locks
                    .remove_unused(Duration::from_secs(1))
                    .await
                    .expect("remove");
                assert_eq!(removed, 2, "{mode}: removed {removed}");
                assert_eq!(
                    locks.inspect(&old).await.expect("inspect").fencing_token,
                    None,
                    "{mode}: the unused name's counter is still there"
                );
                let again = locks.acquire(&old, &opts).await.expect("acquire again");
                let next = again.fencing_token().expect("token");
                assert!(next > last, "{mode}: token {next:#x} after {last:#x}");
                assert!(again.release().await.expect("release"));
                // The held name's lock was untouched (still ours), and its
                // next token is above the one it was granted before.
                assert!(holding.release().await.expect("release the held name"));
                let after = locks
                    .acquire(&held, &opts)
                    .await
                    .expect("acquire held again");
                let after_token = after.fencing_token().expect("token");
                assert!(
                    after_token > held_token,
                    "{mode}: {after_token:#x} after {held_token:#x}"
                );
                assert!(after.release().await.expect("release"));
                drop_tables(&admin, &table).await;
            }
        }

        /// `remove_unused` also removes the reader-writer rows of unused
        /// names and the marks of waiting writers that crashed (such a
        /// waiter never removes its own), but not the row of a name held
        /// now; tokens still rise for a removed name.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn removing_unused_names_clears_reader_writer_rows_and_dead_marks() {
            use ::lock_core::{LockOptions, RwLockExt};
            use ::std::time::Duration;
            let base = ::lock_testkit::faults::env($url);
            let admin = <$pool>::new().connect(&base).await.expect("admin pool");
            let table = format!("unused_rw_{}", table_suffix());
            let locks = <$lock>::connect(&format!("{base}?table={table}"))
                .await
                .expect("connect");
            let opts = LockOptions::new();
            let (old, held) = (
                ::lock_testkit::conformance::unique_name("unused-rw-old"),
                ::lock_testkit::conformance::unique_name("unused-rw-held"),
            );
            let written = locks.acquire_write(&old, &opts).await.expect("write");
            let last = written.fencing_token().expect("token");
            assert!(written.release().await.expect("release"));
            let reading = locks.acquire_read(&held, &opts).await.expect("read");
            // A writer that crashed while it waited left its mark.
            ::sqlx::raw_sql(::sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table}_rw_marks (name, owner, arrival, expires) \
                 VALUES ('{old}', 'crashed', 1, 2)"
            )))
            .execute(&admin)
            .await
            .expect("a dead mark");
            let count = async |sql: String| -> i64 {
                ::sqlx::query_scalar(::sqlx::AssertSqlSafe(sql))
                    .fetch_one(&admin)
                    .await
                    .expect("count")
            };
            tokio::time::sleep(Duration::from_millis(1200)).await;
            locks
                .remove_unused(Duration::from_secs(1))
                .await
                .expect("remove");
            assert_eq!(
                count(format!("SELECT COUNT(*) FROM {table}_rw_marks")).await,
                0,
                "the crashed writer's mark is still there"
            );
            assert_eq!(
                count(format!(
                    "SELECT COUNT(*) FROM {table}_rw WHERE name = '{old}'"
                ))
                .await,
                0,
                "the unused name's row is still there"
            );
            assert_eq!(
                count(format!(
                    "SELECT COUNT(*) FROM {table}_rw WHERE name = '{held}'"
                ))
                .await,
                1,
                "the row of a name held now was removed"
            );
            assert!(reading.release().await.expect("the reader still held it"));
            let again = locks.acquire_write(&old, &opts).await.expect("write again");
            let next = again.fencing_token().expect("token");
            assert!(next > last, "token {next:#x} after {last:#x}");
            assert!(again.release().await.expect("release"));
            drop_tables(&admin, &table).await;
        }

        /// The suite again with `fencing=false`, in both modes: guards,
        /// `inspect` and `capabilities()` carry no token, and everything
        /// else holds.
        mod without_fencing {
            mod row {
                async fn harness() -> ::lock_testkit::conformance::Harness {
                    crate::harness_for("mode=row&fencing=false").await
                }

                ::lock_testkit::conformance_suite!(harness());
            }

            mod advisory {
                async fn harness() -> ::lock_testkit::conformance::Harness {
                    crate::harness_for("mode=advisory&fencing=false").await
                }

                ::lock_testkit::conformance_suite!(harness());
            }
        }
    };
}
