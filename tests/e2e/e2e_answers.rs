//! tollgate's answers beyond OK and OVER_LIMIT (README "Answers"), end to end through
//! the real Envoy on the deployment's files, with the stack of `tests/e2e/e2e_envoy.rs`
//! (`stack::Stack`: Envoy 1.40, two `tollgate serve` replicas on the Redis
//! Cluster, the echo upstream).
//!
//! Covered: shadow mode (`config/beta.yaml`, route `/beta`): over the limit the client
//! still gets 200 and the application receives `x-ratelimit-shadow-exceeded: true`;
//! the rate-limit response headers of `--response-headers ratelimit` and `ietf` on a
//! 200 and a 429, with `Retry-After` and the JSON 429 body; the tarpit (route
//! `/abuse`): refusals held back for the delay, at most `max_concurrent` at once per
//! replica, every one a real 429 (never Envoy failing open after its timeout); and
//! that Envoy's timeout leaves room for every tarpit in `config/`.

use crate::common;

use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::stack::http::{Request, Response};
use crate::stack::{Stack, Window};
use common::envoy::REDIS_TIMEOUT_MS;
use common::envoy::render;

/// Time a scenario may take; it waits for the next window when less is left.
const ROOM: Duration = Duration::from_secs(15);
/// `tarpit.delay` of `abuse_per_client` in config/beta.yaml.
const TARPIT_DELAY: Duration = Duration::from_millis(400);
/// `tarpit.max_concurrent` of `abuse_per_client`.
const TARPIT_MAX_CONCURRENT: u64 = 2;
const SHADOW_HEADER: &str = "x-ratelimit-shadow-exceeded";

/// The request headers the echo upstream received, from its JSON body.
fn echoed_headers(response: &Response) -> Value {
    let body: Value = serde_json::from_str(&response.body)
        .unwrap_or_else(|e| panic!("the upstream answers JSON ({e}): {response:#?}"));
    body["headers"].clone()
}

fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

/// A login attempt for `account` from 127.0.0.`ip` (login_per_ip: 10 per minute).
fn login(ip: u8, account: &str) -> Request {
    Request::post("/login")
        .header("x-account", account)
        .source_ip(ip)
}

/// Asserts a reset (or retry) of `value` seconds fits the minute window, near the
/// window's actual end.
fn assert_about_window_end(what: &str, value: u64) {
    let expected = Window::seconds_left(60);
    assert!(
        (1..=60).contains(&value) && value.abs_diff(expected) <= 2,
        "{what} {value}, expected about {expected}"
    );
}

#[test]
fn over_a_shadow_limit_requests_pass_marked_for_the_application() {
    let stack = Stack::start("e2e_shadow");
    let window = Window::with_room(&[60], ROOM);
    // beta_per_client: 5 per minute per client, shadow_mode.
    let within = stack.send_each(
        (0..5)
            .map(|_| Request::get("/beta").source_ip(80))
            .collect(),
    );
    assert_eq!(statuses(&within), [200; 5], "{within:#?}");
    for response in &within {
        let headers = echoed_headers(response);
        assert!(headers.get(SHADOW_HEADER).is_none(), "{headers}");
    }

    let beyond = stack.send_each(
        (0..3)
            .map(|_| Request::get("/beta").source_ip(80))
            .collect(),
    );
    for response in &beyond {
        assert_eq!(
            response.status, 200,
            "shadow mode never refuses: {response:#?}"
        );
        assert_eq!(response.header("x-envoy-ratelimited"), None);
        let headers = echoed_headers(response);
        assert_eq!(headers[SHADOW_HEADER], "true", "{headers}");
        // A request header for the application, not a response header.
        assert_eq!(response.header(SHADOW_HEADER), None);
    }

    // Another client is within its own limit: not marked.
    let other = stack.send(Request::get("/beta").source_ip(81));
    assert_eq!(other.status, 200, "{other:#?}");
    assert!(echoed_headers(&other).get(SHADOW_HEADER).is_none());
    window.assert_same();

    // Envoy saw only OK answers, all of them decided by tollgate.
    assert_eq!(stack.stat("cluster.upstream.ratelimit.over_limit"), 0);
    assert_eq!(stack.stat("cluster.upstream.ratelimit.ok"), 9);
    stack.assert_every_call_decided();
    let logs = stack.logs();
    assert!(logs.contains("shadow_exceeded"), "logged: {logs}");
}

#[test]
fn ratelimit_headers_retry_after_and_the_json_body_reach_the_client() {
    let stack = Stack::start_with("e2e_rl_headers", &["--response-headers", "ratelimit"]);
    let window = Window::with_room(&[60, 3600], ROOM);
    // Fresh accounts: login_per_ip (10 per minute) is the closest limit.
    let admitted = stack.send_each((0..10).map(|i| login(90, &format!("rl-{i}"))).collect());
    assert_eq!(statuses(&admitted), [200; 10], "{admitted:#?}");
    let first = &admitted[0];
    assert_eq!(first.header("ratelimit-limit"), Some("10"), "{first:#?}");
    assert_eq!(first.number("ratelimit-remaining"), 9);
    assert_about_window_end("RateLimit-Reset", first.number("ratelimit-reset"));
    assert_eq!(first.header("retry-after"), None, "only refusals say when");
    assert_eq!(admitted[9].number("ratelimit-remaining"), 0);

    let denied = stack.send(login(90, "rl-10"));
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(denied.header("ratelimit-limit"), Some("10"));
    assert_eq!(denied.number("ratelimit-remaining"), 0);
    let reset = denied.number("ratelimit-reset");
    assert_about_window_end("RateLimit-Reset", reset);
    let retry = denied.number("retry-after");
    assert_about_window_end("Retry-After", retry);
    assert!(
        retry.abs_diff(reset) <= 1,
        "Retry-After {retry}, reset {reset}"
    );
    assert_eq!(denied.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_str(&denied.body)
        .unwrap_or_else(|e| panic!("the 429 body is JSON ({e}): {denied:#?}"));
    assert_eq!(
        body,
        serde_json::json!({
            "error": "rate_limited",
            "limit": "login_per_ip",
            "retry_after_seconds": retry,
        })
    );
    window.assert_same();
    stack.assert_every_call_decided();
}

#[test]
fn ietf_ratelimit_policy_and_ratelimit_fields_reach_the_client() {
    let stack = Stack::start_with("e2e_ietf_headers", &["--response-headers", "ietf"]);
    let window = Window::with_room(&[60, 3600], ROOM);
    let policy = "\"login_per_ip\";q=10;w=60";
    let admitted = stack.send_each((0..10).map(|i| login(91, &format!("ietf-{i}"))).collect());
    assert_eq!(statuses(&admitted), [200; 10], "{admitted:#?}");
    for (i, response) in admitted.iter().enumerate() {
        assert_eq!(response.header("ratelimit-policy"), Some(policy));
        let value = response.header("ratelimit").expect("RateLimit");
        let prefix = format!("\"login_per_ip\";r={};t=", 9 - i);
        let reset = value
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("RateLimit {value:?}, expected {prefix}<reset>"));
        assert_about_window_end("RateLimit t", reset.parse().expect("t is a number"));
        // One style at a time.
        assert_eq!(response.header("ratelimit-limit"), None);
    }

    let denied = stack.send(login(91, "ietf-10"));
    assert_eq!(denied.status, 429, "{denied:#?}");
    assert_eq!(denied.header("ratelimit-policy"), Some(policy));
    let value = denied.header("ratelimit").expect("RateLimit");
    assert!(value.starts_with("\"login_per_ip\";r=0;t="), "{value}");
    assert_about_window_end("Retry-After", denied.number("retry-after"));
    assert_eq!(denied.header("content-type"), Some("application/json"));
    window.assert_same();
    stack.assert_every_call_decided();
}

/// Sends `requests` at once, each from its own thread; every response with the time
/// it took.
fn send_timed(stack: &Stack, requests: Vec<Request>) -> Vec<(Response, Duration)> {
    let barrier = Barrier::new(requests.len());
    std::thread::scope(|scope| {
        let threads: Vec<_> = requests
            .into_iter()
            .map(|request| {
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let began = Instant::now();
                    let response = stack.send(request);
                    (response, began.elapsed())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("request thread"))
            .collect()
    })
}

#[test]
fn a_tarpit_holds_refusals_back_but_only_up_to_its_bound() {
    let stack = Stack::start("e2e_tarpit");
    let window = Window::with_room(&[60], ROOM);
    // abuse_per_client: 3 per minute per client; admitted requests are not held.
    for _ in 0..3 {
        let (response, took) = send_timed(&stack, vec![Request::get("/abuse").source_ip(100)])
            .pop()
            .expect("one response");
        assert_eq!(response.status, 200, "{response:#?}");
        assert!(took < TARPIT_DELAY, "an admitted request took {took:?}");
    }

    // The bound is per replica (each holds its own count of waiting answers), and
    // Envoy spreads the calls over both: with 2 x max_concurrent + 1 refusals at once,
    // at least one replica is past its bound, whatever the spread.
    let parallel = 2 * TARPIT_MAX_CONCURRENT + 1;
    let before = stack.replica_requests();
    let over_limit = stack.stat("cluster.upstream.ratelimit.over_limit");
    let mut results = send_timed(
        &stack,
        (0..parallel)
            .map(|_| Request::get("/abuse").source_ip(100))
            .collect(),
    );
    let after = stack.replica_requests();
    let spread: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(
        spread.iter().sum::<u64>(),
        parallel,
        "calls per replica {spread:?}"
    );
    let held: u64 = spread.iter().map(|&n| n.min(TARPIT_MAX_CONCURRENT)).sum();
    let at_once = (parallel - held) as usize;
    assert!(at_once >= 1, "{spread:?}");

    results.sort_by_key(|(_, took)| *took);
    let times: Vec<Duration> = results.iter().map(|(_, took)| *took).collect();
    for (response, _) in &results {
        // A 200 here would be Envoy giving up on tollgate and failing open.
        assert_eq!(response.status, 429, "{response:#?}\ntimes {times:?}");
        assert_eq!(response.header("x-envoy-ratelimited"), Some("true"));
    }
    let context = format!("times {times:?}, calls per replica {spread:?}");
    for took in &times[..at_once] {
        assert!(
            *took < TARPIT_DELAY,
            "past the bound, answered at once: {context}"
        );
    }
    for took in &times[at_once..] {
        assert!(*took >= TARPIT_DELAY, "held for the delay: {context}");
    }
    window.assert_same();
    assert_eq!(
        stack.stat("cluster.upstream.ratelimit.over_limit") - over_limit,
        parallel
    );
    stack.assert_every_call_decided();
}

/// Envoy durations are `<seconds>s` ("1s", "0.250s").
fn envoy_duration(value: &Value) -> Duration {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a duration: {value}"));
    let seconds: f64 = text
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an Envoy duration: {text}"));
    Duration::from_secs_f64(seconds)
}

#[test]
fn envoys_timeout_leaves_room_for_every_tarpit_after_the_redis_budget() {
    let envoy = render::load_yaml(&render::envoy_yaml_path());
    let hcm = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0];
    let filter = hcm["typed_config"]["http_filters"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        })
        .expect("the ratelimit filter");
    let timeout = envoy_duration(&filter["typed_config"]["timeout"]);
    let redis_ms = REDIS_TIMEOUT_MS.max(tollgate::settings::DEFAULT_REDIS_TIMEOUT_MS);
    let redis = Duration::from_millis(redis_ms);

    let config = tollgate::config::load_path(&common::process::root().join("config"))
        .unwrap_or_else(|e| panic!("config/ must load: {e}"));
    let mut tarpits = 0;
    for domain in config.domains() {
        for rule in &domain.rules {
            if let Some(tarpit) = rule.tarpit {
                tarpits += 1;
                assert!(
                    redis + tarpit.delay < timeout,
                    "{}/{}: Redis budget {redis:?} + tarpit {:?} must stay below Envoy's \
                     ratelimit timeout {timeout:?}, or Envoy fails open first",
                    domain.name,
                    rule.path,
                    tarpit.delay
                );
            }
        }
    }
    assert!(tarpits >= 1, "config/beta.yaml has a tarpit");
    let abuse = config.domain("beta").expect("domain beta");
    let rule = abuse
        .rules
        .iter()
        .find(|r| r.name.as_deref() == Some("abuse_per_client"))
        .expect("abuse_per_client");
    let tarpit = rule.tarpit.expect("a tarpit");
    assert_eq!(
        (tarpit.delay, u64::from(tarpit.max_concurrent)),
        (TARPIT_DELAY, TARPIT_MAX_CONCURRENT),
        "the constants of this file follow config/beta.yaml"
    );
}
