//! What only the ledger client (`sync.rs`) keeps of one global counter, held in the
//! table's entry beside what requests read: a file of its own so that the table
//! holds it without depending on the client that fills it.

use super::divide::Released;
use super::record::{Pending, Record};

/// What only the sync touches of one counter.
#[derive(Debug, Clone)]
pub struct EntrySync {
    /// When this replica last reported the counter.
    pub last_report_ms: u64,
    /// The demand it reported (requests per second).
    pub last_rate: f64,
    /// A release the ledger asked for and not yet carried out: its window.
    pub asked: Option<(u64, Pending)>,
    /// A release carried out and not yet reported.
    pub done: Option<Released>,
    /// The record as the last exchange left it.
    pub record: Option<Record>,
}

impl EntrySync {
    pub fn new(now_ms: u64) -> Self {
        Self {
            last_report_ms: now_ms,
            last_rate: 0.0,
            asked: None,
            done: None,
            record: None,
        }
    }
}
