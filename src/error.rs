//! The crate's error type and its single mapping to a gRPC status, at the edge.

use crate::config::ConfigErrors;
use crate::metrics::RequestErrorKind;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request breaks the protocol or a stated bound; the message says how.
    #[error("{0}")]
    InvalidRequest(String),
    /// The counter store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// A setting (flag or environment variable) that cannot be used.
    #[error("{0}")]
    Settings(String),
    /// The call was not answered within the server's request timeout.
    #[error("not answered within the request timeout ({0:?})")]
    RequestTimeout(std::time::Duration),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

impl Error {
    /// The kind the request metrics label this error with.
    pub fn metric_kind(&self) -> RequestErrorKind {
        match self {
            Error::InvalidRequest(_) => RequestErrorKind::InvalidArgument,
            Error::Store(e) => RequestErrorKind::Store(e.kind()),
            _ => RequestErrorKind::Internal,
        }
    }
}

impl From<Error> for tonic::Status {
    /// Never `UNKNOWN`: Envoy's ratelimit filter treats an unknown status like OK, so
    /// every failure is given the code that says what happened.
    fn from(error: Error) -> Self {
        match error {
            Error::InvalidRequest(msg) => tonic::Status::invalid_argument(msg),
            Error::Store(e) => tonic::Status::unavailable(format!("rate limit store: {e}")),
            Error::RequestTimeout(_) => tonic::Status::deadline_exceeded(error.to_string()),
            other => tonic::Status::internal(other.to_string()),
        }
    }
}
