//! Redis calls beside the counters' decisions (the RLQS ledger's script), under the
//! protections the counters' calls have: a connection made as the store's are
//! (`redis/connect`: the same target, credentials, TLS, Sentinel or Cluster), each
//! call bounded by the store's timeout (`--redis-timeout-ms`), and a circuit breaker
//! of the store's options in front, so an outage costs a caller a fast error instead
//! of a timeout per call. Its own connection and its own breaker: a ledger call never
//! queues behind a batch of decisions, and the rate-limit path's breaker and metrics
//! (`tollgate_backend_*`) keep describing the counters alone. The caller meters its
//! calls (the RLQS ledger: `tollgate_rlqs_ledger_*`).

use std::time::{Duration, Instant};

use redis::{FromRedisValue, Script};
use tokio::sync::Mutex;

use super::StoreError;
use super::breaker::{BreakerOptions, CircuitBreaker};
use super::redis::connect::{self, Connection, RedisOptions};

/// Between two connection attempts after a failure.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

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
}

impl SideCalls {
    /// Checks the settings now; connects on the first call. `node` names the breaker
    /// in its log lines.
    pub fn new(
        options: &RedisOptions,
        breaker: BreakerOptions,
        node: &str,
    ) -> Result<Self, StoreError> {
        connect::check(options).map_err(StoreError::Unavailable)?;
        Ok(Self {
            options: options.clone(),
            breaker: CircuitBreaker::new(node, breaker, None),
            slot: Mutex::default(),
        })
    }

    /// Runs `script` (EVALSHA, loading it on NOSCRIPT) on `keys` and `args`, within
    /// the store's timeout, under the breaker.
    pub async fn script<T: FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let timeout = self.options.timeout;
        self.breaker
            .call(async {
                let mut connection = self.connection().await?;
                let mut invocation = script.prepare_invoke();
                for key in keys {
                    invocation.key(*key);
                }
                for arg in args {
                    invocation.arg(*arg);
                }
                match tokio::time::timeout(timeout, invocation.invoke_async(&mut connection)).await
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
    /// old. A caller waits for another's attempt no longer than the store's timeout.
    async fn connection(&self) -> Result<Connection, StoreError> {
        let timeout = self.options.timeout;
        let mut slot = tokio::time::timeout(timeout, self.slot.lock())
            .await
            .map_err(|_| StoreError::Timeout(timeout))?;
        if let Some(c) = &slot.connection {
            return Ok(c.clone());
        }
        if slot.tried.is_some_and(|at| at.elapsed() < RECONNECT_EVERY) {
            return Err(StoreError::Unavailable(
                "not connected to Redis (retrying each second)".into(),
            ));
        }
        slot.tried = Some(Instant::now());
        let made = tokio::time::timeout(
            self.options.connect_timeout,
            connect::connect(&self.options),
        )
        .await
        .map_err(|_| StoreError::Timeout(self.options.connect_timeout))?
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
