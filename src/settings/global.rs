//! Global rules' settings (docs/global.md): which region this is (`--region`), where
//! the ledger is (`--global-ledger` for one Redis, `--global-ledger-cluster` for a
//! cluster; `rediss://` for TLS with the CA and client files of its own flags,
//! `user:password@` in the URL or `TOLLGATE_GLOBAL_LEDGER_AUTH` for ACL), and the
//! timing. Each flag also has a `TOLLGATE_` variable; without a ledger, global rules
//! are decided as local ones (the whole limit in each region).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::Error;
use crate::global::{self, GlobalOptions};
use crate::store::redis::connect::{RedisOptions, RedisTarget, RedisTls};

/// `tollgate serve`'s global-rule flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalFlags {
    /// This region's name, the same on every replica of the region, distinct between regions (letters, digits, '-', '_', '.'; at most 64) [default: $TOLLGATE_REGION]
    #[arg(long, value_name = "NAME")]
    pub region: Option<String>,
    /// The global ledger, one Redis every region reaches: redis://[user:pass@]host:port/db, rediss:// for TLS; global rules divide their limits between regions through it [default: $TOLLGATE_GLOBAL_LEDGER]
    #[arg(long, value_name = "URL")]
    pub global_ledger: Option<String>,
    /// The global ledger on a Redis Cluster: seed nodes host:port,host:port,... or URLs (all its records share one slot) [default: $TOLLGATE_GLOBAL_LEDGER_CLUSTER]
    #[arg(long, value_name = "NODES")]
    pub global_ledger_cluster: Option<String>,
    /// The ledger over TLS: CA certificates to trust (PEM) instead of the web roots [default: $TOLLGATE_GLOBAL_LEDGER_TLS_CACERT]
    #[arg(long, value_name = "PEM")]
    pub global_ledger_tls_ca_cert: Option<PathBuf>,
    /// The ledger over TLS: client certificate (PEM) [default: $TOLLGATE_GLOBAL_LEDGER_TLS_CLIENT_CERT]
    #[arg(long, value_name = "PEM")]
    pub global_ledger_tls_client_cert: Option<PathBuf>,
    /// The ledger over TLS: client key (PEM) [default: $TOLLGATE_GLOBAL_LEDGER_TLS_CLIENT_KEY]
    #[arg(long, value_name = "PEM")]
    pub global_ledger_tls_client_key: Option<PathBuf>,
    /// Prefix of every ledger key (several deployments on one ledger) [default: $TOLLGATE_GLOBAL_LEDGER_PREFIX, else none]
    #[arg(long, value_name = "PREFIX")]
    pub global_ledger_prefix: Option<String>,
    /// How often each global counter is reported to the ledger and re-divided, in milliseconds [default: 2000]
    #[arg(long, value_name = "MS")]
    pub global_report_ms: Option<u64>,
    /// The clock skew allowed between a host and its region's Redis, in milliseconds: this close to a window's boundary a request takes the smaller of the two windows' shares [default: 250]
    #[arg(long, value_name = "MS")]
    pub global_clock_skew_ms: Option<u64>,
    /// Global counters (rule and descriptor values) one replica keeps shares of; past it the least recently used is forgotten [default: 10000]
    #[arg(long, value_name = "N")]
    pub global_max_counters: Option<u64>,
}

/// Everything global rules need, once a ledger is named.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalSettings {
    pub options: GlobalOptions,
    pub ledger: RedisOptions,
}

/// The longest a report period may be: a share must reach a region before its
/// window starts, and a minute's window is granted a window ahead.
const MAX_REPORT_MS: u64 = 60_000;

/// Where the ledger is: its Redis options and key prefix, or `None` when none is
/// named (`tollgate inspect` reads it with these alone).
pub fn ledger(
    flags: &GlobalFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(RedisOptions, String)>, Error> {
    let text = |flag: &Option<String>, name: &str| flag.clone().or_else(|| var(name));
    let single = text(&flags.global_ledger, "TOLLGATE_GLOBAL_LEDGER");
    let cluster = text(
        &flags.global_ledger_cluster,
        "TOLLGATE_GLOBAL_LEDGER_CLUSTER",
    );
    let target = match (single, cluster) {
        (Some(_), Some(_)) => {
            return Err(Error::Settings(
                "--global-ledger and --global-ledger-cluster exclude each other".into(),
            ));
        }
        (Some(url), None) => RedisTarget::Standalone(url_of(&url)),
        (None, Some(nodes)) => {
            let urls: Vec<String> = nodes
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(url_of)
                .collect();
            if urls.is_empty() {
                return Err(Error::Settings(
                    "--global-ledger-cluster: needs at least one seed node".into(),
                ));
            }
            RedisTarget::Cluster(urls)
        }
        (None, None) => return Ok(None),
    };
    let path =
        |flag: &Option<PathBuf>, name: &str| flag.clone().or_else(|| var(name).map(Into::into));
    let tls = RedisTls {
        ca_cert: path(
            &flags.global_ledger_tls_ca_cert,
            "TOLLGATE_GLOBAL_LEDGER_TLS_CACERT",
        ),
        client_cert: path(
            &flags.global_ledger_tls_client_cert,
            "TOLLGATE_GLOBAL_LEDGER_TLS_CLIENT_CERT",
        ),
        client_key: path(
            &flags.global_ledger_tls_client_key,
            "TOLLGATE_GLOBAL_LEDGER_TLS_CLIENT_KEY",
        ),
    };
    let uses_tls = match &target {
        RedisTarget::Standalone(url) => url.starts_with("rediss://"),
        RedisTarget::Cluster(urls) => urls.iter().any(|u| u.starts_with("rediss://")),
        RedisTarget::Sentinel { .. } => false,
    };
    if tls != RedisTls::default() && !uses_tls {
        return Err(Error::Settings(
            "--global-ledger-tls-* files need TLS: use rediss:// for the ledger".into(),
        ));
    }
    let prefix =
        text(&flags.global_ledger_prefix, "TOLLGATE_GLOBAL_LEDGER_PREFIX").unwrap_or_default();
    crate::store::redis::keys::check_prefix(&prefix)
        .map_err(|e| Error::Settings(format!("--global-ledger-prefix: {e}")))?;
    let options = RedisOptions {
        target,
        tls,
        auth: var("TOLLGATE_GLOBAL_LEDGER_AUTH"),
        key_prefix: String::new(),
        timeout: Duration::from_secs(2),
        connect_timeout: super::REDIS_CONNECT_TIMEOUT,
        // The ledger holds records, not counters: the layout of counters does not apply.
        state_layout: Default::default(),
    };
    Ok(Some((options, prefix)))
}

/// The settings, or `None` without a ledger.
pub fn resolve(
    flags: &GlobalFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<GlobalSettings>, Error> {
    let region = flags.region.clone().or_else(|| var("TOLLGATE_REGION"));
    let Some((mut ledger, prefix)) = ledger(flags, var)? else {
        if region.is_some() {
            return Err(Error::Settings(
                "--region names this region to a global ledger: give the ledger too \
                 (--global-ledger or --global-ledger-cluster)"
                    .into(),
            ));
        }
        return Ok(None);
    };
    let Some(region) = region else {
        return Err(Error::Settings(
            "--global-ledger needs --region: the name every replica of this region shares".into(),
        ));
    };
    check_region(&region)?;
    let report_ms = flags
        .global_report_ms
        .unwrap_or(u64::try_from(global::DEFAULT_REPORT_PERIOD.as_millis()).unwrap_or(2000));
    if !(100..=MAX_REPORT_MS).contains(&report_ms) {
        return Err(Error::Settings(format!(
            "--global-report-ms: {report_ms} is not between 100 and {MAX_REPORT_MS}"
        )));
    }
    let skew_ms = flags
        .global_clock_skew_ms
        .unwrap_or(u64::try_from(global::DEFAULT_SKEW.as_millis()).unwrap_or(250));
    if skew_ms > 10_000 {
        return Err(Error::Settings(format!(
            "--global-clock-skew-ms: {skew_ms} ms of skew is a broken clock, not a margin (at most 10000)"
        )));
    }
    let max_counters = flags
        .global_max_counters
        .unwrap_or(global::DEFAULT_MAX_COUNTERS);
    if max_counters == 0 {
        return Err(Error::Settings(
            "--global-max-counters must be at least 1".into(),
        ));
    }
    let report_period = Duration::from_millis(report_ms);
    // A call's budget: a report period, so a slow ledger delays the next sync by
    // at most one period.
    ledger.timeout = report_period.max(Duration::from_secs(1));
    Ok(Some(GlobalSettings {
        options: GlobalOptions {
            prefix,
            report_period,
            skew: Duration::from_millis(skew_ms),
            max_counters,
            ..GlobalOptions::for_region(&region)
        },
        ledger,
    }))
}

/// `host:port` as a URL; URLs as given.
fn url_of(address: &str) -> String {
    let address = address.trim();
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("redis://{address}")
    }
}

fn check_region(region: &str) -> Result<(), Error> {
    let fine = !region.is_empty()
        && region.len() <= 64
        && region
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if fine {
        Ok(())
    } else {
        Err(Error::Settings(format!(
            "--region: '{region}' is not a region name (letters, digits, '-', '_', '.'; 1 to 64)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve_with(
        flags: &GlobalFlags,
        pairs: &[(&str, &str)],
    ) -> Result<Option<GlobalSettings>, Error> {
        let pairs: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(flags, &|name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn no_ledger_no_global_settings_and_a_region_alone_is_a_mistake() {
        assert_eq!(resolve_with(&GlobalFlags::default(), &[]).unwrap(), None);
        let e = resolve_with(&GlobalFlags::default(), &[("TOLLGATE_REGION", "eu")]).unwrap_err();
        assert!(e.to_string().contains("give the ledger too"), "{e}");
    }

    #[test]
    fn a_ledger_needs_a_region_with_a_proper_name() {
        let flags = GlobalFlags {
            global_ledger: Some("ledger:6379".into()),
            ..GlobalFlags::default()
        };
        assert!(
            resolve_with(&flags, &[])
                .unwrap_err()
                .to_string()
                .contains("needs --region")
        );
        let bad = resolve_with(&flags, &[("TOLLGATE_REGION", "eu west")]).unwrap_err();
        assert!(bad.to_string().contains("not a region name"), "{bad}");
        let ok = resolve_with(&flags, &[("TOLLGATE_REGION", "eu-west-1")])
            .unwrap()
            .unwrap();
        assert_eq!(ok.options.region, "eu-west-1");
        assert!(ok.options.replica.starts_with("eu-west-1/"));
        assert_eq!(
            ok.ledger.target,
            RedisTarget::Standalone("redis://ledger:6379".into())
        );
    }

    #[test]
    fn cluster_tls_and_timing_are_checked() {
        let flags = GlobalFlags {
            region: Some("us".into()),
            global_ledger_cluster: Some("a:1, b:2".into()),
            global_ledger_tls_ca_cert: Some("/ca.pem".into()),
            ..GlobalFlags::default()
        };
        let e = resolve_with(&flags, &[]).unwrap_err();
        assert!(e.to_string().contains("rediss://"), "{e}");
        let flags = GlobalFlags {
            global_ledger_cluster: Some("rediss://a:1,rediss://b:2".into()),
            global_report_ms: Some(50),
            ..flags
        };
        let e = resolve_with(&flags, &[]).unwrap_err();
        assert!(e.to_string().contains("--global-report-ms"), "{e}");
        let flags = GlobalFlags {
            global_report_ms: Some(500),
            ..flags
        };
        let ok = resolve_with(&flags, &[("TOLLGATE_GLOBAL_LEDGER_AUTH", "app:pw")])
            .unwrap()
            .unwrap();
        assert_eq!(ok.options.report_period, Duration::from_millis(500));
        assert_eq!(ok.ledger.auth.as_deref(), Some("app:pw"));
        assert!(matches!(ok.ledger.target, RedisTarget::Cluster(ref u) if u.len() == 2));
    }
}
