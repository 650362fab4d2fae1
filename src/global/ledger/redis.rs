//! The ledger in Redis (standalone, Sentinel or Cluster), reached as the store
//! reaches its Redis (`store/redis/connect`: the same URLs, TLS files and ACL
//! credentials). Each record is one string under the hash tag `{tollgate-global}`, so
//! on a cluster all of them live in one slot and a batch of swaps is one script call
//! (`cas.lua`, sent by EVALSHA with redis-rs' NOSCRIPT fallback): a ledger carries a
//! few calls per counter per report period, which one master serves easily.
//!
//! The connection is made on first use and again after a failure, at most once a
//! second; a call that times out drops the connection too, since a partitioned
//! connection may otherwise hold its place until TCP gives up.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::{Script, Value};
use tokio::sync::Mutex;

use super::{Ledger, LedgerError, LedgerFuture, Swap, Swapped};
use crate::store::redis::connect::{self, Connection, RedisOptions};

static CAS: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("cas.lua")));

/// The hash tag every record shares.
pub const TAG: &str = "{tollgate-global}";

/// Between two connection attempts after a failure.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// Keys per call: a report of thousands of counters goes in several calls, so no one
/// call holds the ledger long.
const CHUNK: usize = 256;

pub struct RedisLedger {
    options: RedisOptions,
    /// Budget of one call.
    timeout: Duration,
    /// The connection once made, and when it was last tried.
    connection: Mutex<(Option<Connection>, Option<Instant>)>,
}

impl RedisLedger {
    /// Checks the settings now (URLs, TLS files); connects on first use.
    pub fn new(options: RedisOptions, timeout: Duration) -> Result<Self, String> {
        connect::check(&options)?;
        Ok(Self {
            options,
            timeout,
            connection: Mutex::new((None, None)),
        })
    }

    /// The key of counter `id`: the prefix, the shared hash tag, the id.
    pub fn key(prefix: &str, id: &str) -> String {
        format!("{prefix}{TAG}:{id}")
    }

    async fn connection(&self) -> Result<Connection, LedgerError> {
        let mut slot = self.connection.lock().await;
        if let Some(c) = &slot.0 {
            return Ok(c.clone());
        }
        if slot.1.is_some_and(|at| at.elapsed() < RECONNECT_EVERY) {
            return Err(LedgerError::Unavailable("not connected yet".into()));
        }
        slot.1 = Some(Instant::now());
        let made = tokio::time::timeout(
            self.options
                .connect_timeout
                .min(self.timeout.max(Duration::from_secs(1))),
            connect::connect(&self.options),
        )
        .await
        .map_err(|_| LedgerError::Unavailable("connecting timed out".into()))?
        .map_err(LedgerError::Unavailable)?;
        slot.0 = Some(made.clone());
        Ok(made)
    }

    async fn forget(&self) {
        self.connection.lock().await.0 = None;
    }

    /// One call within the budget; a failed or late call drops the connection.
    async fn call<T>(
        &self,
        run: impl AsyncFnOnce(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, LedgerError> {
        let mut con = self.connection().await?;
        match tokio::time::timeout(self.timeout, run(&mut con)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.forget().await;
                }
                Err(LedgerError::Unavailable(connect::describe(&e)))
            }
            Err(_) => {
                self.forget().await;
                Err(LedgerError::Timeout(self.timeout))
            }
        }
    }
}

impl Ledger for RedisLedger {
    fn read<'a>(&'a self, keys: &'a [String]) -> LedgerFuture<'a, Vec<Option<String>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(CHUNK) {
                let values: Vec<Option<String>> = self
                    .call(async |con| {
                        let mut cmd = redis::cmd("MGET");
                        cmd.arg(chunk);
                        cmd.query_async(con).await
                    })
                    .await?;
                out.extend(values);
            }
            Ok(out)
        })
    }

    fn swap<'a>(&'a self, swaps: &'a [Swap]) -> LedgerFuture<'a, Vec<Swapped>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(swaps.len());
            for chunk in swaps.chunks(CHUNK) {
                let replies: Vec<Value> = self
                    .call(async |con| {
                        let mut invocation = CAS.prepare_invoke();
                        for s in chunk {
                            invocation
                                .key(&s.key)
                                .arg(s.expected.as_deref().unwrap_or(""))
                                .arg(&s.new)
                                .arg(s.ttl_ms.max(1));
                        }
                        invocation.invoke_async(con).await
                    })
                    .await?;
                if replies.len() != chunk.len() {
                    return Err(LedgerError::Protocol(format!(
                        "{} replies to {} swaps",
                        replies.len(),
                        chunk.len()
                    )));
                }
                for reply in replies {
                    out.push(match reply {
                        Value::Int(1) => Swapped::Done,
                        Value::Int(0) => Swapped::Conflict(None),
                        Value::BulkString(bytes) => {
                            Swapped::Conflict(Some(String::from_utf8_lossy(&bytes).into_owned()))
                        }
                        other => {
                            return Err(LedgerError::Protocol(format!("{other:?}")));
                        }
                    });
                }
            }
            Ok(out)
        })
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
