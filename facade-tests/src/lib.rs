//! Nothing but a home for the facade's tests that need etcd's gRPC client
//! or rustdoc JSON (see `Cargo.toml`); the tests are in `tests/`.
