//! The records in this process: for tests, and for one process whose "regions" are
//! its own (nothing to divide across). It can be cut off, as a partition would cut a
//! region off from a real ledger, so tests can prove what a region does then.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Ledger, LedgerError, LedgerFuture, Swap, Swapped};

#[derive(Debug, Default)]
pub struct MemoryLedger {
    values: Mutex<HashMap<String, String>>,
    cut: AtomicBool,
}

impl MemoryLedger {
    /// While `cut`, every call fails as an unreachable ledger's would.
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
    }

    /// Every record, as stored (for tests).
    pub fn snapshot(&self) -> HashMap<String, String> {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Loses every record, as a ledger restarted without persistence does.
    pub fn forget_all(&self) {
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    fn reachable(&self) -> Result<(), LedgerError> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(LedgerError::Unavailable("cut off (test)".into()));
        }
        Ok(())
    }
}

impl Ledger for MemoryLedger {
    fn read<'a>(&'a self, keys: &'a [String]) -> LedgerFuture<'a, Vec<Option<String>>> {
        Box::pin(async move {
            self.reachable()?;
            let values = self.values.lock().unwrap_or_else(|e| e.into_inner());
            Ok(keys.iter().map(|k| values.get(k).cloned()).collect())
        })
    }

    fn swap<'a>(&'a self, swaps: &'a [Swap]) -> LedgerFuture<'a, Vec<Swapped>> {
        Box::pin(async move {
            self.reachable()?;
            let mut values = self.values.lock().unwrap_or_else(|e| e.into_inner());
            Ok(swaps
                .iter()
                .map(|s| {
                    let current = values.get(&s.key);
                    if current == s.expected.as_ref() {
                        values.insert(s.key.clone(), s.new.clone());
                        Swapped::Done
                    } else {
                        Swapped::Conflict(current.cloned())
                    }
                })
                .collect())
        })
    }

    fn kind(&self) -> &'static str {
        "memory"
    }
}
