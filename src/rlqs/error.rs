//! Why a stream is refused or ended, and the one mapping to a gRPC status. Only the
//! stream at fault ends; the others never see its error.

/// What ends one RLQS stream.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RlqsError {
    #[error("the first report names no domain")]
    NoDomain,
    #[error(
        "the stream's domain is '{first}'; a report names '{now}' (open a new stream for another domain)"
    )]
    DomainChanged { first: String, now: String },
    #[error("bucket report {index}: {why}")]
    BadBucket { index: u64, why: String },
    #[error(
        "a report carries {got} buckets; at most {max} per message (--rlqs-max-reports-per-message)"
    )]
    ReportTooLarge { got: usize, max: usize },
    #[error(
        "the stream holds {max} buckets, the most one stream may (--rlqs-max-buckets-per-stream)"
    )]
    TooManyBuckets { max: usize },
    #[error("{max} RLQS streams are open, the most this server takes (--rlqs-max-streams)")]
    TooManyStreams { max: usize },
    #[error(
        "{max} RLQS streams are open on this connection, the most one peer may open (--rlqs-max-streams-per-peer)"
    )]
    TooManyStreamsFromPeer { max: usize },
    #[error(
        "the RLQS state of this server has reached its budget of {max} bytes (--rlqs-max-bytes)"
    )]
    OverBudget { max: u64 },
    #[error(
        "no report for {secs} s (--rlqs-idle-stream-secs): closed; open a new stream to report"
    )]
    Idle { secs: u64 },
    #[error("the stream did not read its answers")]
    NotReading,
    #[error("the rlqs-client-id metadata must be 1 to 128 printable ASCII characters")]
    BadClientId,
    #[error("the stream sent an undecodable message: {0}")]
    Undecodable(String),
    #[error("the server is shutting down; reconnect")]
    ShuttingDown,
}

impl RlqsError {
    /// Its `reason` label in `tollgate_rlqs_stream_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            RlqsError::NoDomain => "no_domain",
            RlqsError::DomainChanged { .. } => "domain_changed",
            RlqsError::BadBucket { .. } => "bad_bucket",
            RlqsError::ReportTooLarge { .. } => "report_too_large",
            RlqsError::TooManyBuckets { .. } => "too_many_buckets",
            RlqsError::TooManyStreams { .. } => "too_many_streams",
            RlqsError::TooManyStreamsFromPeer { .. } => "too_many_streams_from_peer",
            RlqsError::OverBudget { .. } => "over_budget",
            RlqsError::Idle { .. } => "idle",
            RlqsError::NotReading => "not_reading",
            RlqsError::BadClientId => "bad_client_id",
            RlqsError::Undecodable(_) => "undecodable",
            RlqsError::ShuttingDown => "shutting_down",
        }
    }
}

impl From<RlqsError> for tonic::Status {
    fn from(error: RlqsError) -> Self {
        let message = error.to_string();
        match error {
            RlqsError::TooManyBuckets { .. }
            | RlqsError::TooManyStreams { .. }
            | RlqsError::TooManyStreamsFromPeer { .. }
            | RlqsError::OverBudget { .. } => tonic::Status::resource_exhausted(message),
            RlqsError::ShuttingDown | RlqsError::Idle { .. } | RlqsError::NotReading => {
                tonic::Status::unavailable(message)
            }
            _ => tonic::Status::invalid_argument(message),
        }
    }
}
