//! Settings of the xDS config source (`CONFIG_TYPE=GRPC_XDS_SOTW`, which
//! [`super::source`] reads), with envoyproxy/ratelimit's names and defaults:
//! `CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*` and `FORCE_START_WITHOUT_INITIAL_CONFIG`. Only
//! values are resolved here; `crate::xds` reads the certificate files when it dials.

use std::path::PathBuf;
use std::time::Duration;

use super::env::env_bool;
use crate::error::Error;

/// upstream's `CONFIG_GRPC_XDS_NODE_ID` default.
pub const DEFAULT_NODE_ID: &str = "default";
pub const DEFAULT_SERVER_URL: &str = "localhost:18000";
pub const DEFAULT_CONNECT_RETRY_INTERVAL: Duration = Duration::from_secs(3);
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(60);
pub const DEFAULT_BACKOFF_RANDOM_FACTOR: f64 = 0.5;
/// The longest wait accepted between attempts: a longer one would leave a replica
/// without its control plane for good, and far longer ones overflow the arithmetic.
pub const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(3600);

/// Where limits come from when `CONFIG_TYPE=GRPC_XDS_SOTW`.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsSettings {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port` (a scheme is accepted too).
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID`: the control plane serves by it (Envoy Gateway answers
    /// `envoy-ratelimit` only).
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`: `key=value,key=value`, string values.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL`: between attempts to reach a
    /// control plane that cannot be dialled (jittered by half, as upstream's).
    pub connect_retry_interval: Duration,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: `key:value,key:value`, sent as gRPC
    /// metadata on the stream.
    pub additional_headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files; `None`: plain text.
    pub tls: Option<XdsTls>,
    /// `XDS_CLIENT_BACKOFF_*`: waiting after a stream that broke.
    pub backoff: Backoff,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`: the largest response accepted (else gRPC's 4 MiB).
    pub max_message_bytes: Option<usize>,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`: serve at once with no domains instead of
    /// NOT_SERVING until the first config arrives.
    pub force_start_without_initial_config: bool,
}

/// TLS to the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT` and `_KEY`: our certificate, for mTLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: the CA the server's certificate must chain
    /// to; none: the public web roots.
    pub server_ca: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name checked in the server's certificate
    /// instead of the URL's host.
    pub server_san: Option<String>,
}

/// Jittered exponential backoff: `initial`, doubling up to `max`, each wait spread by
/// ±`random_factor` when `jitter`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub random_factor: f64,
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: DEFAULT_BACKOFF_INITIAL,
            max: DEFAULT_BACKOFF_MAX,
            random_factor: DEFAULT_BACKOFF_RANDOM_FACTOR,
            jitter: true,
        }
    }
}

/// The xDS source's settings (`CONFIG_TYPE=GRPC_XDS_SOTW`, which `source.rs` read).
pub(super) fn resolve(var: &dyn Fn(&str) -> Option<String>) -> Result<XdsSettings, Error> {
    Ok(XdsSettings {
        server_url: var("CONFIG_GRPC_XDS_SERVER_URL").unwrap_or_else(|| DEFAULT_SERVER_URL.into()),
        node_id: var("CONFIG_GRPC_XDS_NODE_ID").unwrap_or_else(|| DEFAULT_NODE_ID.into()),
        // upstream skips entries without '=' silently; so do we.
        node_metadata: pairs(var("CONFIG_GRPC_XDS_NODE_METADATA"), '='),
        connect_retry_interval: retry_wait(
            var,
            "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
            DEFAULT_CONNECT_RETRY_INTERVAL,
        )?,
        additional_headers: headers(var("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"))?,
        tls: tls(var)?,
        backoff: backoff(var)?,
        max_message_bytes: max_message_bytes(var)?,
        force_start_without_initial_config: env_bool(
            var,
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            false,
        )?,
    })
}

fn setting(name: &str, what: String) -> Error {
    Error::Settings(format!("{name}: {what}"))
}

/// A wait between attempts, as a Go duration: zero would retry in a busy loop, and
/// beyond [`MAX_RETRY_INTERVAL`] a replica would be without its control plane for good.
fn retry_wait(
    var: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: Duration,
) -> Result<Duration, Error> {
    let Some(v) = var(name) else {
        return Ok(default);
    };
    match go_duration(&v) {
        None => Err(setting(
            name,
            format!("'{v}' is not a duration (such as 500ms, 3s, 1m30s)"),
        )),
        Some(d) if d.is_zero() => Err(setting(name, format!("'{v}': must be above zero"))),
        Some(d) if d > MAX_RETRY_INTERVAL => Err(setting(
            name,
            format!("'{v}': must be at most {}s", MAX_RETRY_INTERVAL.as_secs()),
        )),
        Some(d) => Ok(d),
    }
}

/// `XDS_CLIENT_BACKOFF_*`.
fn backoff(var: &dyn Fn(&str) -> Option<String>) -> Result<Backoff, Error> {
    let random_factor = match var("XDS_CLIENT_BACKOFF_RANDOM_FACTOR") {
        None => DEFAULT_BACKOFF_RANDOM_FACTOR,
        Some(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| (0.0..=1.0).contains(f))
            .ok_or_else(|| {
                setting(
                    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
                    format!("'{v}' is not a number between 0 and 1"),
                )
            })?,
    };
    Ok(Backoff {
        initial: retry_wait(
            var,
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
            DEFAULT_BACKOFF_INITIAL,
        )?,
        max: retry_wait(var, "XDS_CLIENT_BACKOFF_MAX_INTERVAL", DEFAULT_BACKOFF_MAX)?,
        random_factor,
        jitter: env_bool(var, "XDS_CLIENT_BACKOFF_JITTER", true)?,
    })
}

/// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES`; upstream's 0 keeps gRPC's default.
fn max_message_bytes(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<usize>, Error> {
    let Some(v) = var("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES") else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(setting(
            "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
            format!("'{v}' is not a byte count"),
        )),
    }
}

/// `CONFIG_GRPC_XDS_SERVER_USE_TLS` and its files.
fn tls(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<XdsTls>, Error> {
    if !env_bool(var, "CONFIG_GRPC_XDS_SERVER_USE_TLS", false)? {
        return Ok(None);
    }
    let tls = XdsTls {
        client_cert: var("CONFIG_GRPC_XDS_CLIENT_TLS_CERT").map(PathBuf::from),
        client_key: var("CONFIG_GRPC_XDS_CLIENT_TLS_KEY").map(PathBuf::from),
        server_ca: var("CONFIG_GRPC_XDS_SERVER_TLS_CACERT").map(PathBuf::from),
        server_san: var("CONFIG_GRPC_XDS_SERVER_TLS_SAN"),
    };
    if tls.client_cert.is_some() != tls.client_key.is_some() {
        return Err(Error::Settings(
            "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together".into(),
        ));
    }
    Ok(Some(tls))
}

/// `k<sep>v,k<sep>v`, entries without the separator skipped.
fn pairs(text: Option<String>, separator: char) -> Vec<(String, String)> {
    text.unwrap_or_default()
        .split(',')
        .filter_map(|entry| entry.split_once(separator))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// envconfig's map syntax (`k:v,k:v`); it refuses an entry without `:`, and so do we.
/// gRPC metadata keys are lowercase ASCII, so they are lowered here.
fn headers(text: Option<String>) -> Result<Vec<(String, String)>, Error> {
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    text.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let (k, v) = entry.split_once(':').ok_or_else(|| {
                Error::Settings(format!(
                    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: '{entry}' is not key:value"
                ))
            })?;
            Ok((k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        })
        .collect()
}

/// Go's `time.ParseDuration` (what upstream's envconfig reads durations with): one or
/// more `<number><unit>` with units ns, us, µs, ms, s, m, h; `0` alone is zero.
pub fn go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0.0_f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds_per;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(vars: &[(&str, &str)]) -> Result<XdsSettings, Error> {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        resolve(&|name| map.get(name).map(|v| (*v).to_owned()))
    }

    #[test]
    fn upstream_defaults() {
        let s = resolve_with(&[]).unwrap();
        assert_eq!(s.server_url, "localhost:18000");
        assert_eq!(s.node_id, "default");
        assert_eq!(s.connect_retry_interval, Duration::from_secs(3));
        assert_eq!(s.backoff, Backoff::default());
        assert_eq!(s.tls, None);
        assert_eq!(s.max_message_bytes, None);
        assert!(!s.force_start_without_initial_config);
    }

    #[test]
    fn envoy_gateway_environment() {
        let s = resolve_with(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,bad,team=rl"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "X-Tenant:t1,auth:Bearer x",
            ),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "250ms"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "8388608"),
        ])
        .unwrap();
        assert_eq!(s.node_id, "envoy-ratelimit");
        let tls = s.tls.unwrap();
        assert_eq!(tls.server_ca, Some(PathBuf::from("/certs/ca.crt")));
        assert_eq!(tls.server_san, None);
        assert!(s.force_start_without_initial_config);
        assert_eq!(
            s.node_metadata,
            [("zone".into(), "a".into()), ("team".into(), "rl".into())]
        );
        assert_eq!(
            s.additional_headers,
            [
                ("x-tenant".into(), "t1".into()),
                ("auth".into(), "Bearer x".into())
            ]
        );
        assert_eq!(s.backoff.initial, Duration::from_millis(250));
        assert_eq!(s.max_message_bytes, Some(8 << 20));
    }

    #[test]
    fn bad_values_are_named() {
        for (name, value) in [
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "10000000000000000000s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "61m"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "0s"),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "0"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "maybe"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "novalue"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1"),
        ] {
            let err = resolve_with(&[(name, value)]).unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("3"), None, "Go wants a unit");
        assert_eq!(go_duration(""), None);
        assert_eq!(go_duration("5 parsecs"), None);
    }
}
