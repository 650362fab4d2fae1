//! Settings of what tollgate tells operators: Prometheus metrics (envoyproxy/ratelimit's
//! `USE_PROMETHEUS`, `NEAR_LIMIT_RATIO`, and `PROMETHEUS_ADDR` / `PROMETHEUS_PATH` for a
//! metrics listener of its own, as Envoy Gateway sets them) and OpenTelemetry traces
//! (its `TRACING_*` variables, and the standard `OTEL_*` ones an OpenTelemetry
//! deployment sets).

use std::net::{SocketAddr, ToSocketAddrs};

use super::flags::ServeFlags;
use super::parse_bool;
use crate::error::Error;
use crate::metrics::{DEFAULT_NEAR_LIMIT_RATIO, MetricNames, SeriesBounds};
use crate::telemetry::{OtlpProtocol, TracingSettings};

pub const DEFAULT_SERVICE_NAME: &str = "tollgate";
const GRPC_ENDPOINT: &str = "http://localhost:4317";
const HTTP_ENDPOINT: &str = "http://localhost:4318";
/// Appended to `OTEL_EXPORTER_OTLP_ENDPOINT` for http/protobuf, as the spec says.
const HTTP_TRACES_PATH: &str = "/v1/traces";
/// envoyproxy/ratelimit's `PROMETHEUS_PATH` default.
pub const DEFAULT_PROMETHEUS_PATH: &str = "/metrics";

/// `PROMETHEUS_ADDR`: the registry served on a listener of its own, as
/// envoyproxy/ratelimit's Prometheus sink does (Envoy Gateway scrapes `:19001`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusListener {
    pub addr: SocketAddr,
    /// `PROMETHEUS_PATH`, starting with `/`.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Observability {
    /// `GET /metrics` answers (`USE_PROMETHEUS=false` turns it off).
    pub metrics: bool,
    pub near_limit_ratio: f64,
    /// `--upstream-metric-names` (or `TOLLGATE_UPSTREAM_METRIC_NAMES=true`, or
    /// `PROMETHEUS_ADDR` unless that variable says false): also envoyproxy/ratelimit's
    /// Prometheus names.
    pub metric_names: MetricNames,
    /// The bound on series made from request values (`--metric-series-*`).
    pub series: SeriesBounds,
    /// `PROMETHEUS_ADDR` with metrics on: the same text on a second listener.
    pub prometheus: Option<PrometheusListener>,
    /// `None`: no traces.
    pub tracing: Option<TracingSettings>,
}

// The ratios are checked to be finite when resolved, so equality is total.
impl Eq for Observability {}

impl Default for Observability {
    fn default() -> Self {
        Self {
            metrics: true,
            near_limit_ratio: DEFAULT_NEAR_LIMIT_RATIO,
            metric_names: MetricNames::Tollgate,
            series: SeriesBounds::default(),
            prometheus: None,
            tracing: None,
        }
    }
}

pub fn resolve(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Observability, Error> {
    let boolean = |name: &str| -> Result<Option<bool>, Error> {
        var(name)
            .map(|v| {
                parse_bool(&v)
                    .ok_or_else(|| Error::Settings(format!("{name}: '{v}' is not a boolean")))
            })
            .transpose()
    };
    let metrics = boolean("USE_PROMETHEUS")?.unwrap_or(true);
    let near_limit_ratio = match var("NEAR_LIMIT_RATIO") {
        Some(v) => ratio("NEAR_LIMIT_RATIO", &v).and_then(|r| {
            if r > 0.0 {
                Ok(r)
            } else {
                Err(Error::Settings(format!(
                    "NEAR_LIMIT_RATIO: '{v}' must be above 0"
                )))
            }
        })?,
        None => DEFAULT_NEAR_LIMIT_RATIO,
    };
    // Opened whenever PROMETHEUS_ADDR is set, unless USE_PROMETHEUS=false. upstream
    // opens it only with USE_PROMETHEUS=true, which defaults to false there (and the
    // address to :9090); here metrics are on by default, so naming the address is
    // asking for the listener. Envoy Gateway sets both, which reads the same either way.
    let prometheus = match var("PROMETHEUS_ADDR") {
        Some(addr) if metrics => Some(PrometheusListener {
            addr: go_listen_address("PROMETHEUS_ADDR", &addr)?,
            path: prometheus_path(var("PROMETHEUS_PATH"))?,
        }),
        _ => None,
    };
    // Whoever sets PROMETHEUS_ADDR runs upstream's setup (Envoy Gateway does) and
    // scrapes upstream's names there; the variable can still say no.
    let upstream_names = flags.upstream_metric_names
        || boolean("TOLLGATE_UPSTREAM_METRIC_NAMES")?.unwrap_or(prometheus.is_some());
    Ok(Observability {
        metrics,
        near_limit_ratio,
        metric_names: if upstream_names {
            MetricNames::AlsoUpstream
        } else {
            MetricNames::Tollgate
        },
        series: series_bounds(flags, var)?,
        prometheus,
        tracing: tracing(var, boolean)?,
    })
}

/// `--metric-series-per-rule` and `--metric-series-max`, or their variables.
fn series_bounds(
    flags: &ServeFlags,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<SeriesBounds, Error> {
    let number = |flag: Option<usize>, name: &str, default: usize| match flag {
        Some(n) => Ok(n),
        None => var(name).map_or(Ok(default), |v| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| Error::Settings(format!("{name}: '{v}' is not a whole number")))
        }),
    };
    Ok(SeriesBounds {
        per_rule: number(
            flags.metric_series_per_rule,
            "TOLLGATE_METRIC_SERIES_PER_RULE",
            SeriesBounds::DEFAULT_PER_RULE,
        )?,
        total: number(
            flags.metric_series_max,
            "TOLLGATE_METRIC_SERIES_MAX",
            SeriesBounds::DEFAULT_TOTAL,
        )?,
    })
}

/// A Go listen address as `net.Listen` takes it: `:19001` (every interface),
/// `host:19001` or `[::1]:19001`.
fn go_listen_address(name: &str, text: &str) -> Result<SocketAddr, Error> {
    let text = text.trim();
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_owned(),
    };
    full.to_socket_addrs()
        .map_err(|e| Error::Settings(format!("{name}: cannot use '{text}': {e}")))?
        .next()
        .ok_or_else(|| Error::Settings(format!("{name}: '{text}' resolves to no address")))
}

fn prometheus_path(path: Option<String>) -> Result<String, Error> {
    let path = path.map_or_else(
        || DEFAULT_PROMETHEUS_PATH.to_owned(),
        |p| p.trim().to_owned(),
    );
    if !path.starts_with('/') || path.contains(char::is_whitespace) {
        return Err(Error::Settings(format!(
            "PROMETHEUS_PATH: '{path}' is not a URL path (it starts with '/')"
        )));
    }
    Ok(path)
}

/// A number from 0 to 1.
fn ratio(name: &str, text: &str) -> Result<f64, Error> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(Error::Settings(format!(
            "{name}: '{text}' is not a number from 0 to 1"
        ))),
    }
}

/// Traces are on with `TRACING_ENABLED=true` or an OTLP endpoint in the environment;
/// `TRACING_ENABLED=false` or `OTEL_SDK_DISABLED=true` turns them off whatever is set.
fn tracing(
    var: &dyn Fn(&str) -> Option<String>,
    boolean: impl Fn(&str) -> Result<Option<bool>, Error>,
) -> Result<Option<TracingSettings>, Error> {
    let enabled = boolean("TRACING_ENABLED")?;
    let traces_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
    let disabled = boolean("OTEL_SDK_DISABLED")?.unwrap_or(false);
    let wanted = enabled.unwrap_or(traces_endpoint.is_some() || endpoint.is_some());
    if !wanted || disabled {
        return Ok(None);
    }
    // envoyproxy/ratelimit's own variable first, then the OpenTelemetry ones.
    let protocol_var = [
        "TRACING_EXPORTER_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .into_iter()
    .find_map(|name| var(name).map(|v| (name, v)));
    let protocol = match protocol_var {
        None => OtlpProtocol::HttpProtobuf,
        Some((name, value)) => match value.trim().to_ascii_lowercase().as_str() {
            "grpc" => OtlpProtocol::Grpc,
            "http" | "http/protobuf" => OtlpProtocol::HttpProtobuf,
            _ => {
                return Err(Error::Settings(format!(
                    "{name}: '{value}' is not supported (expected grpc, http or http/protobuf)"
                )));
            }
        },
    };
    let endpoint = match (traces_endpoint, endpoint, protocol) {
        (Some(url), _, _) => url,
        (None, Some(base), OtlpProtocol::HttpProtobuf) => {
            format!("{}{HTTP_TRACES_PATH}", base.trim_end_matches('/'))
        }
        (None, Some(base), OtlpProtocol::Grpc) => base,
        (None, None, OtlpProtocol::HttpProtobuf) => format!("{HTTP_ENDPOINT}{HTTP_TRACES_PATH}"),
        (None, None, OtlpProtocol::Grpc) => GRPC_ENDPOINT.to_owned(),
    };
    let sampling_rate = match var("TRACING_SAMPLING_RATE") {
        Some(v) => ratio("TRACING_SAMPLING_RATE", &v)?,
        None => 1.0,
    };
    Ok(Some(TracingSettings {
        protocol,
        endpoint: endpoint.trim().to_owned(),
        service_name: var("TRACING_SERVICE_NAME")
            .or_else(|| var("OTEL_SERVICE_NAME"))
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned()),
        service_namespace: var("TRACING_SERVICE_NAMESPACE"),
        service_instance_id: var("TRACING_SERVICE_INSTANCE_ID"),
        sampling_rate,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve_with(vars: &[(&str, &str)]) -> Result<Observability, Error> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        resolve(&ServeFlags::default(), &|name| map.get(name).cloned())
    }

    #[test]
    fn upstream_metric_names_come_from_the_flag_or_the_variable_and_are_off_by_default() {
        assert_eq!(
            resolve_with(&[]).unwrap().metric_names,
            MetricNames::Tollgate
        );
        let o = resolve_with(&[("TOLLGATE_UPSTREAM_METRIC_NAMES", "true")]).unwrap();
        assert_eq!(o.metric_names, MetricNames::AlsoUpstream);
        let flags = ServeFlags {
            upstream_metric_names: true,
            ..ServeFlags::default()
        };
        let o = resolve(&flags, &|_| None).unwrap();
        assert_eq!(o.metric_names, MetricNames::AlsoUpstream);
        let err = resolve_with(&[("TOLLGATE_UPSTREAM_METRIC_NAMES", "maybe")]).unwrap_err();
        assert!(
            err.to_string().contains("TOLLGATE_UPSTREAM_METRIC_NAMES"),
            "{err}"
        );
    }

    #[test]
    fn prometheus_addr_opens_a_listener_with_upstream_names_unless_metrics_are_off() {
        let o = resolve_with(&[("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", ":19001")]).unwrap();
        let listener = o.prometheus.unwrap();
        assert_eq!(listener.addr, "0.0.0.0:19001".parse().unwrap());
        assert_eq!(listener.path, "/metrics");
        assert_eq!(o.metric_names, MetricNames::AlsoUpstream);

        let o = resolve_with(&[
            ("PROMETHEUS_ADDR", "127.0.0.1:9090"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
            ("TOLLGATE_UPSTREAM_METRIC_NAMES", "false"),
        ])
        .unwrap();
        let listener = o.prometheus.unwrap();
        assert_eq!(listener.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(listener.path, "/stats/prometheus");
        assert_eq!(o.metric_names, MetricNames::Tollgate);

        let off = resolve_with(&[("USE_PROMETHEUS", "false"), ("PROMETHEUS_ADDR", ":19001")]);
        assert_eq!(off.unwrap().prometheus, None);
        for (name, value) in [("PROMETHEUS_ADDR", ":port"), ("PROMETHEUS_PATH", "metrics")] {
            let err = resolve_with(&[("PROMETHEUS_ADDR", ":19001"), (name, value)]).unwrap_err();
            assert!(err.to_string().contains(name), "{err}");
        }
    }

    #[test]
    fn defaults_serve_metrics_and_trace_nothing() {
        let o = resolve_with(&[]).unwrap();
        assert_eq!(o, Observability::default());
        assert!(o.metrics);
        assert_eq!(o.near_limit_ratio, 0.8);
        let o = resolve_with(&[("USE_PROMETHEUS", "false"), ("NEAR_LIMIT_RATIO", "0.5")]);
        let o = o.unwrap();
        assert_eq!((o.metrics, o.near_limit_ratio), (false, 0.5));
        for bad in ["0", "1.5", "x", "NaN"] {
            let err = resolve_with(&[("NEAR_LIMIT_RATIO", bad)]).unwrap_err();
            assert!(err.to_string().contains("NEAR_LIMIT_RATIO"), "{err}");
        }
    }

    #[test]
    fn tracing_follows_envoyproxy_ratelimit_and_otel_variables() {
        let t = resolve_with(&[("TRACING_ENABLED", "true")])
            .unwrap()
            .tracing
            .unwrap();
        assert_eq!(t.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(t.endpoint, "http://localhost:4318/v1/traces");
        assert_eq!(
            (t.service_name.as_str(), t.sampling_rate),
            ("tollgate", 1.0)
        );

        let t = resolve_with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("TRACING_SERVICE_NAME", "rl"),
            ("TRACING_SAMPLING_RATE", "0.25"),
        ])
        .unwrap()
        .tracing
        .unwrap();
        assert_eq!(t.endpoint, "http://collector:4318/v1/traces");
        assert_eq!((t.service_name.as_str(), t.sampling_rate), ("rl", 0.25));

        let t = resolve_with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ])
        .unwrap()
        .tracing
        .unwrap();
        assert_eq!(
            (t.protocol, t.endpoint.as_str()),
            (OtlpProtocol::Grpc, "http://collector:4317")
        );

        let off = resolve_with(&[
            ("TRACING_ENABLED", "false"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ]);
        assert_eq!(off.unwrap().tracing, None);
        let json = resolve_with(&[
            ("TRACING_ENABLED", "1"),
            ("TRACING_EXPORTER_PROTOCOL", "http/json"),
        ]);
        assert!(
            json.unwrap_err()
                .to_string()
                .contains("TRACING_EXPORTER_PROTOCOL")
        );
    }
}
