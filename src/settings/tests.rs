//! Unit tests of settings resolution: defaults, environment, flags winning, Redis.

use super::*;
use crate::store::memory::DEFAULT_MAX_BYTES;
use crate::store::redis::connect::{RedisOptions, RedisTarget};
use std::collections::HashMap;
use std::path::PathBuf;

fn resolve(flags: ServeFlags, vars: &[(&str, &str)]) -> Result<ServeSettings, Error> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ServeSettings::resolve(&flags, &|name| map.get(name).cloned())
}

fn files(s: &ServeSettings) -> &FileSettings {
    s.source.files().expect("limits from files")
}

fn redis_of(s: ServeSettings) -> RedisOptions {
    s.backend.redis().cloned().expect("Redis")
}

/// Whether health follows Redis, for settings that name one.
fn health_checks_redis(s: &ServeSettings) -> bool {
    assert!(s.backend.redis().is_some(), "{:?}", s.backend);
    s.backend.probed()
}

#[test]
fn defaults_match_envoyproxy_ratelimit() {
    let s = resolve(ServeFlags::default(), &[]).unwrap();
    assert_eq!(files(&s).path, PathBuf::from("config"));
    assert_eq!(s.grpc_addr, "0.0.0.0:8081".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert!(!s.shadow_mode);
    assert_eq!(s.drain, Duration::from_secs(5));
    assert!(files(&s).watch);
    assert!(
        files(&s).watch_anchors.is_empty(),
        "no RUNTIME_ROOT, nothing more to watch"
    );
    assert_eq!(
        s.backend,
        Backend::Memory {
            max_bytes: DEFAULT_MAX_BYTES
        }
    );
    assert!(!s.backend.probed(), "the memory store always answers");
    let s = resolve(ServeFlags::default(), &[("REDIS_URL", "h:1")]).unwrap();
    assert!(health_checks_redis(&s));
}

#[test]
fn runtime_watch_root_and_app_directory() {
    let s = resolve(
        ServeFlags::default(),
        &[
            ("RUNTIME_ROOT", "/srv/current"),
            ("RUNTIME_APPDIRECTORY", "rl"),
        ],
    )
    .unwrap();
    assert_eq!(files(&s).path, PathBuf::from("/srv/current/rl"));
    assert_eq!(files(&s).watch_anchors, vec![PathBuf::from("/srv/current")]);
    let s = resolve(
        ServeFlags::default(),
        &[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("REDIS_URL", "h:1"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false"),
        ],
    )
    .unwrap();
    assert_eq!(files(&s).path, PathBuf::from("/data/ratelimit/config"));
    assert!(files(&s).watch_anchors.is_empty());
    assert!(files(&s).ignore_dotfiles);
    assert!(!health_checks_redis(&s));
    let flags = ServeFlags {
        config: Some("mine".into()),
        drain_seconds: Some(0.5),
        no_watch: true,
        health_check_redis: Some(true),
        ..Default::default()
    };
    let s = resolve(
        flags,
        &[
            ("RUNTIME_ROOT", "/x"),
            ("REDIS_URL", "h:1"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false"),
        ],
    )
    .unwrap();
    assert!(
        files(&s).watch_anchors.is_empty(),
        "--config: RUNTIME_ROOT is not used"
    );
    assert_eq!(s.drain, Duration::from_millis(500));
    assert!(!files(&s).watch);
    assert!(health_checks_redis(&s), "the flag wins");
    let err = resolve(
        ServeFlags {
            drain_seconds: Some(-1.0),
            ..Default::default()
        },
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("--drain-seconds"), "{err}");
    let err = resolve(
        ServeFlags::default(),
        &[("RUNTIME_WATCH_ROOT", "sometimes")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("RUNTIME_WATCH_ROOT"), "{err}");
}

#[test]
fn environment_applies_when_flags_are_absent() {
    let vars = [
        ("RUNTIME_ROOT", "/srv/runtime_data/current"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "9001"),
        ("PORT", "9002"),
        ("SHADOW_MODE", "true"),
    ];
    let s = resolve(ServeFlags::default(), &vars).unwrap();
    assert_eq!(
        files(&s).path,
        PathBuf::from("/srv/runtime_data/current/ratelimit/config")
    );
    assert_eq!(s.grpc_addr, "127.0.0.1:9001".parse().unwrap());
    assert_eq!(s.http_addr, "0.0.0.0:9002".parse().unwrap());
    assert!(s.shadow_mode);
}

#[test]
fn flags_win_over_environment() {
    let flags = ServeFlags {
        config: Some("mine".into()),
        grpc_addr: Some("127.0.0.1:1".into()),
        http_addr: Some("127.0.0.1:2".into()),
        ..Default::default()
    };
    let s = resolve(
        flags,
        &[("RUNTIME_ROOT", "/x"), ("GRPC_PORT", "9"), ("PORT", "8")],
    )
    .unwrap();
    assert_eq!(files(&s).path, PathBuf::from("mine"));
    assert_eq!(s.grpc_addr.port(), 1);
    assert_eq!(s.http_addr.port(), 2);
}

#[test]
fn redis_from_environment() {
    assert_eq!(
        resolve(ServeFlags::default(), &[]).unwrap().backend.redis(),
        None
    );
    let s = resolve(
        ServeFlags::default(),
        &[("REDIS_URL", "localhost:6379"), ("REDIS_AUTH", "user:pw")],
    )
    .unwrap();
    let redis = redis_of(s);
    assert_eq!(
        redis.target,
        RedisTarget::Standalone("redis://localhost:6379".into())
    );
    assert_eq!(redis.auth.as_deref(), Some("user:pw"));
    assert!(
        !format!("{redis:?}").contains("pw"),
        "credentials never reach Debug output"
    );
    let s = resolve(
        ServeFlags::default(),
        &[
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", "a:1, b:2"),
            ("REDIS_TLS", "true"),
            ("CACHE_KEY_PREFIX", "rl:"),
        ],
    )
    .unwrap();
    let redis = redis_of(s);
    assert_eq!(
        redis.target,
        RedisTarget::Cluster(vec!["rediss://a:1".into(), "rediss://b:2".into()])
    );
    assert_eq!(redis.key_prefix, "rl:");
}

#[test]
fn redis_flags_win_and_are_checked() {
    let flags = ServeFlags {
        redis: RedisFlags {
            redis_cluster: Some("127.0.0.1:7000".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let s = resolve(flags, &[("REDIS_URL", "elsewhere:1")]).unwrap();
    assert_eq!(
        redis_of(s).target,
        RedisTarget::Cluster(vec!["redis://127.0.0.1:7000".into()])
    );
    let both = ServeFlags {
        redis: RedisFlags {
            redis_url: Some("redis://a".into()),
            redis_cluster: Some("b:1".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(resolve(both, &[]).is_err());
    let err = resolve(
        ServeFlags::default(),
        &[("REDIS_URL", "a:1"), ("CACHE_KEY_PREFIX", "{x}")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("hash tag"), "{err}");
    let err = resolve(
        ServeFlags::default(),
        &[("REDIS_URL", "a:1"), ("REDIS_TYPE", "memcache")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("REDIS_TYPE"), "{err}");
}

#[test]
fn bad_values_are_named() {
    let err = resolve(ServeFlags::default(), &[("SHADOW_MODE", "maybe")]).unwrap_err();
    assert!(err.to_string().contains("SHADOW_MODE"), "{err}");
    let err = resolve(ServeFlags::default(), &[("GRPC_PORT", "notaport")]).unwrap_err();
    assert!(err.to_string().contains("GRPC_HOST:GRPC_PORT"), "{err}");
}

/// Checked on the memory store too (no REDIS_URL): a typo stops the process wherever
/// the counters live, as it did before the backend settings moved.
#[test]
fn a_bad_redis_health_check_is_refused_on_the_memory_store_too() {
    let vars = [("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "maybe")];
    let err = resolve(ServeFlags::default(), &vars).unwrap_err();
    assert!(
        err.to_string()
            .contains("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"),
        "{err}"
    );
}

#[test]
fn settings_that_cannot_be_honoured_are_refused_and_ignored_ones_listed() {
    let err = resolve(ServeFlags::default(), &[("CONFIG_TYPE", "GRPC_XDS_DELTA")]).unwrap_err();
    assert!(
        err.to_string().starts_with("CONFIG_TYPE=GRPC_XDS_DELTA"),
        "{err}"
    );
    let err = resolve(ServeFlags::default(), &[("GRPC_UDS", "/run/rl.sock")]).unwrap_err();
    assert!(err.to_string().starts_with("GRPC_UDS="), "{err}");
    // Together: both named, one line each.
    let both = [
        ("GRPC_UDS", "/run/rl.sock"),
        ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
    ];
    let err = resolve(ServeFlags::default(), &both)
        .unwrap_err()
        .to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(lines[0].starts_with("GRPC_UDS="), "{err}");
    assert!(lines[1].starts_with("CONFIG_TYPE=GRPC_XDS_DELTA"), "{err}");
    let err = resolve(ServeFlags::default(), &[("GRPC_SERVER_USE_TLS", "true")]).unwrap_err();
    assert!(err.to_string().contains("TLS"), "{err}");
    let s = resolve(
        ServeFlags::default(),
        &[
            ("CONFIG_TYPE", "FILE"),
            ("USE_STATSD", "false"),
            ("STATSD_PORT", "8125"),
        ],
    )
    .unwrap();
    let names: Vec<&str> = s.ignored.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["USE_STATSD", "STATSD_PORT"]);
}

#[test]
fn config_views_move_to_the_debug_port_only_when_asked() {
    let s = resolve(ServeFlags::default(), &[]).unwrap();
    assert_eq!(s.debug_addr, None, "off unless asked");
    let s = resolve(ServeFlags::default(), &[("DEBUG_PORT", "6070")]).unwrap();
    assert_eq!(s.debug_addr, Some("0.0.0.0:6070".parse().unwrap()));
    let s = resolve(
        ServeFlags::default(),
        &[("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "7000")],
    )
    .unwrap();
    assert_eq!(s.debug_addr, Some("127.0.0.1:7000".parse().unwrap()));
    let flags = ServeFlags {
        debug_addr: Some("127.0.0.1:6071".into()),
        ..ServeFlags::default()
    };
    let s = resolve(flags, &[("DEBUG_PORT", "7000")]).unwrap();
    assert_eq!(
        s.debug_addr,
        Some("127.0.0.1:6071".parse().unwrap()),
        "the flag wins"
    );
    let err = resolve(ServeFlags::default(), &[("DEBUG_PORT", "nope")]).unwrap_err();
    assert!(err.to_string().contains("DEBUG_PORT"), "{err}");
}

#[test]
fn limits_over_xds_replace_the_config_path() {
    let s = resolve(ServeFlags::default(), &[]).unwrap();
    assert!(s.source.files().is_some(), "files unless asked");
    let s = resolve(
        ServeFlags::default(),
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ],
    )
    .unwrap();
    let SourceSettings::Xds(xds) = s.source else {
        panic!("xDS asked for: {:?}", s.source);
    };
    assert_eq!(xds.node_id, "envoy-ratelimit");
    assert!(xds.force_start_without_initial_config);
    assert!(s.ignored.is_empty(), "{:?}", s.ignored);
}

/// `--help` states the Redis budget's default (clap cannot read it from the constant).
#[test]
fn help_names_the_redis_timeout_default() {
    use clap::CommandFactory;
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        flags: ServeFlags,
    }
    let help = Serve::command().render_long_help().to_string();
    let line = help
        .lines()
        .skip_while(|l| !l.contains("--redis-timeout-ms"))
        .take(3)
        .collect::<String>();
    assert!(
        line.contains(&format!("[default: {DEFAULT_REDIS_TIMEOUT_MS}]")),
        "{line}"
    );
}
