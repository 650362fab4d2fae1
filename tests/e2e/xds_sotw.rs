//! Limits over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`) against our own control plane
//! ([`crate::xds_plane`]): the first config and its ACK, health before and after it (with and
//! without `FORCE_START_WITHOUT_INITIAL_CONFIG`), updates under traffic, a NACKed
//! update while the old limits answer, a control plane that restarts, and mTLS.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::common::process::free_ports;
use crate::common::tls_certs::TestCa;
use crate::xds_plane::{
    Caller, ControlPlane, WAIT, http_get, resource, serve, wait_healthy, write_pem,
};

/// An ACK of `version`: the version named, a nonce, no error.
fn is_ack(event: &Json, version: &str) -> bool {
    event["event"] == "request"
        && event["version_info"] == version
        && event["response_nonce"] != ""
        && event["error_detail"].is_null()
}

#[test]
fn the_first_config_is_served_acked_and_shown() {
    let mut plane = ControlPlane::start(0, &[]);
    // A year's window: OK, OK, OVER_LIMIT hold only within one window.
    plane.set(
        "v1",
        json!([resource(
            "gw",
            "envoy-gateway/gateway-1/http",
            "rule-0-match-1",
            "YEAR",
            2
        )]),
    );
    let (grpc, http) = free_ports();
    let server = serve(
        plane.port,
        grpc,
        http,
        &[
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,team=rl"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:t1"),
        ],
    );
    let open = plane.wait_for("a stream", |e| e["event"] == "stream_open");
    assert_eq!(open["node"]["id"], "envoy-ratelimit", "{open}");
    assert_eq!(open["node"]["metadata"], json!({"zone": "a", "team": "rl"}));
    assert_eq!(open["headers"]["x-tenant"], "t1", "{open}");
    let first = plane.wait_for("the subscription", |e| e["event"] == "request");
    assert_eq!(
        first["type_url"],
        "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
    );
    assert_eq!(first["version_info"], "", "nothing ACKed yet");
    plane.wait_for("the ACK of v1", |e| is_ack(e, "v1"));
    wait_healthy(&server, http);

    let mut caller = Caller::new(grpc);
    let domain = "envoy-gateway/gateway-1/http";
    let key = [("rule-0-match-1", "first")];
    for _ in 0..2 {
        let answer = caller.call(domain, &key).unwrap();
        assert!(!answer.over_limit);
        assert_eq!(answer.limit, Some(2));
    }
    assert!(caller.call(domain, &key).unwrap().over_limit);

    let view: Json = serde_json::from_str(&http_get(http, "/config.json")).unwrap();
    assert_eq!(view["source"], "xds", "{view}");
    assert_eq!(view["version"], "v1", "{view}");
    assert_eq!(view["domains"][0]["domain"], domain, "{view}");
    let metrics = http_get(http, "/metrics");
    assert!(
        metrics.contains(r#"tollgate_config_source_info{source="xds",version="v1"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("tollgate_xds_connected 1"), "{metrics}");
    // The caller's connection is not driven between calls: close it before SIGTERM,
    // whose graceful shutdown waits for open connections.
    drop(caller);
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn without_force_start_health_waits_for_the_first_config() {
    let mut plane = ControlPlane::start(0, &[]);
    let (grpc, http) = free_ports();
    let mut server = serve(plane.port, grpc, http, &[]);
    server.wait_until_serving(grpc);
    plane.wait_for("a stream", |e| e["event"] == "stream_open");
    let health = http_get(http, "/healthcheck");
    assert!(health.starts_with("NOT_SERVING"), "{health}");
    plane.set("v1", json!([resource("a", "wait", "k", "SECOND", 5)]));
    wait_healthy(&server, http);
    assert_eq!(
        Caller::new(grpc).call("wait", &[("k", "v")]).unwrap().limit,
        Some(5)
    );
}

#[test]
fn with_force_start_it_serves_at_once_without_domains() {
    let mut plane = ControlPlane::start(0, &[]);
    let (grpc, http) = free_ports();
    let mut server = serve(
        plane.port,
        grpc,
        http,
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    );
    server.wait_until_serving(grpc);
    wait_healthy(&server, http);
    plane.wait_for("a stream", |e| e["event"] == "stream_open");
    let mut caller = Caller::new(grpc);
    assert_eq!(caller.call("forced", &[("k", "v")]).unwrap().limit, None);
    plane.set("v1", json!([resource("a", "forced", "k", "SECOND", 7)]));
    caller.until("forced", &[("k", "v")], |a| a.limit == Some(7));

    // SIGHUP has no files to reload under xDS, and must not end the process.
    let pid = server.child.id().to_string();
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status();
    assert!(hup.expect("run kill").success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.log().contains("SIGHUP ignored") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(server.log().contains("SIGHUP ignored"), "{}", server.log());
    assert!(server.child.try_wait().unwrap().is_none(), "still running");
    assert_eq!(caller.call("forced", &[("k", "v")]).unwrap().limit, Some(7));
}

#[test]
fn updates_under_traffic_are_answered_within_a_second_without_errors() {
    let mut plane = ControlPlane::start(0, &[]);
    plane.set(
        "v1",
        json!([resource("a", "live", "k", "SECOND", 1_000_000)]),
    );
    let (grpc, http) = free_ports();
    let server = serve(plane.port, grpc, http, &[]);
    wait_healthy(&server, http);
    let mut caller = Caller::new(grpc);
    let entry = [("k", "traffic")];
    caller.until("live", &entry, |a| a.limit == Some(1_000_000));
    // Four more callers keep calling throughout; none may see an error or no limit.
    let stop = Arc::new(AtomicBool::new(false));
    let background: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut caller = Caller::new(grpc);
                let value = format!("background-{i}");
                let (mut calls, mut bad) = (0_u32, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match caller.call("live", &[("k", &value)]) {
                        Ok(answer) if answer.limit.is_some() && !answer.over_limit => {}
                        other => bad.push(other),
                    }
                    calls += 1;
                }
                (calls, bad)
            })
        })
        .collect();
    for (version, limit) in [("v2", 2_000_000), ("v3", 3_000_000)] {
        plane.set(
            version,
            json!([resource("a", "live", "k", "SECOND", limit)]),
        );
        let changed = Instant::now();
        let mut calls = 0;
        loop {
            // Every call answers: a swap never shows as an error.
            let answer = caller
                .call("live", &entry)
                .expect("no error during an update");
            calls += 1;
            if answer.limit == Some(limit) {
                eprintln!(
                    "{version} answered {:?} after set, {calls} calls",
                    changed.elapsed()
                );
                break;
            }
            assert!(
                changed.elapsed() < Duration::from_secs(1),
                "{version} not answered within 1 s ({calls} calls)"
            );
        }
        // Once followed, never back.
        for _ in 0..50 {
            let answer = caller
                .call("live", &entry)
                .expect("no error after an update");
            assert_eq!(answer.limit, Some(limit));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for thread in background {
        let (calls, bad) = thread.join().expect("a background caller");
        assert!(calls > 0);
        assert!(
            bad.is_empty(),
            "{} of {calls} calls went wrong: {bad:?}",
            bad.len()
        );
    }
    plane.wait_for("the ACK of v3", |e| is_ack(e, "v3"));
    drop(server);
}

#[test]
fn a_bad_update_is_nacked_with_its_errors_and_the_old_limits_keep_answering() {
    let mut plane = ControlPlane::start(0, &[]);
    // Windows of a year: OK, OK, OVER_LIMIT hold only within one window.
    plane.set("v1", json!([resource("good", "nack", "k", "YEAR", 2)]));
    let (grpc, http) = free_ports();
    let server = serve(plane.port, grpc, http, &[]);
    plane.wait_for("the ACK of v1", |e| is_ack(e, "v1"));
    wait_healthy(&server, http);

    // A resource that does not decode beside one that would raise the limit.
    plane.set_with_garbage("v2", json!([resource("good", "nack", "k", "YEAR", 100)]));
    let nack = plane.wait_for("a NACK of v2", |e| {
        e["event"] == "request" && !e["error_detail"].is_null()
    });
    assert_eq!(
        nack["version_info"], "v1",
        "a NACK names the version served: {nack}"
    );
    assert_eq!(nack["error_detail"]["code"], 3, "INVALID_ARGUMENT: {nack}");
    // The NACK names the refused response by its nonce (the event of the send may
    // come after the NACK's: the plane reports a send once the stream took it).
    let sent = plane.wait_for("the send of v2", |e| {
        e["event"] == "sent" && e["version"] == "v2"
    });
    assert_eq!(
        nack["response_nonce"], sent["nonce"],
        "the NACK answers v2's response: {nack} {sent}"
    );
    let message = nack["error_detail"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot decode RateLimitConfig"),
        "{message}"
    );

    // A resource that decodes but does not compile, named in the error.
    plane.set(
        "v3",
        json!([{"name": "broken-unit", "domain": "nack",
                "descriptors": [{"key": "k", "rate_limit": {"requests_per_unit": 5}}]}]),
    );
    let nack = plane.wait_for("a NACK of v3", |e| {
        e["event"] == "request"
            && e["error_detail"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("broken-unit"))
    });
    let message = nack["error_detail"]["message"].as_str().unwrap();
    assert!(message.contains("invalid rate limit unit"), "{message}");

    let mut caller = Caller::new(grpc);
    let key = [("k", "old")];
    for _ in 0..2 {
        assert_eq!(
            caller.call("nack", &key).unwrap().limit,
            Some(2),
            "v1's limit"
        );
    }
    assert!(
        caller.call("nack", &key).unwrap().over_limit,
        "v1 still limits"
    );
    let view: Json = serde_json::from_str(&http_get(http, "/config.json")).unwrap();
    assert_eq!(view["version"], "v1", "{view}");
    assert!(
        view["reload"]["last_failure"].as_f64().unwrap() > 0.0,
        "{view}"
    );
    let metrics = http_get(http, "/metrics");
    assert!(
        metrics.contains(r#"tollgate_xds_updates_total{result="nack"} 2"#),
        "{metrics}"
    );
    assert!(health_ok(http), "a refused update does not change health");
}

fn health_ok(http: u16) -> bool {
    http_get(http, "/healthcheck").starts_with("OK")
}

#[test]
fn a_restarted_control_plane_is_reconnected_to_and_told_what_is_served() {
    let mut plane = ControlPlane::start(0, &[]);
    let port = plane.port;
    plane.set("v1", json!([resource("a", "restart", "k", "SECOND", 11)]));
    let (grpc, http) = free_ports();
    let server = serve(port, grpc, http, &[]);
    plane.wait_for("the ACK of v1", |e| is_ack(e, "v1"));
    wait_healthy(&server, http);
    plane.kill();

    let mut caller = Caller::new(grpc);
    assert_eq!(
        caller.call("restart", &[("k", "v")]).unwrap().limit,
        Some(11),
        "the last config serves while the control plane is away"
    );
    assert!(health_ok(http));

    let mut plane = ControlPlane::start(port, &[]);
    plane.set("v2", json!([resource("a", "restart", "k", "SECOND", 22)]));
    let first = plane.wait_for("the new stream's subscription", |e| {
        e["event"] == "request" && e["response_nonce"] == ""
    });
    assert_eq!(
        first["version_info"], "v1",
        "the new stream names what is served"
    );
    caller.until("restart", &[("k", "v")], |a| a.limit == Some(22));
    plane.wait_for("the ACK of v2", |e| is_ack(e, "v2"));
}

#[test]
fn mtls_refuses_a_wrong_client_certificate_and_accepts_the_right_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("xds test CA");
    let other = TestCa::new("someone else's CA");
    let server_leaf = ca.server();
    let good = ca.client(&["envoy-ratelimit"]);
    let bad = other.client(&["envoy-ratelimit"]);
    let ca_pem = write_pem(dir.path(), "ca.crt", &ca.cert_pem());
    let server_cert = write_pem(dir.path(), "server.crt", &server_leaf.cert_pem);
    let server_key = write_pem(dir.path(), "server.key", &server_leaf.key_pem);
    let good_cert = write_pem(dir.path(), "good.crt", &good.cert_pem);
    let good_key = write_pem(dir.path(), "good.key", &good.key_pem);
    let bad_cert = write_pem(dir.path(), "bad.crt", &bad.cert_pem);
    let bad_key = write_pem(dir.path(), "bad.key", &bad.key_pem);

    let mut plane = ControlPlane::start(
        0,
        &[
            "--cert",
            &server_cert,
            "--key",
            &server_key,
            "--client-ca",
            &ca_pem,
        ],
    );
    plane.set("v1", json!([resource("a", "mtls", "k", "SECOND", 9)]));
    let tls = |cert: &str, key: &str| {
        vec![
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_owned()),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ca_pem.clone()),
            // The URL is an IP; the name checked in the server's certificate is this.
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost".to_owned()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", cert.to_owned()),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", key.to_owned()),
        ]
    };

    let (grpc, http) = free_ports();
    let bad_env = tls(&bad_cert, &bad_key);
    let bad_vars: Vec<(&str, &str)> = bad_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut refused = serve(plane.port, grpc, http, &bad_vars);
    refused.wait_until_serving(grpc);
    // Two refused attempts logged (one warning a second at most), so the client has
    // tried again after the first refusal; neither may have opened a stream.
    let failures = |log: &str| {
        log.lines()
            .filter(|l| l.contains("xds_stream_broken") || l.contains("xds_connect_failed"))
            .count()
    };
    let deadline = Instant::now() + WAIT;
    while failures(&refused.log()) < 2 {
        assert!(
            Instant::now() < deadline,
            "two refusals logged within {WAIT:?}:\n{}",
            refused.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !plane.drain().iter().any(|e| e["event"] == "stream_open"),
        "a stream opened with a certificate from another CA"
    );
    assert!(http_get(http, "/healthcheck").starts_with("NOT_SERVING"));
    let log = refused.log();
    assert!(!log.contains("config_reloaded"), "{log}");
    assert_eq!(refused.terminate().code(), Some(0));

    let (grpc, http) = free_ports();
    let good_env = tls(&good_cert, &good_key);
    let good_vars: Vec<(&str, &str)> = good_env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let accepted = serve(plane.port, grpc, http, &good_vars);
    plane.wait_for("the ACK of v1 over mTLS", |e| is_ack(e, "v1"));
    wait_healthy(&accepted, http);
    assert_eq!(
        Caller::new(grpc).call("mtls", &[("k", "v")]).unwrap().limit,
        Some(9)
    );
}
