//! The RLQS target measurement (docs/rlqs.md, "Measured"): not run by CI (ignored; about
//! 3 minutes per scenario). `scripts/rlqs-measure` runs it; `RLQS_SCENARIO` picks one of
//! `share` (one replica, memory ledger: 600/min, demand 10:1:1, the busy Envoy stops
//! at 120 s), `restart` (the same, tollgate killed and restarted at 90 s), `replicas`
//! (two replicas on the Redis Cluster, the busy Envoy on one, restarted at 90 s) and
//! `latency` (p99 through Envoy with RLQS against Envoy without any rate limit, under
//! the limit, on the same load), and the load scenarios of `rlqs_load.rs`: `scale`
//! (2,000 streams on one bucket), `memory` (150 streams x 1,000 buckets) and `ledger`
//! (Redis time per ledger call by claims on the bucket). Figures are printed, not
//! asserted.

use std::time::{Duration, Instant};

use crate::rlqs::{KeepAlive, Rig, admitted, offered};

const SECONDS: f64 = 180.0;

fn scenario() -> String {
    std::env::var("RLQS_SCENARIO").unwrap_or_else(|_| "share".into())
}

#[test]
#[ignore = "3 minutes per scenario: scripts/rlqs-measure"]
fn rlqs_measure() {
    match scenario().as_str() {
        "share" => shares(false, None),
        "restart" => shares(false, Some(90.0)),
        "replicas" => shares(true, Some(90.0)),
        "latency" => latency(),
        "scale" => crate::rlqs_load::scale(),
        "memory" => crate::rlqs_load::memory(),
        "ledger" => crate::rlqs_load::ledger(),
        other => panic!("RLQS_SCENARIO: unknown scenario {other}"),
    }
}

/// Three Envoys offered 25, 2.5 and 2.5 requests/s against 10/s; the busy one stops
/// at 120 s; tollgate (the busy Envoy's replica) restarted at `restart` s.
fn shares(two_replicas: bool, restart: Option<f64>) {
    let mut rig = Rig::start("rlqs_measure", two_replicas);
    let stop_busy = 120.0;
    let plans = [(25.0, stop_busy), (2.5, SECONDS), (2.5, SECONDS)];
    let results = rig.run(&plans, restart);
    let per_envoy =
        |from, to| -> Vec<usize> { results.iter().map(|r| admitted(r, from, to)).collect() };
    let all = |from, to| -> usize { per_envoy(from, to).iter().sum() };
    println!(
        "scenario {} (limit 600/min, 10/s; offered 25:2.5:2.5 req/s)",
        scenario()
    );
    for minute in 0..3 {
        let from = f64::from(minute) * 60.0;
        println!(
            "  minute {}: admitted {:?} = {} per minute",
            minute + 1,
            per_envoy(from, from + 60.0),
            all(from, from + 60.0)
        );
    }
    let steady = per_envoy(10.0, 70.0);
    let total: usize = steady.iter().sum();
    println!(
        "  10-70 s (after two report periods): {total} admitted ({:+.1}% of 600); busy Envoy {:.1}% of it",
        (total as f64 / 600.0 - 1.0) * 100.0,
        steady[0] as f64 * 100.0 / total as f64
    );
    let busy_part = per_envoy(10.0, stop_busy);
    println!(
        "  10-120 s: busy Envoy {:.1}% of {} admitted",
        busy_part[0] as f64 * 100.0 / busy_part.iter().sum::<usize>() as f64,
        busy_part.iter().sum::<usize>()
    );
    // After the busy Envoy stops, the two others may have 5/s each, more than the
    // 2.5/s they are offered: their new share is everything they are offered.
    let reached = (0..60).map(f64::from).find(|s| {
        let from = stop_busy + s;
        results[1..].iter().all(|r| {
            admitted(r, from, from + 5.0) as f64 >= 0.9 * offered(r, from, from + 5.0) as f64
        })
    });
    match reached {
        Some(s) => println!(
            "  after the busy Envoy stopped at {stop_busy} s: the others admit 90% of what they are offered from {s:.0} s later (5 s windows)"
        ),
        None => println!(
            "  after the busy Envoy stopped: the others did not reach 90% of what they are offered within 60 s"
        ),
    }
    if let Some(at) = restart {
        let windows: Vec<usize> = (0..36)
            .map(|w| all(f64::from(w) * 5.0, f64::from(w) * 5.0 + 5.0))
            .collect();
        let worst = windows.iter().max().copied().unwrap_or(0);
        println!(
            "  restart at {at} s: admitted per 5 s window {windows:?}; the most {worst} (twice the limit: 100)"
        );
        let minute = (at / 60.0).floor() * 60.0;
        let around = all(minute, minute + 60.0);
        println!(
            "  the minute containing the restart ({minute}-{} s): {around} ({:+.1}% of 600)",
            minute + 60.0,
            (around as f64 / 600.0 - 1.0) * 100.0
        );
    }
}

/// p99 through Envoy with RLQS (under the limit: every request is decided locally and
/// admitted) against the same Envoy config without the filter, interleaved, each on
/// a kept-alive connection (the figure is Envoy's, not a TCP handshake's).
fn latency() {
    let rig = Rig::start("rlqs_latency", false);
    let plain = rig.plain_envoy();
    let mut with = Vec::new();
    let mut without = Vec::new();
    let mut clients = [KeepAlive::new(rig.envoy_addr(0)), KeepAlive::new(plain.1)];
    let began = Instant::now();
    // 5 requests a second through each, alternately: under the limit of 10/s, so RLQS
    // admits them all, deciding each in Envoy.
    while began.elapsed() < Duration::from_secs_f64(SECONDS) {
        for (client, into) in clients.iter_mut().zip([&mut with, &mut without]) {
            let start = Instant::now();
            let status = client.get();
            into.push((start.elapsed(), status));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let p = |v: &mut Vec<(Duration, u16)>, q: f64| {
        v.sort();
        v[((v.len() as f64 * q) as usize).min(v.len() - 1)].0
    };
    let denied = with.iter().filter(|(_, s)| *s != 200).count();
    println!(
        "scenario latency: {} requests each, RLQS denied {denied}",
        with.len()
    );
    println!(
        "  with RLQS:     p50 {:?} p99 {:?}",
        p(&mut with, 0.5),
        p(&mut with, 0.99)
    );
    println!(
        "  no rate limit: p50 {:?} p99 {:?}",
        p(&mut without, 0.5),
        p(&mut without, 0.99)
    );
}
