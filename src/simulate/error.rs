//! Why a simulation cannot run: a CSV line it cannot read, or flags out of range.

/// Why a simulation cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimulateError {
    /// A CSV line that is not `timestamp_ms[,cost]`.
    #[error("line {line}: {message}")]
    Csv { line: usize, message: String },
    /// Flags that make no sense together, or out of range.
    #[error("{0}")]
    Invalid(String),
}

/// `Err` of [`SimulateError::Invalid`].
pub(super) fn invalid<T>(message: impl Into<String>) -> Result<T, SimulateError> {
    Err(SimulateError::Invalid(message.into()))
}
