//! Live writable sessions and the shared writer threads that drain them.

pub(crate) mod live;
mod ops;
pub(crate) mod pool;
