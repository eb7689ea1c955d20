//! Placeholder crate: the redlock backend is specified in its own issue and not implemented yet; it exports nothing.
