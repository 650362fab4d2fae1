//! The pure algorithm models: state in, decision and new state out, no I/O and no
//! clock of their own. The memory store runs them directly; the Redis scripts mirror
//! them line for line.

pub mod fixed_window;

use std::time::Duration;

/// The outcome of one counter operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// What the counter still admits after this operation took effect.
    pub remaining: u64,
    /// Until the window ends (or, for buckets, until the bucket is full again).
    pub reset_after: Duration,
    /// Only meaningful when denied: how long until the same cost could pass, or `None`
    /// when it never can (the cost exceeds what the limit admits at all).
    pub retry_after: Option<Duration>,
}
