//! `tollgate migrate-check`: for an environment (a file or the process's) and a
//! config, every difference from envoyproxy/ratelimit is named and the exit code says
//! whether there is any (0 none, 1 some, 2 unreadable environment file).

use crate::common;

use std::fs;

use common::process::{run, text, tollgate};

const LIMITED: &str = "domain: shop\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n";

fn migrate_check(env: &str, config: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("env");
    fs::write(&env_file, env).unwrap();
    let config_dir = dir.path().join("config");
    fs::create_dir(&config_dir).unwrap();
    fs::write(config_dir.join("shop.yaml"), config).unwrap();
    let out = run(tollgate()
        .args(["migrate-check", "--env-file"])
        .arg(&env_file)
        .arg(&config_dir));
    (out.status.code(), text(&out.stdout) + &text(&out.stderr))
}

/// One difference no setting removes: the counters start over at the switch.
#[test]
fn an_environment_that_asks_for_tollgate_behaviour_differs_only_in_fresh_counters() {
    let env = "USE_STATSD=false\nREDIS_URL=redis://127.0.0.1:6379\n\
               STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true\n\
               REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true\n";
    let config = format!("{LIMITED}failure_mode: error\n");
    let (code, out) = migrate_check(env, &config);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("switch: tollgate's Redis keys are its own") && out.contains("domains shop"),
        "{out}"
    );
    assert!(out.contains("1 difference(s)"), "{out}");
}

#[test]
fn health_following_redis_is_named_unless_asked_for() {
    let env = "USE_STATSD=false\nREDIS_URL=redis://127.0.0.1:6379\n";
    let unlimited =
        "domain: shop\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n";
    let (code, out) = migrate_check(env, unlimited);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("health: an unreachable Redis"), "{out}");
    assert!(out.contains("1 difference(s)"), "{out}");
}

/// The environment's differences do not depend on the config loading.
#[test]
fn health_following_redis_is_named_when_the_config_does_not_load() {
    let env = "USE_STATSD=false\nREDIS_URL=redis://127.0.0.1:6379\n";
    let (code, out) = migrate_check(env, "domain: shop\nnonsense: 1\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("health: an unreachable Redis"), "{out}");
    assert!(out.contains("config: "), "{out}");
}

#[test]
fn refused_and_ignored_settings_and_documented_differences_are_each_named() {
    let env = "GRPC_UDS=/run/rl.sock\nUSE_STATSD=true\nMERGE_DOMAIN_CONFIG=true\n";
    let (code, out) = migrate_check(env, LIMITED);
    assert_eq!(code, Some(1), "{out}");
    for expected in [
        "setting GRPC_UDS=/run/rl.sock: gRPC on a Unix socket is not supported (serve refuses to start)",
        "setting USE_STATSD=true is ignored: statsd is not supported",
        "setting MERGE_DOMAIN_CONFIG=true is ignored",
        "backend: REDIS_URL is unset",
        "behaviour: a denied request consumes nothing",
        "domains shop",
        "5 difference(s)",
    ] {
        assert!(out.contains(expected), "missing '{expected}':\n{out}");
    }
}

#[test]
fn every_refused_setting_is_named() {
    let env = "GRPC_UDS=/run/rl.sock\nCONFIG_TYPE=GRPC_XDS_DELTA\nUSE_STATSD=false\n";
    let (code, out) = migrate_check(env, LIMITED);
    assert_eq!(code, Some(1), "{out}");
    for expected in [
        "setting GRPC_UDS=/run/rl.sock: gRPC on a Unix socket is not supported (serve refuses to start)",
        "setting CONFIG_TYPE=GRPC_XDS_DELTA: expected FILE or GRPC_XDS_SOTW (serve refuses to start)",
    ] {
        assert!(out.contains(expected), "missing '{expected}':\n{out}");
    }
}

#[test]
fn fail_open_applies_only_with_redis_and_limited_domains() {
    let env = "USE_STATSD=false\nREDIS_URL=redis://127.0.0.1:6379\n\
               STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true\n\
               REDIS_HEALTH_CHECK_ACTIVE_CONNECTION=true\n";
    let (code, out) = migrate_check(env, LIMITED);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("behaviour: on a Redis error tollgate answers OK"),
        "{out}"
    );
    let unlimited =
        "domain: shop\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n";
    let (code, out) = migrate_check(env, unlimited);
    assert_eq!(
        code,
        Some(0),
        "nothing is limited, nothing fails open: {out}"
    );
}

#[test]
fn a_config_that_does_not_load_is_a_difference_with_its_errors() {
    let (code, out) = migrate_check("USE_STATSD=false\n", "domain: shop\nbogus: 1\n");
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("config: ") && out.contains("shop.yaml:2"),
        "{out}"
    );
}

#[test]
fn the_process_environment_is_read_without_an_env_file() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("shop.yaml"), LIMITED).unwrap();
    let out = run(tollgate()
        .env_clear()
        .env("REDIS_PERSECOND", "true")
        .arg("migrate-check")
        .arg(dir.path()));
    let all = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{all}{}", text(&out.stderr));
    assert!(
        all.contains("setting REDIS_PERSECOND=true is ignored"),
        "{all}"
    );
    assert!(all.contains("upstream sends statsd by default"), "{all}");
}

#[test]
fn an_unreadable_env_file_exits_2() {
    let out = run(tollgate().args(["migrate-check", "--env-file", "/nonexistent/env", "config"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/env"));
}
