//! Placeholder crate: the zk backend is specified in its own issue and not implemented yet; it exports nothing.
