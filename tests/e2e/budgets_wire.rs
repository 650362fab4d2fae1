//! What Envoy 1.40 sends for `deploy/budgets/envoy.yaml`, read on the wire by a
//! capturing rate-limit service (`budgets/capture.rs`): the claims docs/budgets.md
//! makes, each checked against the real binary.
//!
//! - The token budget: at request time the tenant's descriptor with hits_addend 0 (a
//!   check); when the response is done a second call, hits_addend the response's
//!   `x-tokens` (`%RESP(x-tokens)%`).
//! - A response whose `x-tokens` is no number: no charge is sent at all.
//! - The concurrency limit: the acquisition (hits_addend unset, and the request's
//!   unset too: 0, which counts as 1), and
//!   at stream done the release, hits_addend 1 with is_negative_hits; also after a
//!   429. Both carry the request's x-request-id, one Envoy made, the same in both
//!   and another for each request (what `lease_key` relies on).
//! - The same rate_limits in the route's own `rate_limits` (not the filter's per-route
//!   config): Envoy accepts them and drops hits_addend and is_negative_hits.

use std::time::Duration;

use serde_json::{Value, json};

use crate::budgets::{self, Capture, call, eventually};

const WAIT: Duration = Duration::from_secs(15);

/// Adds a route `/route-level/` whose rate_limits sit in the route itself, the same
/// two as `/v1/jobs` (an acquisition and a stream-done release of 5), domain
/// `concurrency` from the per-route config.
fn add_route_level(config: &mut Value) {
    let routes = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["route_config"]["virtual_hosts"][0]["routes"]
        .as_array_mut()
        .expect("routes");
    let tenant =
        json!({ "request_headers": { "header_name": "x-tenant", "descriptor_key": "tenant" } });
    routes.insert(
        0,
        json!({
            "match": { "prefix": "/route-level/" },
            "route": {
                "cluster": "upstream",
                "rate_limits": [
                    { "actions": [tenant], "hits_addend": { "number": 7 } },
                    {
                        "apply_on_stream_done": true,
                        "hits_addend": { "number": 5, "is_negative_hits": true },
                        "actions": [tenant]
                    }
                ]
            },
            "typed_per_filter_config": {
                "envoy.filters.http.ratelimit": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
                    "domain": "concurrency"
                }
            }
        }),
    );
}

#[test]
fn envoy_sends_the_check_the_charge_and_the_release_as_the_guide_says() {
    let dir = tempfile::Builder::new()
        .prefix("budgets-wire-")
        .tempdir_in(crate::stack::guard::run_dir())
        .expect("temp dir");
    let capture = Capture::start();
    let (_upstream, upstream_port) = budgets::upstream(dir.path());
    let render = |ports: &budgets::EnvoyPorts| {
        budgets::render(ports, capture.port, upstream_port, add_route_level)
    };
    let (envoy, ports) = budgets::envoy(dir.path(), "envoy", render);
    let listener = std::net::SocketAddr::from(([127, 0, 0, 1], ports.listener));
    let logs = || envoy.log_tail(30);

    // The token budget: a check, then the response's cost.
    let response = crate::stack::http::send(listener, call("/v1/chat", "acme", 37, 0));
    assert_eq!(response.status, 200, "{response:?}\n{}", logs());
    assert_eq!(response.header("x-tokens"), Some("37"));
    let chat = || capture.with_entry("tenant", "acme").len() >= 2;
    assert!(eventually(WAIT, chat), "{:?}\n{}", capture.calls(), logs());
    let sent = capture.with_entry("tenant", "acme");
    assert_eq!(sent[0].domain, "budgets");
    assert_eq!(
        sent[0].hits_addend,
        Some(0),
        "the request-time check: {sent:?}"
    );
    assert_eq!(
        sent[1].hits_addend,
        Some(37),
        "the charge at stream done: {sent:?}"
    );
    assert!(!sent[0].is_negative_hits && !sent[1].is_negative_hits);

    // A response whose x-tokens is no number: Envoy sends no charge at all (the
    // stream-done descriptor is dropped). Read once a later request's charge came.
    let odd = crate::stack::http::Request::get("/v1/chat")
        .header("x-tenant", "odd")
        .header("x-cost", "many");
    let response = crate::stack::http::send(listener, odd);
    assert_eq!(response.status, 200, "{response:?}");
    let later = crate::stack::http::send(listener, call("/v1/chat", "later", 5, 0));
    assert_eq!(later.status, 200);
    let charged = || capture.with_entry("tenant", "later").len() >= 2;
    assert!(eventually(WAIT, charged), "{:?}", capture.calls());
    let sent = capture.with_entry("tenant", "odd");
    assert_eq!(sent.len(), 1, "only the check, no charge: {sent:?}");

    // The concurrency limit: acquire, then release at stream done.
    let response = crate::stack::http::send(listener, call("/v1/jobs", "jobs", 0, 0));
    assert_eq!(response.status, 200, "{response:?}");
    let jobs = || capture.with_entry("tenant", "jobs").len() >= 2;
    assert!(eventually(WAIT, jobs), "{:?}", capture.calls());
    let sent = capture.with_entry("tenant", "jobs");
    assert_eq!(sent[0].domain, "concurrency");
    assert_eq!(
        (sent[0].hits_addend, sent[0].is_negative_hits),
        (None, false)
    );
    // The request-level hits_addend is not set either: 0, which counts as 1.
    assert_eq!(sent[0].request_hits, 0);
    assert_eq!(
        (sent[1].hits_addend, sent[1].is_negative_hits),
        (Some(1), true)
    );
    let id = |s: &budgets::Sent| {
        s.entries
            .iter()
            .find(|(k, _)| k == "request_id")
            .map(|(_, v)| v.clone())
    };
    let jobs_id = id(&sent[0]).expect("the acquisition names the request");
    assert_eq!(jobs_id.len(), 36, "a UUID Envoy made: {jobs_id}");
    assert_eq!(
        id(&sent[1]),
        Some(jobs_id.clone()),
        "the release names it too"
    );

    // A denied request's stream ends too: Envoy sends its release as well.
    let response = crate::stack::http::send(listener, call("/v1/jobs", "denied", 0, 0));
    assert_eq!(response.status, 429, "{response:?}");
    let denied = || capture.with_entry("tenant", "denied").len() >= 2;
    assert!(eventually(WAIT, denied), "{:?}", capture.calls());
    let sent = capture.with_entry("tenant", "denied");
    assert_eq!(
        (sent[1].hits_addend, sent[1].is_negative_hits),
        (Some(1), true)
    );
    assert_eq!(id(&sent[0]), id(&sent[1]));
    assert_ne!(id(&sent[0]), Some(jobs_id), "each request its own id");

    // Route-level rate_limits: loaded without a word, hits_addend and
    // is_negative_hits gone from what is sent (the release becomes one more hit).
    let response = crate::stack::http::send(listener, call("/route-level/x", "route", 0, 0));
    assert_eq!(response.status, 200, "{response:?}");
    let route = || capture.with_entry("tenant", "route").len() >= 2;
    assert!(eventually(WAIT, route), "{:?}", capture.calls());
    let sent = capture.with_entry("tenant", "route");
    for s in &sent {
        assert_eq!(
            (s.hits_addend, s.is_negative_hits),
            (None, false),
            "{sent:?}"
        );
    }
}
