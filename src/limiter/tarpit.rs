//! Tarpits: holding a rule's OVER_LIMIT answers back for its `delay`, at most
//! `max_concurrent` at a time per rule; past the bound a denial is answered at once,
//! so an attacker cannot use the tarpit to tie up tollgate itself. Both are logged
//! at most once a second per rule, with the count of those not logged since.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::config::{Rule, Tarpit};
use crate::telemetry::ratelimited;

/// A rule's path and its bound: a reload that changes the bound gets a fresh pit.
type PitKey = (Arc<str>, u32);

#[derive(Default)]
pub struct Tarpits {
    pits: Mutex<HashMap<PitKey, Arc<Semaphore>>>,
}

impl Tarpits {
    /// Waits out the tarpit if there is room in it; returns whether it waited.
    pub async fn hold(&self, rule: &Rule, tarpit: Tarpit) -> bool {
        let pit = {
            let mut pits = self.pits.lock().unwrap_or_else(|p| p.into_inner());
            pits.entry((rule.path.clone(), tarpit.max_concurrent))
                .or_insert_with(|| Arc::new(Semaphore::new(tarpit.max_concurrent as usize)))
                .clone()
        };
        match pit.try_acquire_owned() {
            Ok(_permit) => {
                if let Some(suppressed) = ratelimited::admit(&["tarpit_hold", &rule.path]) {
                    tracing::info!(
                        event = "tarpit_hold",
                        rule = &*rule.path,
                        delay_ms = tarpit.delay.as_millis() as u64,
                        suppressed,
                        "holding an OVER_LIMIT answer back"
                    );
                }
                tokio::time::sleep(tarpit.delay).await;
                true
            }
            Err(_) => {
                if let Some(suppressed) = ratelimited::admit(&["tarpit_full", &rule.path]) {
                    tracing::warn!(
                        event = "tarpit_full",
                        rule = &*rule.path,
                        max_concurrent = tarpit.max_concurrent,
                        suppressed,
                        "tarpit full: answering OVER_LIMIT at once"
                    );
                }
                false
            }
        }
    }
}
