//! Readiness, decided in one place: SERVING only with a config loaded, the backend
//! reachable (when it is checked) and no shutdown under way. grpc.health.v1 and
//! `GET /healthcheck` both read [`Health`]; the server subscribes to its changes.
//!
//! The store answers for itself through the seam ([`Store::ping`], node by node; the
//! memory store has no nodes and always answers, Redis PINGs each node on a
//! connection of its own and on the connection its requests take). [`spawn_probe`]
//! asks every [`PROBE_INTERVAL`] and publishes each node's answer as
//! `tollgate_backend_up{node}`. The backend is reachable while at least one node
//! answers and the store's own path is there ([`Store::ready`]: connected, its
//! connections not being recovered, no breaker refusing calls): SERVING means a
//! request would be decided by the store, not by its domain's failure mode. A cluster
//! with one master down still decides the other masters' slots, and per-node
//! breakers fail the rest fast.
//!
//! Truthful from the first moment: a checked backend is unreachable until the store
//! has answered once, so a readiness probe cannot pass while Redis has never been
//! reached. After that, [`UNREACHABLE_AFTER`] failed probes in a row mark it
//! unreachable (one slow PING must not take every replica out at once), and only a
//! probe that finds the store usable marks it reachable again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::metrics::Metrics;
use crate::store::{NodePing, Store, StoreError};

pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Consecutive failed probes before the backend counts as unreachable: one slow PING
/// must not take every replica out of service at once.
pub const UNREACHABLE_AFTER: u32 = 3;

/// The inputs of readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthState {
    pub config_loaded: bool,
    pub backend_reachable: bool,
    pub draining: bool,
}

impl HealthState {
    pub fn serving(&self) -> bool {
        self.config_loaded && self.backend_reachable && !self.draining
    }

    /// Why not serving, for `/healthcheck`'s body and logs; `None` when serving.
    pub fn reason(&self) -> Option<&'static str> {
        if self.draining {
            Some("shutting down")
        } else if !self.config_loaded {
            Some("no config loaded")
        } else if !self.backend_reachable {
            Some("rate-limit backend unreachable")
        } else {
            None
        }
    }
}

/// Shared readiness; cheap to read on every health request.
#[derive(Debug)]
pub struct Health {
    state: watch::Sender<HealthState>,
}

impl Default for Health {
    /// A loaded config, a reachable backend: what an in-process server starts with.
    fn default() -> Self {
        Self::new(true)
    }
}

impl Health {
    pub fn new(config_loaded: bool) -> Self {
        let (state, _) = watch::channel(HealthState {
            config_loaded,
            backend_reachable: true,
            draining: false,
        });
        Self { state }
    }

    pub fn state(&self) -> HealthState {
        *self.state.borrow()
    }

    pub fn serving(&self) -> bool {
        self.state().serving()
    }

    /// Changes of the state, for the gRPC health reporter.
    pub fn subscribe(&self) -> watch::Receiver<HealthState> {
        self.state.subscribe()
    }

    pub fn set_config_loaded(&self, loaded: bool) {
        self.update(|s| s.config_loaded = loaded);
    }

    pub fn set_backend_reachable(&self, reachable: bool) {
        self.update(|s| s.backend_reachable = reachable);
    }

    /// Shutdown has begun: NOT_SERVING from now on, for good.
    pub fn start_draining(&self) {
        self.update(|s| s.draining = true);
    }

    fn update(&self, change: impl FnOnce(&mut HealthState)) {
        self.state.send_if_modified(|state| {
            let before = *state;
            change(state);
            *state != before
        });
    }
}

/// Probes the store until the returned task is aborted, marking `health` (and, with
/// `metrics`, each node's `tollgate_backend_up`) accordingly. The backend counts as
/// unreachable from this call until the first probe finds the store usable.
/// Must be called inside a Tokio runtime.
pub fn spawn_probe(
    store: Arc<dyn Store>,
    health: Arc<Health>,
    metrics: Option<Arc<Metrics>>,
) -> JoinHandle<()> {
    health.set_backend_reachable(false);
    tokio::spawn(async move {
        let mut reachable = Reachability::default();
        let mut ticker = tokio::time::interval(PROBE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let pings = store.ping().await;
            if let Some(metrics) = &metrics {
                metrics.backend_probed(pings.iter().map(|p| (p.node.as_str(), p.result.is_ok())));
            }
            let found = verdict(&pings).and_then(|()| {
                if store.ready() {
                    Ok(())
                } else {
                    Err(StoreError::Unavailable(NOT_READY.to_owned()))
                }
            });
            if let Some(now) = reachable.probed(found) {
                health.set_backend_reachable(now);
            }
        }
    })
}

const NOT_READY: &str =
    "Redis answers PING, but the store is not usable yet (connecting, or its breaker still open)";

/// Readiness's memory of the probes: whether the store has answered since start-up
/// (or since it was last marked unreachable), and the failures in a row since.
#[derive(Debug, Default)]
struct Reachability {
    /// As health last said it.
    reachable: bool,
    failures: u32,
}

impl Reachability {
    /// One probe's finding; the new reachability when it changes, logged.
    fn probed(&mut self, found: Result<(), StoreError>) -> Option<bool> {
        match found {
            Ok(()) => {
                self.failures = 0;
                if self.reachable {
                    return None;
                }
                self.reachable = true;
                tracing::info!(event = "backend_reachable", "Redis answers: SERVING");
                Some(true)
            }
            Err(error) => {
                self.failures = self.failures.saturating_add(1);
                if !self.reachable {
                    // Never answered yet, or already marked: say why once in a while.
                    tracing::debug!(%error, probes = self.failures, "Redis probe failed");
                    return None;
                }
                if self.failures < UNREACHABLE_AFTER {
                    tracing::debug!(%error, probes = self.failures, "Redis probe failed");
                    return None;
                }
                self.reachable = false;
                tracing::warn!(
                    event = "backend_unreachable",
                    %error,
                    probes = self.failures,
                    "Redis does not answer: NOT_SERVING until it does"
                );
                Some(false)
            }
        }
    }
}

/// Reachable while any node answers (or there are none to ask); otherwise the first
/// node's error, naming the node.
fn verdict(pings: &[NodePing]) -> Result<(), StoreError> {
    if pings.is_empty() || pings.iter().any(|p| p.result.is_ok()) {
        return Ok(());
    }
    let first = &pings[0];
    Err(match &first.result {
        Err(StoreError::Unavailable(why)) => {
            StoreError::Unavailable(format!("{}: {why}", first.node))
        }
        Err(other) => other.clone(),
        Ok(()) => return Ok(()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reachable_while_any_node_answers() {
        let node = |node: &str, up: bool| NodePing {
            node: node.to_owned(),
            result: if up {
                Ok(())
            } else {
                Err(StoreError::Unavailable("refused".into()))
            },
        };
        assert!(verdict(&[]).is_ok(), "no nodes: the memory store");
        assert!(verdict(&[node("a:1", false), node("b:2", true)]).is_ok());
        let error = verdict(&[node("a:1", false), node("b:2", false)]).unwrap_err();
        assert_eq!(error.to_string(), "store unavailable: a:1: refused");
    }

    #[test]
    fn serving_needs_every_input() {
        let health = Health::default();
        assert!(health.serving());
        health.set_backend_reachable(false);
        assert_eq!(
            health.state().reason(),
            Some("rate-limit backend unreachable")
        );
        health.set_backend_reachable(true);
        health.set_config_loaded(false);
        assert!(!health.serving());
        health.set_config_loaded(true);
        health.start_draining();
        assert_eq!(health.state().reason(), Some("shutting down"));
        health.set_backend_reachable(true);
        assert!(!health.serving(), "draining is for good");
    }

    #[test]
    fn unreachable_until_the_first_answer_then_only_after_three_failures() {
        let down = || Err(StoreError::Unavailable("refused".into()));
        let mut r = Reachability::default();
        assert_eq!(r.probed(down()), None, "unreachable from the start");
        assert_eq!(r.probed(Ok(())), Some(true));
        assert_eq!(r.probed(Ok(())), None);
        assert_eq!(r.probed(down()), None);
        assert_eq!(r.probed(down()), None);
        assert_eq!(r.probed(down()), Some(false), "the third failure in a row");
        assert_eq!(r.probed(down()), None);
        assert_eq!(r.probed(Ok(())), Some(true), "one usable probe is enough");
    }

    #[tokio::test]
    async fn the_probe_says_not_serving_before_its_first_answer() {
        use crate::store::{CounterOp, StoreFuture};
        /// No nodes (PING has nothing to fail), but never ready; says when asked.
        struct NotReady(Arc<tokio::sync::Notify>);
        impl Store for NotReady {
            fn decide<'a>(&'a self, _: &'a [CounterOp]) -> StoreFuture<'a> {
                Box::pin(async { Ok(Vec::new()) })
            }
            fn dry_run<'a>(&'a self, ops: &'a [CounterOp]) -> StoreFuture<'a> {
                self.decide(ops)
            }
            fn ready(&self) -> bool {
                self.0.notify_one();
                false
            }
        }
        let asked = Arc::new(tokio::sync::Notify::new());
        let health = Arc::new(Health::default());
        let store = Arc::new(NotReady(asked.clone()));
        let probe = spawn_probe(store, health.clone(), None);
        assert!(!health.serving(), "NOT_SERVING before any probe ran");
        asked.notified().await;
        asked.notified().await; // the second probe: the first one's verdict is in
        assert_eq!(
            health.state().reason(),
            Some("rate-limit backend unreachable")
        );
        probe.abort();
    }

    #[tokio::test]
    async fn subscribers_see_changes() {
        let health = Health::default();
        let mut rx = health.subscribe();
        health.start_draining();
        rx.changed().await.unwrap();
        assert!(!rx.borrow_and_update().serving());
    }
}
