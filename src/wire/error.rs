use crate::lineproto::DecodeError;

/// Why a fleet message could not be encoded or decoded. The texts follow cc-lib's Go
/// `fleet` package, and never quote an instance id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// `encode_heartbeat` was given no id.
    #[error("fleet: heartbeat without instance id")]
    NoInstanceId,
    /// `encode_heartbeat` was given an empty id, or a heartbeat carries one.
    #[error("fleet: heartbeat with empty instance id")]
    EmptyInstanceId,
    /// The line is not line protocol.
    #[error("fleet: {0}")]
    Decode(DecodeError),
    /// A line without timestamp (ClusterCockpit messages require one).
    #[error("fleet: line {line} has no timestamp")]
    MissingTimestamp {
        /// The 1-based line number.
        line: usize,
    },
    /// A message of another measurement.
    #[error("fleet: unexpected measurement {0:?}")]
    UnexpectedMeasurement(String),
    /// A heartbeat whose `function` tag is missing or not `heartbeat`.
    #[error("fleet: unexpected function {0:?}")]
    UnexpectedFunction(String),
    /// A heartbeat without a string `event` field.
    #[error("fleet: heartbeat is missing the event field")]
    HeartbeatMissingEvent,
    /// The heartbeat payload is not `{"instanceId": "..."}`.
    #[error("fleet: decoding heartbeat payload: {0}")]
    HeartbeatPayload(String),
    /// A roster message must be exactly one line.
    #[error("fleet: roster message holds {0} lines, want 1")]
    RosterLines(usize),
    /// A roster without a string `event` field.
    #[error("fleet: roster is missing the event field")]
    RosterMissingEvent,
    /// The roster payload is not a JSON array of providers.
    #[error("fleet: decoding roster payload: {0}")]
    RosterPayload(String),
    /// A service type code that is not one of ccms, ccmc, ccb, cces, ccsa, ccnc, ccem; the
    /// message lists them.
    #[error("unknown serviceType {0:?} (valid: ccms, ccmc, ccb, cces, ccsa, ccnc, ccem)")]
    UnknownServiceType(String),
    /// A message larger than [`MAX_MESSAGE_SIZE`](super::MAX_MESSAGE_SIZE).
    #[error("fleet: message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// The message size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// JSON encoding failed (not expected for the fleet's own types).
    #[error("fleet: encoding JSON: {0}")]
    Json(String),
}
