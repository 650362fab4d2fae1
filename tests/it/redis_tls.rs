//! Redis over TLS: a `redis-server` of this binary's own with a TLS port, its
//! certificates made at test time (rcgen), client certificates required, and an ACL
//! user. tollgate connects with `rediss://`, the CA (`REDIS_TLS_CACERT`), a client
//! certificate (`REDIS_TLS_CLIENT_CERT`/`_KEY`) and the user's password, and counts
//! there; a wrong password, a missing client certificate or an unknown CA fail the
//! start with a message that never shows the password.

use crate::common;
use crate::common::tls_certs as certs;

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use certs::{TestCa, write};
use common::redis::custom::{Server, free_port, start_servers};
use common::server::{TestServer, config, descriptor, request};
use tollgate::limiter::LimiterOptions;
use tollgate::proto::rate_limit_response::Code;
use tollgate::settings::{ServeFlags, ServeSettings};
use tollgate::store::redis::RedisStore;
use tollgate::store::redis::connect::{RedisOptions, RedisTarget, RedisTls};

const USER: &str = "tollgate_tls";
const PASSWORD: &str = "tls-right-secret";

struct TlsRedis {
    server: Server,
    tls_port: u16,
    dir: tempfile::TempDir,
}

/// One TLS-enabled server for the binary: plain port for set-up, TLS port for tests.
fn tls_redis() -> &'static TlsRedis {
    static REDIS: OnceLock<TlsRedis> = OnceLock::new();
    REDIS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new("tollgate test Redis CA");
        let leaf = ca.server();
        let cert = write(dir.path(), "redis.crt", &leaf.cert_pem);
        let key = write(dir.path(), "redis.key", &leaf.key_pem);
        let ca_file = write(dir.path(), "ca.crt", &ca.cert_pem());
        let client = ca.client(&["tollgate"]);
        write(dir.path(), "client.crt", &client.cert_pem);
        write(dir.path(), "client.key", &client.key_pem);
        let tls_port = free_port();
        let port = tls_port.to_string();
        let server = start_servers(
            "tls",
            1,
            &[
                "--tls-port",
                &port,
                "--tls-cert-file",
                cert.to_str().unwrap(),
                "--tls-key-file",
                key.to_str().unwrap(),
                "--tls-ca-cert-file",
                ca_file.to_str().unwrap(),
                "--tls-auth-clients",
                "yes",
            ],
        )
        .unwrap_or_else(|e| panic!("TLS redis-server did not start: {e}"))
        .remove(0);
        let acl = format!(">{PASSWORD}");
        common::redis::redis_cli(
            server.port,
            &["ACL", "SETUSER", USER, "on", &acl, "~*", "+@all"],
        );
        TlsRedis {
            server,
            tls_port,
            dir,
        }
    })
}

fn files(dir: &Path, client: bool) -> RedisTls {
    RedisTls {
        ca_cert: Some(dir.join("ca.crt")),
        client_cert: client.then(|| dir.join("client.crt")),
        client_key: client.then(|| dir.join("client.key")),
    }
}

fn options(url: String, auth: Option<&str>, tls: RedisTls) -> RedisOptions {
    RedisOptions {
        target: RedisTarget::Standalone(url),
        auth: auth.map(str::to_owned),
        key_prefix: common::redis::unique_prefix("tls"),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(5),
        tls,
        state_layout: Default::default(),
    }
}

async fn connect_error(options: &RedisOptions) -> String {
    match RedisStore::connect(options).await {
        Ok(_) => panic!("connected with {options:?}"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn counts_over_tls_with_an_acl_user_and_a_client_certificate() {
    let redis = tls_redis();
    // Resolved from envoyproxy/ratelimit's variables, as `serve` does.
    let env = [
        ("REDIS_URL", format!("127.0.0.1:{}", redis.tls_port)),
        ("REDIS_TLS", "true".into()),
        ("REDIS_AUTH", format!("{USER}:{PASSWORD}")),
        ("REDIS_TLS_CACERT", path(redis, "ca.crt")),
        ("REDIS_TLS_CLIENT_CERT", path(redis, "client.crt")),
        ("REDIS_TLS_CLIENT_KEY", path(redis, "client.key")),
    ];
    let settings = ServeSettings::resolve(&ServeFlags::default(), &|name| {
        env.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    })
    .expect("settings");
    let mut options = settings.backend.redis().cloned().expect("redis configured");
    options.key_prefix = common::redis::unique_prefix("tls-count");
    let store = RedisStore::connect(&options).await.expect("TLS connect");
    // A year: three OKs then denials hold only within one window.
    let yaml = "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 3}\n";
    let server = TestServer::start(config(yaml), Arc::new(store), LimiterOptions::default()).await;
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        let answer = client
            .should_rate_limit(request("tls", vec![descriptor(&[("k", "v")])]))
            .await
            .expect("answer")
            .into_inner();
        codes.push(Code::try_from(answer.overall_code).unwrap());
    }
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::Ok,
            Code::OverLimit,
            Code::OverLimit
        ]
    );
    // The counter is really in the TLS server (read over its plain port).
    let keys = common::redis::redis_cli(
        redis.server.port,
        &["KEYS", &format!("{}*", options.key_prefix)],
    );
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 1, "{keys}");
    server.stop().await;
}

fn path(redis: &TlsRedis, name: &str) -> String {
    redis.dir.path().join(name).display().to_string()
}

#[tokio::test]
async fn a_wrong_password_over_tls_is_clear_and_does_not_leak() {
    let redis = tls_redis();
    let url = format!("rediss://127.0.0.1:{}", redis.tls_port);
    let wrong = "tls-wrong-secret";
    let error = connect_error(&options(
        url.clone(),
        Some(&format!("{USER}:{wrong}")),
        files(redis.dir.path(), true),
    ))
    .await;
    assert!(error.contains("authentication failed"), "{error}");
    assert!(!error.contains(wrong), "the password leaked: {error}");
    // In the URL, too.
    let in_url = format!("rediss://{USER}:{wrong}@127.0.0.1:{}", redis.tls_port);
    let error = connect_error(&options(in_url, None, files(redis.dir.path(), true))).await;
    assert!(error.contains("authentication failed"), "{error}");
    assert!(!error.contains(wrong), "the password leaked: {error}");
    // And the right one, in the URL, works.
    let right = format!("rediss://{USER}:{PASSWORD}@127.0.0.1:{}", redis.tls_port);
    RedisStore::connect(&options(right, None, files(redis.dir.path(), true)))
        .await
        .expect("right credentials");
}

#[tokio::test]
async fn tls_failures_stop_the_start_with_a_reason() {
    let redis = tls_redis();
    let url = format!("rediss://127.0.0.1:{}", redis.tls_port);
    let auth = format!("{USER}:{PASSWORD}");
    // No client certificate: this server requires one.
    let error = connect_error(&options(
        url.clone(),
        Some(&auth),
        files(redis.dir.path(), false),
    ))
    .await;
    assert!(
        error.contains(&format!("127.0.0.1:{}", redis.tls_port)),
        "{error}"
    );
    assert!(!error.contains(PASSWORD), "{error}");
    // The built-in web roots do not know our CA.
    let error = connect_error(&options(url.clone(), Some(&auth), RedisTls::default())).await;
    assert!(!error.contains(PASSWORD), "{error}");
    // A missing CA file is named.
    let missing = RedisTls {
        ca_cert: Some(redis.dir.path().join("absent.crt")),
        ..RedisTls::default()
    };
    let error = connect_error(&options(url, Some(&auth), missing)).await;
    assert!(error.contains("absent.crt"), "{error}");
    // Plain text on the TLS port gets nowhere either.
    let plain = format!("redis://127.0.0.1:{}", redis.tls_port);
    let _ = connect_error(&options(plain, Some(&auth), RedisTls::default())).await;
}
