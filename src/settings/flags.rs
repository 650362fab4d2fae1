//! `tollgate serve`'s command-line flags, declared once: clap parses them (the doc
//! comments are the `--help` text) and [`super::ServeSettings::resolve`] reads them,
//! flags first, then the environment variables envoyproxy/ratelimit deployments set.
//! The Redis flags are a group of their own ([`RedisFlags`]), which `tollgate
//! inspect` takes too, so it finds Redis exactly as `serve` does.

use std::path::PathBuf;

/// What the command line says; `None` (or `false`) leaves the setting to the
/// environment, then to the default.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeFlags {
    /// Config file or directory, watched for changes [default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY, else config/]
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// gRPC listen address [default: $GRPC_HOST:$GRPC_PORT, else 0.0.0.0:8081]
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP listen address for /healthcheck, /json, /rlconfig, /config.json, /metrics [default: $HOST:$PORT, else 0.0.0.0:8080]
    #[arg(long)]
    pub http_addr: Option<String>,
    /// Serve the config views (/rlconfig, /config.json) on this address instead of the HTTP port, e.g. 127.0.0.1:6070 [default: $DEBUG_HOST:$DEBUG_PORT when DEBUG_PORT is set, else on the HTTP port]
    #[arg(long)]
    pub debug_addr: Option<String>,
    /// Answer OK overall even when over a limit (also $SHADOW_MODE)
    #[arg(long)]
    pub shadow_mode: bool,
    /// Treat every descriptor as quota-mode: a request is denied only when all of its descriptors are over their limits (also $QUOTA_MODE)
    #[arg(long)]
    pub quota_mode: bool,
    /// Domains whose every rule charges with `overdraft` (always consumed, admitted while below the limit), for configs a control plane writes; comma-separated (also $OVERDRAFT_DOMAINS)
    #[arg(long, value_delimiter = ',')]
    pub overdraft_domains: Vec<String>,
    /// Fill the answer's dynamic_metadata with the request and the passed descriptors' YAML metadata, as envoyproxy/ratelimit does (also $RESPONSE_DYNAMIC_METADATA)
    #[arg(long)]
    pub response_dynamic_metadata: bool,
    #[command(flatten)]
    pub redis: RedisFlags,
    #[command(flatten)]
    pub rlqs: Box<super::rlqs::RlqsFlags>,
    #[command(flatten)]
    pub connections: Box<super::connections::ConnectionFlags>,
    #[command(flatten)]
    pub global: Box<super::global::GlobalFlags>,
    /// After SIGTERM, keep answering (health NOT_SERVING) this long before closing the listeners [default: 5]
    #[arg(long, value_name = "SECONDS")]
    pub drain_seconds: Option<f64>,
    /// Do not watch the config for changes; reload only on SIGHUP
    #[arg(long)]
    pub no_watch: bool,
    /// Exit (code 2) when the config at start-up does not validate, instead of serving NOT_SERVING until a valid set loads
    #[arg(long)]
    pub exit_on_invalid_config: bool,
    /// Health is NOT_SERVING while the served set has no domain [default: $HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, else false]
    #[arg(long, value_name = "BOOL")]
    pub healthy_with_at_least_one_config_loaded: Option<bool>,
    /// Whether an unreachable Redis makes health NOT_SERVING [default: $REDIS_HEALTH_CHECK_ACTIVE_CONNECTION, else true]
    #[arg(long, value_name = "BOOL")]
    pub health_check_redis: Option<bool>,
    /// Rate-limit headers on responses: none, ratelimit (RateLimit-Limit/-Remaining/-Reset) or ietf [default: ratelimit if $LIMIT_RESPONSE_HEADERS_ENABLED, else none]
    #[arg(long, value_name = "STYLE")]
    pub response_headers: Option<String>,
    /// Add up to this many milliseconds at random to Retry-After, so denied clients do not return together
    #[arg(long, value_name = "MS")]
    pub retry_after_jitter_ms: Option<u64>,
    /// Replicas sharing the limits; with failure_mode: local each admits 1/N [default: $TOLLGATE_REPLICAS, else 1]
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Also export envoyproxy/ratelimit's Prometheus names and labels (ratelimit_service_rate_limit_total_hits{domain,key1,key2}, ...) beside tollgate's, so its dashboards and alerts keep working [default: $TOLLGATE_UPSTREAM_METRIC_NAMES, else false]
    #[arg(long)]
    pub upstream_metric_names: bool,
    /// Series made from request values (detailed_metric, value_to_metric, Envoy's limit override) kept per rule; further values count on the rule's descriptor="(overflow)" series [default: $TOLLGATE_METRIC_SERIES_PER_RULE, else 1000]
    #[arg(long, value_name = "N")]
    pub metric_series_per_rule: Option<usize>,
    /// Series made from request values kept in all rules together [default: $TOLLGATE_METRIC_SERIES_MAX, else 4000]
    #[arg(long, value_name = "N")]
    pub metric_series_max: Option<usize>,
    /// Memory for the local over-limit cache, in bytes; 0 turns it off [default: $LOCAL_CACHE_SIZE_IN_BYTES, else 16 MiB]
    #[arg(long, value_name = "BYTES")]
    pub local_cache_bytes: Option<u64>,
    /// Memory for the in-process counters (the memory store without Redis, and the failure_mode: local counts), in bytes; when full, the least recently used counters are evicted [default: $MEMORY_STORE_BYTES, else 64 MiB]
    #[arg(long, value_name = "BYTES")]
    pub memory_store_bytes: Option<u64>,
    /// Consecutive Redis failures that open the circuit breaker [default: 5]
    #[arg(long)]
    pub breaker_failures: Option<u32>,
    /// How long an open breaker fails fast before probing Redis again [default: 1000]
    #[arg(long, value_name = "MS")]
    pub breaker_open_ms: Option<u64>,
    /// TLS on the gRPC port: certificate chain (PEM), reloaded when it changes [default: $GRPC_SERVER_TLS_CERT if $GRPC_SERVER_USE_TLS]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// TLS on the gRPC port: private key (PEM) [default: $GRPC_SERVER_TLS_KEY]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_key: Option<PathBuf>,
    /// mTLS: clients must present a certificate signed by this CA (PEM) [default: $GRPC_CLIENT_TLS_CACERT or $GRPC_SERVER_TLS_CA_CERT]
    #[arg(long, value_name = "PEM")]
    pub grpc_tls_client_ca: Option<PathBuf>,
    /// mTLS: a DNS name or IP the client certificate must be valid for [default: $GRPC_CLIENT_TLS_SAN]
    #[arg(long, value_name = "NAME")]
    pub grpc_tls_client_san: Option<String>,
}

/// Where Redis is and how its keys are named: `serve`'s and `inspect`'s.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RedisFlags {
    /// Standalone Redis: redis://[user:pass@]host:port/db, rediss:// for TLS [default: $REDIS_URL]
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes: host:port,host:port,... [default: $REDIS_URL with $REDIS_TYPE=cluster]
    #[arg(long)]
    pub redis_cluster: Option<String>,
    /// Redis Sentinel: the master group's name, then the sentinels: name,host:port,... [default: $REDIS_URL with $REDIS_TYPE=sentinel]
    #[arg(long, value_name = "NAME,HOST:PORT,...")]
    pub redis_sentinel: Option<String>,
    /// Budget in milliseconds for one request's Redis work; beyond it the domain's failure_mode answers [default: 250]
    #[arg(long, value_name = "MS")]
    pub redis_timeout_ms: Option<u64>,
    /// Prefix of every Redis key [default: $CACHE_KEY_PREFIX]
    #[arg(long)]
    pub key_prefix: Option<String>,
    /// How counters are written: compact (this release's), or 0.1 (tollgate 0.1's
    /// layouts, which it reads) while replicas of 0.1 share the Redis during a rolling
    /// upgrade; both are read either way (docs/operations.md, "Upgrading") [default: compact]
    #[arg(long, value_name = "LAYOUT")]
    pub state_layout: Option<String>,
}
