//! Readiness probes, node by node, on connections of their own (a probe never queues
//! behind rate-limit traffic). A standalone server or a Sentinel group's master is one
//! node: one PING. A cluster is every master that owns slots, as `CLUSTER NODES`
//! lists them, each PINGed on a direct connection of its own, so one master down
//! reads as that master down (`tollgate_backend_up{node}`), not as a flaky cluster.
//! Connections are opened on first use and kept (they reconnect by themselves).

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::join_all;
use redis::IntoConnectionInfo;
use tokio::sync::Mutex;

use super::{Connection, RedisOptions, RedisTarget, connect, describe};
use crate::store::{NodePing, StoreError};

pub struct Probe {
    /// What the probe connects with (its timeouts are the probe's, not a request's).
    options: RedisOptions,
    /// How to PING one node, bounded by this.
    timeout: Duration,
    /// The connection to the configured target (for a cluster: where `CLUSTER
    /// NODES` is asked).
    main: Mutex<Option<Connection>>,
    /// A cluster's masters by address, each with its connection once opened. Kept
    /// when `CLUSTER NODES` cannot be asked, so the masters last seen are probed.
    masters: Mutex<HashMap<String, Option<Connection>>>,
}

impl Probe {
    pub fn new(options: RedisOptions, timeout: Duration) -> Self {
        Self {
            options,
            timeout,
            main: Mutex::new(None),
            masters: Mutex::new(HashMap::new()),
        }
    }

    pub async fn ping(&self) -> Vec<NodePing> {
        match &self.options.target {
            RedisTarget::Cluster(seeds) => self.ping_masters(seeds).await,
            RedisTarget::Standalone(url) => vec![NodePing {
                node: node_of(url),
                result: self.ping_main().await,
            }],
            RedisTarget::Sentinel { master, .. } => vec![NodePing {
                node: master.clone(),
                result: self.ping_main().await,
            }],
        }
    }

    async fn ping_main(&self) -> Result<(), StoreError> {
        let mut connection = self.main_connection().await?;
        ping(&mut connection, self.timeout).await
    }

    async fn main_connection(&self) -> Result<Connection, StoreError> {
        let mut main = self.main.lock().await;
        if let Some(connection) = main.as_ref() {
            return Ok(connection.clone());
        }
        let connection = connect(&self.options)
            .await
            .map_err(StoreError::Unavailable)?;
        *main = Some(connection.clone());
        Ok(connection)
    }

    async fn ping_masters(&self, seeds: &[String]) -> Vec<NodePing> {
        let listed = match self.main_connection().await {
            Ok(mut connection) => cluster_masters(&mut connection, self.timeout).await,
            Err(error) => Err(error),
        };
        let mut masters = self.masters.lock().await;
        match listed {
            Ok(listed) => {
                masters.retain(|addr, _| listed.contains(addr));
                for addr in listed {
                    masters.entry(addr).or_insert(None);
                }
            }
            // Nothing listed and nothing known: the seeds stand for the cluster.
            Err(error) if masters.is_empty() => {
                return seeds
                    .iter()
                    .map(|seed| NodePing {
                        node: node_of(seed),
                        result: Err(error.clone()),
                    })
                    .collect();
            }
            Err(error) => {
                tracing::debug!(%error, "CLUSTER NODES failed; probing the masters last seen")
            }
        }
        let probes = masters.iter().map(|(addr, connection)| async move {
            let result = match connection.clone() {
                Some(connection) => Ok(connection),
                None => self.connect_node(seeds, addr).await,
            };
            match result {
                Ok(mut connection) => {
                    let answered = ping(&mut connection, self.timeout).await;
                    (addr.clone(), Some(connection), answered)
                }
                Err(error) => (addr.clone(), None, Err(error)),
            }
        });
        let results = join_all(probes).await;
        let mut pings = Vec::with_capacity(results.len());
        for (addr, connection, result) in results {
            if connection.is_some() {
                masters.insert(addr.clone(), connection);
            }
            pings.push(NodePing { node: addr, result });
        }
        pings.sort_by(|a, b| a.node.cmp(&b.node));
        pings
    }

    /// A direct connection to one master, with the seeds' scheme, credentials and TLS.
    async fn connect_node(&self, seeds: &[String], addr: &str) -> Result<Connection, StoreError> {
        let seed = seeds
            .first()
            .ok_or_else(|| StoreError::Unavailable("no cluster seed".into()))?;
        let url = with_authority(seed, addr)
            .ok_or_else(|| StoreError::Unavailable(format!("cannot address node {addr}")))?;
        let mut options = self.options.clone();
        options.target = RedisTarget::Standalone(url);
        connect(&options).await.map_err(StoreError::Unavailable)
    }
}

async fn ping(connection: &mut Connection, timeout: Duration) -> Result<(), StoreError> {
    let ping = redis::cmd("PING");
    match tokio::time::timeout(timeout, ping.query_async::<()>(connection)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(StoreError::Unavailable(describe(&e))),
        Err(_) => Err(StoreError::Timeout(timeout)),
    }
}

/// The masters that own slots, as `host:port`, from `CLUSTER NODES` (asked of any
/// node: every node knows the whole map).
async fn cluster_masters(
    connection: &mut Connection,
    timeout: Duration,
) -> Result<Vec<String>, StoreError> {
    let nodes = redis::cmd("CLUSTER").arg("NODES").clone();
    let text = match tokio::time::timeout(timeout, nodes.query_async::<String>(connection)).await {
        Ok(Ok(text)) => text,
        Ok(Err(e)) => return Err(StoreError::Unavailable(describe(&e))),
        Err(_) => return Err(StoreError::Timeout(timeout)),
    };
    Ok(parse_masters(&text))
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link>
/// <slot>...`: the address of every master with at least one slot (a failed master
/// still holding slots is listed, so it reads as down; one without slots serves
/// nothing).
fn parse_masters(text: &str) -> Vec<String> {
    let mut masters: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (addr, flags) = (fields.get(1)?, fields.get(2)?);
            let is_master = flags.split(',').any(|f| f == "master");
            let has_slots = fields.len() > 8;
            let addr = addr.split(['@', ',']).next()?;
            // `:0` is a node whose address is not known yet (`noaddr`).
            (is_master && has_slots && !addr.starts_with(':')).then(|| addr.to_owned())
        })
        .collect();
    masters.sort();
    masters.dedup();
    masters
}

/// `host:port` of a URL, without credentials: the node label of a standalone server.
fn node_of(url: &str) -> String {
    url.into_connection_info()
        .map(|info| info.addr().to_string())
        .unwrap_or_else(|_| "unknown".to_owned())
}

/// `seed` with its host and port replaced by `addr` (`host:port`, IPv6 hosts bare as
/// `CLUSTER NODES` prints them), keeping scheme, credentials and database.
fn with_authority(seed: &str, addr: &str) -> Option<String> {
    let (scheme, rest) = seed.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rsplit_once('@').map(|(user, _)| user);
    let (host, port) = addr.rsplit_once(':')?;
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    Some(match userinfo {
        Some(user) => format!("{scheme}://{user}@{host}:{port}{tail}"),
        None => format!("{scheme}://{host}:{port}{tail}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_with_slots_only() {
        let text = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002,redis-1 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7003@17003 master,fail - 0 0 3 disconnected 10923-16383
d4 127.0.0.1:7004@17004 slave a1 0 0 1 connected
e5 127.0.0.1:7005@17005 master - 0 0 5 connected
f6 :0@0 master,noaddr - 0 0 6 disconnected 1-2
";
        assert_eq!(
            parse_masters(text),
            ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
        );
    }

    #[test]
    fn a_node_url_keeps_scheme_credentials_and_database() {
        assert_eq!(
            with_authority("rediss://u:p@seed:7000/0", "10.0.0.2:7001").as_deref(),
            Some("rediss://u:p@10.0.0.2:7001/0")
        );
        assert_eq!(
            with_authority("redis://seed:7000", "::1:7001").as_deref(),
            Some("redis://[::1]:7001")
        );
        assert_eq!(with_authority("seed:7000", "10.0.0.2:7001"), None);
        assert_eq!(
            node_of("redis://:secret@127.0.0.1:6379/0"),
            "127.0.0.1:6379"
        );
    }
}
