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

        /// The suite again, on locks built from a pool the application
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

            mod row {
                async fn harness() -> super::Harness {
                    super::harness_for(super::SqlMode::Row).await
                }

                ::lock_testkit::conformance_suite!(harness());
            }

            mod advisory {
                async fn harness() -> super::Harness {
                    super::harness_for(super::SqlMode::Advisory).await
                }

                ::lock_testkit::conformance_suite!(harness());
            }
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
