//! A cluster call sent to the wrong master: an any-slot batch call
//! ([`super::scripts::Layout::AnySlot`]) that Redis refused before the script wrote
//! anything, because a key it carries is not (or no longer) served by the node it
//! went to: a slot moved (resharding, failover) since the slot map was read, or is
//! being migrated away and the key has already left. Such a call decided nothing,
//! so its requests are decided again by hash slot, where redis-rs follows MOVED and
//! ASK with every key of a call declared (`cluster/mod.rs`). It must never be read
//! as an empty counter: that would admit against a count another node holds.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::connect::describe;
use super::scripts::contract;
use crate::store::StoreError;

/// How a misrouted call's error starts, so the cluster path can tell it from a
/// failure (it is not the master's fault, and is never shown: the request is decided
/// again by slot).
const MISROUTED: &str = "misrouted batch call";

/// Whether Redis refused `e`'s call because of where its keys live, before running
/// (or while running, before writing: every key is read before any is written).
///
/// - [`contract::code::ABORTED`]: a command the call ran was refused ("Script attempted
///   to access a non local key": a key of a slot the node does not serve, or of a slot
///   it is migrating whose key is gone already), and the call gave back what it took;
/// - READONLY: the address is a replica now (a failover);
/// - MOVED, ASK, TRYAGAIN, CROSSSLOT: not expected with no key declared, but each
///   says the same;
/// - a script that does not compile: a Redis before 7 knows no shebang; deciding by
///   slot still works there.
pub fn misrouted(e: &RedisError) -> bool {
    let routing = matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::CrossSlot
        )
    );
    // The engine's own: a command refused midway, what the call took given back.
    let aborted = e.code() == Some(contract::code::ABORTED);
    routing || aborted || e.to_string().contains("Error compiling script")
}

/// The error a misrouted call answers its requests with.
pub fn error(e: &RedisError) -> StoreError {
    StoreError::Unavailable(format!("{MISROUTED}: {}", describe(e)))
}

/// Whether `e` is a misrouted call's ([`error`]).
pub fn is(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(why) if why.starts_with(MISROUTED))
}

/// The error a request of several groups reports when some failed: one that is not
/// a misroute if any, since a request whose misrouted call is decided again by slot
/// must not carry a group that failed otherwise (a timeout may have consumed).
pub fn reported<'a>(errors: impl Iterator<Item = &'a StoreError>) -> Option<&'a StoreError> {
    let mut first = None;
    for e in errors {
        if !is(e) {
            return Some(e);
        }
        first.get_or_insert(e);
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_routing_refusals_are_misroutes() {
        let server = |code: &str, detail: &str| {
            RedisError::from((
                ErrorKind::Server(match code {
                    "READONLY" => ServerErrorKind::ReadOnly,
                    _ => ServerErrorKind::ResponseError,
                }),
                "",
                detail.to_owned(),
            ))
        };
        let non_local = redis::make_extension_error(
            contract::code::ABORTED.to_owned(),
            Some("Script attempted to access a non local key in a cluster node script".into()),
        );
        assert!(misrouted(&non_local));
        assert!(is(&error(&non_local)));
        assert!(misrouted(&server("READONLY", "a read only replica")));
        assert!(!misrouted(&redis::make_extension_error(
            contract::code::MALFORMED.to_owned(),
            Some("operation".into()),
        )));
        assert!(!misrouted(&server(
            "ERR",
            "Script attempted to access a non local key in a cluster node script"
        )));
        assert!(!is(&StoreError::Unavailable("connection refused".into())));
    }
}
