//! envoyproxy/ratelimit's settings that tollgate does not read, each with the reason,
//! and those it refuses because ignoring them would serve something other than what
//! the deployment asked for (a Unix socket served as TCP, counters in memcached).
//! `CONFIG_TYPE` and `FORCE_START_WITHOUT_INITIAL_CONFIG` are read by `xds.rs`. docs/migration.md's settings table says the same; a unit test
//! keeps this list and the code that reads variables from overlapping.

/// Set but without effect: `serve` logs each one found, with its reason, at start-up.
pub const IGNORED: &[(&str, &str)] = &[
    (
        "USE_STATSD",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "STATSD_HOST",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "STATSD_PORT",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "USE_DOG_STATSD",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "EXTRA_TAGS",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "STATS_FLUSH_INTERVAL",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "DISABLE_STATS",
        "statsd is not supported; scrape /metrics on the HTTP port (Prometheus) instead",
    ),
    (
        "PROMETHEUS_MAPPER_YAML",
        "upstream's default mapping is built in (ratelimit_service_rate_limit_* by domain, key1, key2); a mapping file is not read (see docs/metrics-and-logs.md)",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        "connections are not closed by age; an idle one closes after --idle-timeout-ms",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "connections are not closed by age; an idle one closes after --idle-timeout-ms",
    ),
    (
        "REDIS_POOL_SIZE",
        "one multiplexed connection per Redis node pipelines every call",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "there is no pool to run empty",
    ),
    ("REDIS_PIPELINE_WINDOW", "calls are pipelined as they come"),
    ("REDIS_PIPELINE_LIMIT", "calls are pipelined as they come"),
    (
        "REDIS_USE_EXPLICIT_PIPELINE",
        "calls are pipelined as they come",
    ),
    (
        "REDIS_TIMEOUT",
        "the budget is --redis-timeout-ms, per request (default 250 ms)",
    ),
    (
        "REDIS_PERSECOND",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_SOCKET_TYPE",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_TYPE",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_URL",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_POOL_SIZE",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_AUTH",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_TLS",
        "per-second limits are counted in the main Redis",
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        "per-second limits are counted in the main Redis",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "each key expires when its algorithm no longer needs it",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "always so: a denied request consumes nothing",
    ),
    (
        "MERGE_DOMAIN_CONFIG",
        "a domain defined in two files is an error that names both",
    ),
];

/// Refused when set to anything but the given harmless values (compared ignoring
/// ASCII case): (name, accepted values, why it is refused).
const REFUSED: &[(&str, &[&str], &str)] = &[
    (
        "BACKEND_TYPE",
        &["redis"],
        "counters live in Redis or, without REDIS_URL, in memory",
    ),
    ("MEMCACHE_HOST_PORT", &[], "memcached is not supported"),
    ("MEMCACHE_SRV", &[], "memcached is not supported"),
    ("GRPC_UDS", &[], "gRPC on a Unix socket is not supported"),
    (
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        &["false", "0", "f"],
        "Redis TLS always verifies the host name",
    ),
];

/// Every setting that asks for what tollgate cannot do, as error messages.
pub fn refused_all(var: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    REFUSED
        .iter()
        .filter_map(|(name, accepted, why)| {
            let value = var(name)?;
            let harmless = accepted
                .iter()
                .any(|a| a.eq_ignore_ascii_case(value.trim()));
            (!harmless).then(|| format!("{name}={value}: {why}"))
        })
        .collect()
}

/// Whether an ignored setting's value already asks for what tollgate does: an
/// "always so" setting set true, or a `USE_*` switch set false (turning off what
/// tollgate lacks).
pub fn agrees(name: &str, value: &str) -> bool {
    let reason = IGNORED.iter().find(|(n, _)| *n == name).map(|(_, r)| *r);
    match crate::settings::parse_bool(value) {
        Some(true) => reason.is_some_and(|r| r.starts_with("always so")),
        Some(false) => name.starts_with("USE_"),
        None => false,
    }
}

/// The ignored settings that are set, with their reasons, in list order.
pub fn ignored(var: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, &'static str)> {
    IGNORED
        .iter()
        .filter(|(name, _)| var(name).is_some())
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn harmless_values_pass_and_the_rest_is_refused() {
        let ok = vars(&[("CONFIG_TYPE", "GRPC_XDS_SOTW"), ("BACKEND_TYPE", "REDIS")]);
        assert_eq!(refused_all(&ok), Vec::<String>::new());
        let backend = vars(&[("BACKEND_TYPE", "memcache")]);
        let refused = refused_all(&backend);
        assert!(
            refused[0].starts_with("BACKEND_TYPE=memcache: "),
            "{refused:?}"
        );
        let all = vars(&[
            ("MEMCACHE_HOST_PORT", "m:11211"),
            ("GRPC_UDS", "/run/rl.sock"),
        ]);
        let refused = refused_all(&all);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused[0].contains("memcached"), "{refused:?}");
        assert!(
            refused[1].starts_with("GRPC_UDS=/run/rl.sock: "),
            "{refused:?}"
        );
    }

    #[test]
    fn ignored_settings_are_reported_with_reasons() {
        let set = vars(&[
            ("USE_STATSD", "false"),
            ("REDIS_POOL_SIZE", "10"),
            ("PORT", "8080"),
        ]);
        let names: Vec<&str> = ignored(&set).iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["USE_STATSD", "REDIS_POOL_SIZE"]);
    }

    /// A variable the code reads must not also be listed as ignored (or refused): when
    /// a feature lands, its settings leave these lists. Every listed name is in
    /// docs/migration.md's settings table.
    #[test]
    fn lists_agree_with_the_code_and_the_readme() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut sources = String::new();
        read_sources(&root.join("src"), &mut sources);
        let readme = std::fs::read_to_string(root.join("docs/migration.md")).unwrap();
        let names = IGNORED
            .iter()
            .map(|(n, _)| *n)
            .chain(REFUSED.iter().map(|(n, _, _)| *n));
        for name in names {
            let quoted = format!("\"{name}\"");
            assert_eq!(
                sources.matches(&quoted).count(),
                1,
                "{name} is read by the code, or listed twice: update settings/compat.rs"
            );
            assert!(
                readme.contains(&format!("`{name}`")),
                "docs/migration.md lacks {name}"
            );
        }
    }

    fn read_sources(dir: &Path, out: &mut String) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                read_sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                // migrate-check names upstream's variables to explain them, not to read them.
                && path
                    .file_name()
                    .is_some_and(|n| n != "tests.rs" && n != "migrate_check.rs")
            {
                // Test code may name any variable; only what runs counts.
                let text = std::fs::read_to_string(&path).unwrap();
                let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or("");
                out.push_str(code);
            }
        }
    }
}
