//! SERVING means the store decides: Redis is killed (SIGKILL) and started again,
//! several rounds, and once grpc.health.v1 says SERVING again no request is answered
//! by the failure mode, and nothing over the limit is admitted. Standalone, Sentinel
//! (its master killed and restarted, no failover) and a cluster (every node killed and
//! restarted). The real binary (`tollgate serve`, its health probe, breaker and
//! batcher), real `redis-server`s.
//!
//! Each round kills Redis while requests keep coming (or while none do), waits until
//! health says NOT_SERVING, starts Redis again and, at the first SERVING seen, fires a
//! burst of [`BURST`] requests on a fresh counter of limit [`LIMIT`]: exactly [`LIMIT`]
//! admitted by Redis, none by the failure mode. Rounds without traffic during the
//! outage wait [`IDLE`] after SERVING before the burst (the connection that carries
//! requests sat unused all along). Every answer says whether the failure mode gave it
//! (`tollgate check`'s reading of the response's dynamic metadata), so fallbacks are
//! counted per request, not from a metric read at some other instant.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use common::process::{Server, free_ports, tollgate};
use common::redis::custom::{
    SentinelGroup, kill_server, private_cluster, restart_server, sentinel_group, start_servers,
};
use common::server::{descriptor, request};
use tollgate::cli::check::fallback;
use tollgate::proto::RateLimitServiceClient;
use tollgate::proto::rate_limit_response::Code;

/// `allow`: a fallback admits, so a fail-open burst would show as admissions.
const CONFIG: &str = "domain: rr\nfailure_mode: allow\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 50}\n";
const LIMIT: usize = 50;
const BURST: usize = 200;
/// Concurrent requests of the steady load.
const WORKERS: usize = 16;
/// How long a burst waits after SERVING in a round without traffic.
const IDLE: Duration = Duration::from_secs(5);
/// Bounds for health to follow Redis: three failed probes a second apart to leave
/// SERVING, a reconnection and a probe to return (a cluster's nodes first meet again).
const HEALTH_WITHIN: Duration = Duration::from_secs(30);

/// What a round does while Redis is away.
#[derive(Debug, Clone, Copy)]
enum Traffic {
    /// Requests keep coming throughout.
    Steady,
    /// None from before the kill until [`IDLE`] after SERVING.
    Idle,
}

const ROUNDS: [Traffic; 4] = [
    Traffic::Steady,
    Traffic::Idle,
    Traffic::Steady,
    Traffic::Idle,
];

/// The Redis servers a round kills and starts again, and how `serve` finds them.
struct Target {
    flag: [String; 2],
    ports: Vec<u16>,
    /// Kept alive for the sentinels' sake.
    _sentinel: Option<SentinelGroup>,
}

#[test]
fn standalone_serving_after_a_restart_means_redis_decides() {
    let server = start_servers("restart", 1, &[])
        .expect("a private redis")
        .remove(0);
    let target = Target {
        flag: ["--redis-url".into(), format!("redis://{}", server.addr())],
        ports: vec![server.port],
        _sentinel: None,
    };
    rounds(&target, "standalone");
}

#[test]
fn sentinel_serving_after_a_restart_means_redis_decides() {
    // No failover in the outage: the master comes back where it was.
    let group = sentinel_group("restart", 60_000).expect("a sentinel group");
    let target = Target {
        flag: ["--redis-sentinel".into(), group.url()],
        ports: vec![group.master.port],
        _sentinel: Some(group),
    };
    rounds(&target, "sentinel");
}

#[test]
fn cluster_serving_after_a_restart_means_redis_decides() {
    let cluster = private_cluster().expect("a private cluster");
    let target = Target {
        flag: ["--redis-cluster".into(), cluster.seeds().join(",")],
        ports: cluster.ports(),
        _sentinel: None,
    };
    rounds(&target, "cluster");
}

fn rounds(target: &Target, name: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("rr.yaml"), CONFIG).expect("write the config");
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .args(["serve", "--no-watch", "--drain-seconds", "0", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(&target.flag)
        .args(["--key-prefix", &format!("restart_{name}_")])
        // Generous, so that a loaded machine does not turn a burst into timeouts: the
        // failures this test looks for (a dead connection, a breaker refusing) are
        // answered at once, not at the timeout.
        .args(["--redis-timeout-ms", "2000"]);
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let url = format!("http://127.0.0.1:{grpc}");
    let outcome = runtime.block_on(async {
        let channel = Channel::from_shared(url)
            .expect("a url")
            .connect()
            .await
            .expect("connect");
        let health = HealthClient::new(channel.clone());
        let client = RateLimitServiceClient::new(channel);
        wait_health(&health, true).await?;
        for (round, traffic) in ROUNDS.iter().enumerate() {
            round_of(target, &health, &client, round, *traffic)
                .await
                .map_err(|e| format!("{name} round {round} ({traffic:?}): {e}"))?;
        }
        Ok::<(), String>(())
    });
    if let Err(error) = outcome {
        panic!("{error}\n--- serve's log ---\n{}", server.log());
    }
    assert!(server.terminate().success());
}

async fn round_of(
    target: &Target,
    health: &HealthClient<Channel>,
    client: &RateLimitServiceClient<Channel>,
    round: usize,
    traffic: Traffic,
) -> Result<(), String> {
    let load = match traffic {
        Traffic::Steady => Some(Load::start(client, &format!("load-{round}"))),
        Traffic::Idle => None,
    };
    let ports = target.ports.clone();
    tokio::task::spawn_blocking(move || ports.iter().try_for_each(|&p| kill_server(p)))
        .await
        .expect("kill")?;
    wait_health(health, false).await?;
    let ports = target.ports.clone();
    tokio::task::spawn_blocking(move || ports.iter().try_for_each(|&p| restart_server(p)))
        .await
        .expect("restart")?;
    let serving = wait_health(health, true).await?;
    if matches!(traffic, Traffic::Idle) {
        tokio::time::sleep(IDLE).await;
    }
    let burst = burst(client, &format!("burst-{round}")).await;
    let load = match load {
        Some(load) => load.stop().await,
        None => Vec::new(),
    };
    let fallbacks = |answers: &[Answer]| answers.iter().filter(|a| a.fallback).count();
    let admitted = |answers: &[Answer]| {
        answers
            .iter()
            .filter(|a| !a.fallback && a.code == Some(Code::Ok))
            .count()
    };
    let failed: Vec<&String> = burst.iter().filter_map(|a| a.error.as_ref()).collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} burst calls failed: {:?}",
            failed.len(),
            &failed[..1]
        ));
    }
    if fallbacks(&burst) != 0 || admitted(&burst) != LIMIT {
        return Err(format!(
            "the burst after SERVING: {} admitted by Redis (limit {LIMIT}), {} by the failure mode",
            admitted(&burst),
            fallbacks(&burst)
        ));
    }
    let after: Vec<Answer> = load.iter().filter(|a| a.sent >= serving).cloned().collect();
    if fallbacks(&after) != 0 {
        return Err(format!(
            "{} of the {} steady requests sent after SERVING were answered by the failure mode",
            fallbacks(&after),
            after.len()
        ));
    }
    // Redis came back empty: what it admitted of the steady counter since is within
    // the limit.
    let since_restart: Vec<Answer> = load.into_iter().filter(|a| a.sent >= serving).collect();
    if admitted(&since_restart) > LIMIT {
        return Err(format!(
            "{} steady requests admitted by Redis on a limit of {LIMIT}",
            admitted(&since_restart)
        ));
    }
    Ok(())
}

/// Polls grpc.health.v1 until it says `serving` (bounded); the first instant it did.
async fn wait_health(health: &HealthClient<Channel>, serving: bool) -> Result<Instant, String> {
    let deadline = Instant::now() + HEALTH_WITHIN;
    let want = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    loop {
        let mut health = health.clone();
        let asked = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        let now = Instant::now();
        match asked {
            Ok(answer) if answer.get_ref().status == want as i32 => return Ok(now),
            _ if now >= deadline => {
                return Err(format!(
                    "health never said {want:?} within {HEALTH_WITHIN:?}"
                ));
            }
            // Polling: a SERVING seen is at most this late.
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

#[derive(Debug, Clone)]
struct Answer {
    sent: Instant,
    code: Option<Code>,
    fallback: bool,
    error: Option<String>,
}

async fn ask(mut client: RateLimitServiceClient<Channel>, key: String) -> Answer {
    let sent = Instant::now();
    let req = request("rr", vec![descriptor(&[("k", &key)])]);
    match client.should_rate_limit(req).await {
        Ok(response) => {
            let response = response.into_inner();
            Answer {
                sent,
                code: Code::try_from(response.overall_code).ok(),
                fallback: fallback(&response).is_some(),
                error: None,
            }
        }
        Err(status) => Answer {
            sent,
            code: None,
            fallback: false,
            error: Some(status.to_string()),
        },
    }
}

/// [`BURST`] requests at once on `key`.
async fn burst(client: &RateLimitServiceClient<Channel>, key: &str) -> Vec<Answer> {
    let calls = (0..BURST).map(|_| tokio::spawn(ask(client.clone(), key.to_owned())));
    let mut answers = Vec::with_capacity(BURST);
    for call in calls.collect::<Vec<_>>() {
        answers.push(call.await.expect("a burst call"));
    }
    answers
}

/// [`WORKERS`] clients asking one after another on one key until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &RateLimitServiceClient<Channel>, key: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let workers = (0..WORKERS)
            .map(|_| {
                let (client, key) = (client.clone(), key.to_owned());
                let (stop, answers) = (stop.clone(), answers.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let answer = ask(client.clone(), key.clone()).await;
                        answers.lock().await.push(answer);
                    }
                })
            })
            .collect();
        Load {
            stop,
            answers,
            workers,
        }
    }

    async fn stop(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        for worker in self.workers {
            worker.await.expect("a load worker");
        }
        std::mem::take(&mut *self.answers.lock().await)
    }
}
