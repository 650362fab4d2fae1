//! The OpenTelemetry span pipeline: an OTLP exporter (gRPC through tonic, or
//! http/protobuf through a blocking HTTP client on the exporter's own thread) behind
//! the SDK's batch processor, a parent-based ratio sampler (`TRACING_SAMPLING_RATE`;
//! a sampled incoming `traceparent` is always followed) and the service resource.
//! The batch processor's own variables (`OTEL_BSP_SCHEDULE_DELAY`, ...) apply.

use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingSettings {
    pub protocol: OtlpProtocol,
    /// For http/protobuf, the full URL of the traces path.
    pub endpoint: String,
    pub service_name: String,
    pub service_namespace: Option<String>,
    pub service_instance_id: Option<String>,
    /// Share of new traces sampled, 0 to 1; a sampled parent is always followed.
    pub sampling_rate: f64,
}

// The sampling rate is checked to be finite when resolved, so equality is total.
impl Eq for TracingSettings {}

/// Why logging or span export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("LOG_COLOR={0:?}: expected always, never or auto")]
    Color(String),
    #[error("OTLP exporter for {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The tracer provider for `settings`. Inside a Tokio runtime (the gRPC channel is
/// created there, lazily: an absent collector is no start-up error).
pub fn provider(settings: &TracingSettings) -> Result<SdkTracerProvider, TelemetryError> {
    let endpoint = settings.endpoint.clone();
    let exporter = match settings.protocol {
        OtlpProtocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .build(),
        OtlpProtocol::HttpProtobuf => SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.clone())
            .build(),
    }
    .map_err(|source| TelemetryError::Exporter { endpoint, source })?;

    let mut attributes = Vec::new();
    if let Some(namespace) = &settings.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    if let Some(id) = &settings.service_instance_id {
        attributes.push(KeyValue::new("service.instance.id", id.clone()));
    }
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attributes(attributes)
        .build();
    let sampler =
        Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling_rate)));
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build())
}
