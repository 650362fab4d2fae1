//! Reading counters without consuming them (`tollgate inspect`): what each counter
//! still admits, from the batch script's dry run at cost 0 (it decides and writes
//! nothing; sliding_log's load only trims hits that already left the window), then
//! its key encoded exactly as the store encodes it, its stored state read with plain
//! reads in the layout its Lua script keeps (`lua/<algorithm>.lua`), put in words by
//! its model ([`crate::algorithm::Model::describe`]), and its PTTL.

use redis::AsyncCommands;

use super::connect::{self, RedisOptions};
use super::{RedisStore, keys};
use crate::algorithm::{Decision, Layout, Stored};
use crate::store::{CounterOp, Store, StoreError};

/// One counter as Redis holds it now.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterState {
    /// The Redis key (prefix and hash tag included).
    pub key: String,
    /// The stored state in words (`count 3 in the window from ...`); `None`: no key
    /// (never counted, or expired: the same thing to every algorithm).
    pub stored: Option<String>,
    /// The key's time to live in milliseconds; `None` without a key or a TTL.
    pub ttl_ms: Option<u64>,
    /// What a check-only request would be told now: remaining and reset.
    pub now: Decision,
}

/// Reads every counter `ops` would touch. The operations' costs are ignored (each is
/// read as a check of cost 0), so nothing is consumed.
pub async fn read(
    options: &RedisOptions,
    ops: &[CounterOp],
) -> Result<Vec<CounterState>, StoreError> {
    // The dry run first: after its trim, a sliding log's ZCARD counts live hits only.
    let checks: Vec<CounterOp> = ops
        .iter()
        .map(|op| CounterOp {
            cost: 0,
            ..op.clone()
        })
        .collect();
    let decisions = RedisStore::connect(options).await?.dry_run(&checks).await?;
    let mut connection = connect::connect(options)
        .await
        .map_err(StoreError::Unavailable)?;
    let unavailable = |e: redis::RedisError| StoreError::Unavailable(connect::describe(&e));
    let mut states = Vec::with_capacity(ops.len());
    for (op, now) in ops.iter().zip(decisions) {
        let key = keys::encode(&options.key_prefix, &op.key);
        // Plain reads, one key at a time: on a cluster each routes by its own slot.
        let algorithm = op.key.algorithm;
        let stored = match algorithm.layout() {
            Layout::Hash => match connection.hgetall::<_, Vec<(String, String)>>(&key).await {
                Ok(fields) => (!fields.is_empty()).then_some(Stored::Hash(fields)),
                // A concurrency rule's named leases are a sorted set (lease_key).
                Err(e) if e.code() == Some("WRONGTYPE") => {
                    let members: u64 = connection.zcard(&key).await.map_err(unavailable)?;
                    (members > 0).then_some(Stored::SortedSet { members })
                }
                Err(e) => return Err(unavailable(e)),
            },
            Layout::SortedSet => {
                let members: u64 = connection.zcard(&key).await.map_err(unavailable)?;
                (members > 0).then_some(Stored::SortedSet { members })
            }
            Layout::Value => match connection.get::<_, Option<Vec<u8>>>(&key).await {
                Ok(value) => value.map(Stored::Value),
                // A token bucket of 0.1 is still a hash (its next write replaces it):
                // read it as one.
                Err(e) if e.code() == Some("WRONGTYPE") => {
                    let fields: Vec<(String, String)> =
                        connection.hgetall(&key).await.map_err(unavailable)?;
                    (!fields.is_empty()).then_some(Stored::Hash(fields))
                }
                Err(e) => return Err(unavailable(e)),
            },
        }
        .map(|stored| algorithm.describe(&stored));
        // PTTL: -2 no key, -1 no expiry (never written so by tollgate).
        let pttl: i64 = connection.pttl(&key).await.map_err(unavailable)?;
        states.push(CounterState {
            key,
            stored,
            ttl_ms: u64::try_from(pttl).ok(),
            now,
        });
    }
    Ok(states)
}
