//! The price of deciding without a cross-region round trip, measured live: how long
//! a busy region waits for the share an idle region holds (docs/global.md, "The
//! price").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::{
    Answer, LINK_DELAY, MINUTE_MS, Region, drive, http_get, now_ms, sleep_until_ms, start_region,
};
use crate::common::delay_proxy::DelayProxy;
use crate::common::redis::custom::private_standalone;

const BUDGET: &str = "domain: regions
descriptors:
  - key: tenant
    global: true
    rate_limit: {unit: minute, requests_per_unit: 600}
";

/// The price of deciding without a cross-region round trip, measured: region a takes
/// part of the limit, then falls silent holding it; region b, busy, runs through its
/// own share and is denied until a's next report gives the unused part back (a
/// release) and b's next sync takes it. Each such wait of b, from its first denial
/// to its next admission, is printed (none when a's report came first: b runs out of
/// its own share in about a second, a reports every two); docs/global.md states the
/// bound (a report period and a few ledger round trips) and this asserts it with
/// room for a loaded machine. By the window's end b has had all a did not use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_region_waits_for_an_idle_regions_share_about_a_report_period() {
    let ledger = private_standalone("global-ledger-price").expect("the ledger Redis");
    let proxy = DelayProxy::start(ledger.addr().parse().expect("address"), LINK_DELAY).await;
    let regions: Vec<Region> = ["a", "b"]
        .into_iter()
        .map(|name| start_region(name, &proxy.url(), BUDGET))
        .collect();
    // A whole window for the scenario: from the next minute's start.
    let w = now_ms() / MINUTE_MS + 1;
    sleep_until_ms(w * MINUTE_MS + 500).await;
    let (stop_a, stop) = watch::channel(false);
    let log_a = Arc::new(Mutex::new(Vec::new()));
    let a = tokio::spawn(drive(regions[0].grpc, 5.0, MINUTE_MS, stop, log_a.clone()));
    let (stop_b, stop) = watch::channel(false);
    let log_b = Arc::new(Mutex::new(Vec::new()));
    let b_slow = tokio::spawn(drive(regions[1].grpc, 5.0, MINUTE_MS, stop, log_b.clone()));
    // Both take part for 12 s (each region reports its demand a few times).
    sleep_until_ms(w * MINUTE_MS + 12_500).await;
    let _ = stop_a.send(true);
    let _ = a.await;
    let _ = stop_b.send(true);
    let _ = b_slow.await;
    let busy_from = now_ms();
    let (stop_b, stop) = watch::channel(false);
    let b = tokio::spawn(drive(
        regions[1].grpc,
        100.0,
        MINUTE_MS,
        stop,
        log_b.clone(),
    ));
    sleep_until_ms(w * MINUTE_MS + 50_000).await;
    let _ = stop_b.send(true);
    let _ = b.await;

    let a_used = log_a
        .lock()
        .unwrap()
        .iter()
        .filter(|x| x.admitted && x.window == w)
        .count() as u64;
    let answers: Vec<Answer> = log_b
        .lock()
        .unwrap()
        .iter()
        .filter(|x| x.window == w || !x.admitted)
        .copied()
        .collect();
    let b_used = answers.iter().filter(|x| x.admitted).count() as u64;
    // Each wait: a denial after b's busy phase began, to the next admission.
    let mut waits = Vec::new();
    let mut denied_since = None;
    for x in answers.iter().filter(|x| x.asked_ms >= busy_from) {
        match (x.admitted, denied_since) {
            (false, None) => denied_since = Some(x.asked_ms),
            (true, Some(since)) => {
                waits.push(Duration::from_millis(x.asked_ms - since));
                denied_since = None;
            }
            _ => {}
        }
    }
    eprintln!(
        "global_regions: a used {a_used}, b used {b_used} of 600; b's waits for a's unused share: {waits:?}"
    );
    for r in &regions {
        let view = http_get(r.http, "/global").1;
        eprintln!(
            "global_regions: /global of {}: {}",
            r.name,
            view.replace('\n', " ")
        );
    }
    assert!(a_used + b_used <= 600, "{a_used} + {b_used}");
    let longest = waits.iter().max().copied().unwrap_or_default();
    assert!(
        longest <= Duration::from_secs(8),
        "b waited {longest:?} for a share a held unused: {waits:?}"
    );
    // a's unused part went to b: all but a margin a keeps (its floor and rounding).
    assert!(
        a_used + b_used >= 600 * 9 / 10,
        "{a_used} + {b_used} of 600"
    );
    drop(ledger);
}
