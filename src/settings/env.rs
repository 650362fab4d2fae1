//! Environment variables as envoyproxy/ratelimit reads them: booleans in Go's
//! spelling. Shared by every settings module that reads a variable.

use crate::error::Error;

/// Go's `strconv.ParseBool`, which envoyproxy/ratelimit's settings use.
pub fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// A boolean variable in Go's spelling, or `default` when unset.
pub(super) fn env_bool(
    var: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
) -> Result<bool, Error> {
    var(name).map_or(Ok(default), |v| {
        parse_bool(&v).ok_or_else(|| Error::Settings(format!("{name}: '{v}' is not a boolean")))
    })
}
