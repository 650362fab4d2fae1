//! One Redis Cluster master stopped under load (SIGSTOP, as a stalled host or a
//! long fork looks), on a cluster of its own: two `tollgate serve` processes and an
//! independent gRPC client sending requests whose slot groups live on the healthy
//! masters only, on the stopped one only, or on both. Requests on healthy masters
//! must be decided normally (at least 95% of them; the limit is out of reach, so
//! normal is OK), requests touching the stopped master must follow the domain's
//! `failure_mode: deny` (OVER_LIMIT), and `/metrics` must show that master's
//! breaker open while the others stay closed, then closed again after SIGCONT.
//! (Issue 12: with one breaker for the whole cluster, all 741 requests on healthy
//! masters were denied.) Prints its figures (`--nocapture`) for the docs.

mod load;

use crate::common;
use crate::common::prometheus::value;
use crate::reload::http_get;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::process::{Server, free_ports, tollgate};
use common::redis::RedisCluster;
use common::redis::custom::{pid_of, private_cluster};
use common::server::{descriptor, request};
use load::{Answer, Kind, Sample, percentile, worker};
use tollgate::proto::RateLimitServiceClient;
use tonic::transport::Channel;

pub(crate) const DOMAIN: &str = "iso";
/// `deny`, so a fallback answer (OVER_LIMIT) cannot pass for a decided one (the limit
/// is far out of reach: every decided answer is OK).
const CONFIG: &str = "domain: iso\nfailure_mode: deny\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
/// A little above the default (250 ms), so a test machine busy with other suites
/// does not time out healthy calls (they would read as failures of a healthy master),
/// while the stopped master's breaker still opens within the first half of the
/// stall (5 failures: about two rounds of timeouts).
const TIMEOUT_MS: u64 = 300;
/// Below the cluster's node timeout (2 s): no failover starts, the master comes back.
const STALL: Duration = Duration::from_millis(1500);
pub(crate) const WORKERS: usize = 12;
const KEYS_PER_MASTER: usize = 6;

/// SIGCONT on drop: a failing test never leaves a stopped redis-server behind.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        signal("-STOP", pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // No assertion here: this may run while a failed assertion unwinds.
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

fn signal(which: &str, pid: u32) {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}: {status}");
}

fn serve(dir: &Path, cluster: &RedisCluster) -> (Server, u16, u16) {
    let (grpc, http) = free_ports();
    let mut command = tollgate();
    command
        .args(["serve", "--config"])
        .arg(dir)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--redis-cluster", &cluster.seeds().join(",")])
        .args(["--redis-timeout-ms", &TIMEOUT_MS.to_string()])
        .env("LOG_FORMAT", "json");
    let mut server = Server::spawn(command);
    server.wait_until_serving(grpc);
    (server, grpc, http)
}

/// Descriptor values whose counters (tag `iso|k=VALUE`) live on each master, in
/// the order of `masters`, as the cluster itself places them.
fn values_by_master(cluster: &RedisCluster, masters: &[String]) -> Vec<Vec<String>> {
    let mut by_master = vec![Vec::new(); masters.len()];
    for i in 0.. {
        if by_master
            .iter()
            .all(|v: &Vec<String>| v.len() >= KEYS_PER_MASTER)
        {
            break;
        }
        let value = format!("v{i}");
        let owner = cluster.master_for_key(&format!("{{{DOMAIN}|k={value}}}"));
        let m = masters.iter().position(|m| *m == owner).expect("a master");
        if by_master[m].len() < KEYS_PER_MASTER {
            by_master[m].push(value);
        }
    }
    by_master
}

/// One scrape of every server: the `tollgate_breaker_state` of each master.
fn breaker_states(https: &[u16], masters: &[String]) -> Vec<Vec<f64>> {
    https
        .iter()
        .map(|&http| {
            let text = http_get(http, "/metrics");
            masters
                .iter()
                .map(|m| value(&text, &format!("tollgate_breaker_state{{node=\"{m}\"}}")))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_master_leaves_requests_on_healthy_masters_decided() {
    let cluster = tokio::task::spawn_blocking(|| private_cluster().expect("private cluster"))
        .await
        .unwrap();
    let cluster = Arc::new(cluster);
    let masters = cluster.masters();
    let victim = masters[0].clone();
    let by_master = {
        let (cluster, masters) = (cluster.clone(), masters.clone());
        tokio::task::spawn_blocking(move || values_by_master(&cluster, &masters))
            .await
            .unwrap()
    };
    let stopped = Arc::new(by_master[0].clone());
    let healthy = Arc::new(by_master[1..].to_vec());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("iso.yaml"), CONFIG).unwrap();
    let (a, grpc_a, http_a) = serve(dir.path(), &cluster);
    let (b, grpc_b, http_b) = serve(dir.path(), &cluster);
    let https = [http_a, http_b];
    let mut clients = Vec::new();
    for port in [grpc_a, grpc_b] {
        let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .expect("connect to tollgate");
        clients.push(RateLimitServiceClient::new(channel));
    }
    // Every master's breaker is published, closed, before anything fails.
    assert!(
        breaker_states(&https, &masters)
            .iter()
            .flatten()
            .all(|&s| s == 0.0),
        "{:?}",
        breaker_states(&https, &masters)
    );

    // Warm: every server has sent every key's slot a call before the load starts.
    for client in &mut clients {
        for value in by_master.iter().flatten() {
            let r = request(DOMAIN, vec![descriptor(&[("k", value)])]);
            client.should_rate_limit(r).await.expect("warm-up call");
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let (clients, healthy, stopped) = (clients.clone(), healthy.clone(), stopped.clone());
            tokio::spawn(worker(clients, id, healthy, stopped, stop.clone()))
        })
        .collect();
    // Watches the breakers from before the stall until the stopped master's breaker
    // has closed again after it (bounded), on every server.
    let watcher = {
        let (masters, stop) = (masters.clone(), stop.clone());
        tokio::task::spawn_blocking(move || {
            let mut isolated_seen = [false, false];
            let mut closed_after = false;
            let began = Instant::now();
            while began.elapsed() < Duration::from_secs(30) && !stop.load(Ordering::SeqCst) {
                let states = breaker_states(&https, &masters);
                for (seen, state) in isolated_seen.iter_mut().zip(&states) {
                    *seen |= state[0] == 2.0 && state[1..].iter().all(|&s| s == 0.0);
                }
                closed_after =
                    isolated_seen.iter().all(|&s| s) && states.iter().flatten().all(|&s| s == 0.0);
                if closed_after {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (isolated_seen, closed_after, began.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let victim_pid = pid_of(victim.rsplit(':').next().unwrap().parse().unwrap()).unwrap();
    let guard = Stopped::stop(victim_pid);
    let stopped_at = Instant::now();
    tokio::time::sleep(STALL).await;
    drop(guard);
    let resumed_at = Instant::now();
    let (isolated_seen, closed_after, watched) = watcher.await.unwrap();
    // Traffic on the recovered master for a moment more, then stop.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let mut samples = Vec::new();
    for w in workers {
        samples.extend(w.await.unwrap());
    }
    let (logs_a, logs_b) = (a.log(), b.log());
    // Failed calls are counted against the master that failed them, on every server.
    let node_errors: Vec<[f64; 2]> = https
        .iter()
        .map(|&http| {
            let text = http_get(http, "/metrics");
            ["timeout", "circuit_open"].map(|kind| {
                value(
                    &text,
                    &format!(
                        "tollgate_backend_node_errors_total{{node=\"{victim}\",kind=\"{kind}\"}}"
                    ),
                )
            })
        })
        .collect();
    drop((a, b));

    // During the stall: every request sent while the master was stopped, and for the
    // stopped master's requests only those that could not have reached it after
    // SIGCONT within the timeout.
    let during = |s: &Sample| s.sent >= stopped_at && s.sent < resumed_at;
    let settled = resumed_at - Duration::from_millis(TIMEOUT_MS + 150);
    let count = |kind: Kind, answer: Option<Answer>, within: &dyn Fn(&Sample) -> bool| {
        samples
            .iter()
            .filter(|s| s.kind == kind && within(s) && answer.is_none_or(|a| s.answer == a))
            .count()
    };
    let in_stall = |s: &Sample| during(s);
    let in_settled = |s: &Sample| s.sent >= stopped_at && s.sent < settled;
    let healthy_total =
        count(Kind::Healthy, None, &in_stall) + count(Kind::HealthyPair, None, &in_stall);
    let healthy_ok = count(Kind::Healthy, Some(Answer::Ok), &in_stall)
        + count(Kind::HealthyPair, Some(Answer::Ok), &in_stall);
    let mut latencies: Vec<Duration> = samples
        .iter()
        .filter(|s| during(s) && matches!(s.kind, Kind::Healthy | Kind::HealthyPair))
        .map(|s| s.latency)
        .collect();
    let (p50, p99) = (
        percentile(&mut latencies, 0.5),
        percentile(&mut latencies, 0.99),
    );
    let max = latencies.last().copied().unwrap_or_default();
    // Answered before SIGSTOP (one sent just before may be answered by the fallback).
    let before: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent + s.latency < stopped_at)
        .collect();
    eprintln!(
        "FIGURES node isolation: {} requests, {} before the stall ({} OK); stall {:.1} s",
        samples.len(),
        before.len(),
        before.iter().filter(|s| s.answer == Answer::Ok).count(),
        STALL.as_secs_f64()
    );
    eprintln!(
        "FIGURES node isolation: healthy-master requests during the stall: {healthy_ok} of {healthy_total} decided normally (OK); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    for kind in [Kind::Stopped, Kind::Mixed] {
        eprintln!(
            "FIGURES node isolation: {kind:?} during the stall: {} OVER_LIMIT (deny), {} OK, {} errors",
            count(kind, Some(Answer::OverLimit), &in_settled),
            count(kind, Some(Answer::Ok), &in_settled),
            count(kind, Some(Answer::Error), &in_settled)
        );
    }
    eprintln!(
        "FIGURES node isolation: breaker isolated (stopped master open, others closed) seen on {isolated_seen:?}; all closed again {closed_after} within {:.1} s of watching",
        watched.as_secs_f64()
    );

    // The baseline: a busy test machine may push a call past the timeout now and then.
    let before_ok = before.iter().filter(|s| s.answer == Answer::Ok).count();
    assert!(
        before_ok * 100 >= before.len() * 95,
        "before the stall only {before_ok} of {} answers were OK",
        before.len()
    );
    assert!(
        healthy_total >= 50,
        "too little healthy traffic: {healthy_total}"
    );
    assert!(
        healthy_ok * 100 >= healthy_total * 95,
        "only {healthy_ok} of {healthy_total} healthy-master requests were decided normally"
    );
    for kind in [Kind::Stopped, Kind::Mixed] {
        let answered = count(kind, None, &in_settled);
        let denied = count(kind, Some(Answer::OverLimit), &in_settled);
        assert!(answered > 0, "no {kind:?} request during the stall");
        assert_eq!(
            denied, answered,
            "{kind:?} requests during the stall must follow failure_mode: deny"
        );
    }
    assert_eq!(
        isolated_seen,
        [true, true],
        "each server's /metrics must show the stopped master's breaker open and the others closed\n{logs_a}\n{logs_b}"
    );
    assert!(
        closed_after,
        "the stopped master's breaker never closed after SIGCONT"
    );
    eprintln!(
        "FIGURES node isolation: the stopped master's timeouts and refused calls per server: {node_errors:?}"
    );
    assert!(
        node_errors
            .iter()
            .all(|[timeouts, refused]| *timeouts >= 1.0 && *refused >= 1.0),
        "tollgate_backend_node_errors_total names the stopped master: {node_errors:?}"
    );
    // After the stall the stopped master decides again.
    let last = samples
        .iter()
        .filter(|s| s.kind == Kind::Stopped)
        .max_by_key(|s| s.sent)
        .expect("a request on the stopped master");
    assert_eq!(
        last.answer,
        Answer::Ok,
        "the stopped master decides again after SIGCONT"
    );
}
