//! Placeholder crate: the etcd backend is specified in its own issue and not implemented yet; it exports nothing.
