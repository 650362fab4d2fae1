//! Redis Sentinel: the sentinels are asked which server is the master of the named
//! group, and commands go to it through a reconnecting `ConnectionManager`. When a
//! command fails in a way that says the master moved (connection refused or dropped,
//! a timeout, `READONLY` from a demoted master, `MASTERDOWN`, `LOADING`), the
//! sentinels are asked again, at most every [`REFRESH_EVERY`], on a task of its own,
//! and the connection follows the new master. The failed command itself is not
//! retried (a script may have run): it fails, and the domain's failure mode answers;
//! the next commands go to the new master, whose missing scripts the EVALSHA fallback
//! loads.

use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// The least time between two questions to the sentinels.
pub const REFRESH_EVERY: Duration = Duration::from_millis(200);

/// A connection to the current master of a Sentinel-managed group. Clones share it.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    /// The master's address (for logs and to tell a move) and the connection to it.
    current: RwLock<(String, ConnectionManager)>,
    config: ConnectionManagerConfig,
    last_refresh: Mutex<Option<Instant>>,
    group: String,
}

impl SentinelConnection {
    /// Asks the sentinels for the master of `group` and connects to it.
    pub async fn connect(
        mut sentinel: SentinelClient,
        group: &str,
        config: ConnectionManagerConfig,
    ) -> RedisResult<Self> {
        let client = sentinel.async_get_client().await?;
        let address = client.get_connection_info().addr().to_string();
        let manager = ConnectionManager::new_with_config(client, config.clone()).await?;
        tracing::info!(
            event = "redis_sentinel_master",
            group,
            master = %address,
            "Redis Sentinel: using the master of '{group}' at {address}"
        );
        Ok(Self {
            shared: Arc::new(Shared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                current: RwLock::new((address, manager)),
                config,
                last_refresh: Mutex::new(None),
                group: group.to_owned(),
            }),
        })
    }

    fn manager(&self) -> ConnectionManager {
        self.shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Asks the sentinels again, on a task of its own, unless that happened less than
    /// [`REFRESH_EVERY`] ago or is under way.
    fn refresh_soon(&self) {
        {
            let mut last = self
                .shared
                .last_refresh
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < REFRESH_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let Ok(mut sentinel) = shared.sentinel.try_lock() else {
                return;
            };
            let client = match sentinel.async_get_client().await {
                Ok(client) => client,
                Err(e) => {
                    tracing::debug!(error = %e, "Redis Sentinel: no master known yet");
                    return;
                }
            };
            let address = client.get_connection_info().addr().to_string();
            let old = shared
                .current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .0
                .clone();
            if address == old {
                return;
            }
            match ConnectionManager::new_with_config(client, shared.config.clone()).await {
                Ok(manager) => {
                    *shared.current.write().unwrap_or_else(|e| e.into_inner()) =
                        (address.clone(), manager);
                    tracing::warn!(
                        event = "redis_sentinel_failover",
                        group = %shared.group,
                        from = %old,
                        to = %address,
                        "Redis Sentinel: the master moved; following it"
                    );
                }
                Err(e) => {
                    tracing::debug!(error = %e, master = %address, "cannot reach the new master yet")
                }
            }
        });
    }

    fn observe<T>(&self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result
            && master_may_have_moved(e)
        {
            self.refresh_soon();
        }
        result
    }
}

/// Errors after which the master may be another server.
fn master_may_have_moved(error: &RedisError) -> bool {
    if error.is_io_error()
        || error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_timeout()
    {
        return true;
    }
    let text = error.to_string();
    ["READONLY", "MASTERDOWN", "LOADING"]
        .iter()
        .any(|code| text.contains(code))
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let result = self.manager().req_packed_command(cmd).await;
            self.observe(result)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let result = self
                .manager()
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.observe(result)
        })
    }

    fn get_db(&self) -> i64 {
        self.manager().get_db()
    }
}
