//! Redis calls beside the counters' decisions (the RLQS ledger's script), under the
//! protections the counters' calls have: a connection made as the store's are
//! (`redis/connect`: the same target, credentials, TLS, Sentinel or Cluster), each
//! call bounded by the store's timeout (`--redis-timeout-ms`), and a circuit breaker
//! of the store's options in front, so an outage costs a caller a fast error instead
//! of a timeout per call. Its own connection and its own breaker: a ledger call never
//! queues behind a batch of decisions, and the rate-limit path's breaker and metrics
//! (`tollgate_backend_*`) keep describing the counters alone. The caller meters its
//! calls (the RLQS ledger: `tollgate_rlqs_ledger_*`).
//!
//! These calls are background work beside the rate-limit path, on the same Redis:
//! at most [`IN_FLIGHT`] are in Redis at once (a burst of them, 2,000 Envoys
//! reporting after a restart, waits here rather than in Redis's one queue ahead of
//! every decision), and the scripts are loaded once when the connection is made (a
//! burst of calls meeting NOSCRIPT would each load them).

use std::time::{Duration, Instant};

use redis::{FromRedisValue, Script};
use tokio::sync::{Mutex, Semaphore};

use super::StoreError;
use super::breaker::{BreakerOptions, CircuitBreaker};
use super::redis::connect::{self, Connection, RedisOptions};

/// Between two connection attempts after a failure.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// Calls in Redis at once, at most: a decision queued behind them waits a few of their
/// run times, never a burst's.
pub const IN_FLIGHT: usize = 4;

/// The connection once made (clones share it), and when it was last tried.
#[derive(Default)]
struct Slot {
    connection: Option<Connection>,
    tried: Option<Instant>,
}

pub struct SideCalls {
    options: RedisOptions,
    breaker: CircuitBreaker,
    slot: Mutex<Slot>,
    in_flight: Semaphore,
    /// Loaded on every new connection.
    scripts: Vec<&'static Script>,
}

impl SideCalls {
    /// Checks the settings now; connects (and loads `scripts`) on the first call.
    /// `node` names the breaker in its log lines.
    pub fn new(
        options: &RedisOptions,
        breaker: BreakerOptions,
        node: &str,
        scripts: Vec<&'static Script>,
    ) -> Result<Self, StoreError> {
        connect::check(options).map_err(StoreError::Unavailable)?;
        Ok(Self {
            options: options.clone(),
            breaker: CircuitBreaker::new(node, breaker, None),
            slot: Mutex::default(),
            in_flight: Semaphore::new(IN_FLIGHT),
            scripts,
        })
    }

    /// Runs `script` (EVALSHA, loading it on NOSCRIPT) on `keys` and `args` under the
    /// breaker, within the store's timeout once connected. The wait for a turn (see
    /// [`IN_FLIGHT`]; the first calls also wait for the connection) is bounded apart
    /// and never counts against Redis in the breaker: it is this process's queue.
    pub async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let timeout = self.options.timeout;
        let queue = self.options.connect_timeout + timeout;
        let _turn = tokio::time::timeout(queue, self.in_flight.acquire())
            .await
            .map_err(|_| StoreError::Timeout(queue))?
            .map_err(|_| StoreError::Unavailable("closed".into()))?;
        self.breaker
            .call(async {
                let mut connection = self.connection().await?;
                let deadline = tokio::time::Instant::now() + timeout;
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(*key);
                }
                for arg in args {
                    invocation.arg(*arg);
                }
                match tokio::time::timeout_at(deadline, invocation.invoke_async(&mut connection))
                    .await
                {
                    Ok(Ok(value)) => Ok(value),
                    Ok(Err(e)) => {
                        if e.is_io_error() || e.is_connection_dropped() {
                            self.forget().await;
                        }
                        Err(StoreError::Unavailable(connect::describe(&e)))
                    }
                    Err(_) => Err(StoreError::Timeout(timeout)),
                }
            })
            .await
    }

    /// The connection, made now if there is none and the last attempt is a second
    /// old. A caller waits for another's attempt (at most the connect timeout: the
    /// first burst of calls must not all time out behind the first connection).
    async fn connection(&self) -> Result<Connection, StoreError> {
        let wait = self.options.connect_timeout;
        let mut slot = tokio::time::timeout(wait, self.slot.lock())
            .await
            .map_err(|_| StoreError::Timeout(wait))?;
        if let Some(c) = &slot.connection {
            return Ok(c.clone());
        }
        if slot.tried.is_some_and(|at| at.elapsed() < RECONNECT_EVERY) {
            return Err(StoreError::Unavailable(
                "not connected to Redis (retrying each second)".into(),
            ));
        }
        slot.tried = Some(Instant::now());
        let connect_timeout = self.options.connect_timeout;
        let connecting = async {
            let mut made = connect::connect(&self.options).await?;
            for script in &self.scripts {
                script
                    .load_async(&mut made)
                    .await
                    .map_err(|e| format!("cannot load a script: {}", connect::describe(&e)))?;
            }
            Ok::<_, String>(made)
        };
        let made = tokio::time::timeout(connect_timeout, connecting)
            .await
            .map_err(|_| StoreError::Timeout(connect_timeout))?
            .map_err(StoreError::Unavailable)?;
        slot.connection = Some(made.clone());
        Ok(made)
    }

    /// A call that failed on the connection: the next call makes a new one (the
    /// connection types reconnect themselves too; this covers a cluster whose
    /// topology changed under a connection that gave up).
    async fn forget(&self) {
        self.slot.lock().await.connection = None;
    }
}
