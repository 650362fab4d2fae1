//! tollgate's extensions over xDS: `RateLimitDescriptor.metadata` keys under the
//! `tollgate.` prefix, moved to where the YAML schema has them.
//!
//! `RateLimitConfig` has no field for what tollgate adds (algorithm, burst, several
//! limits, failure mode...), and its one open field is a descriptor's `metadata`
//! `Struct`, which envoyproxy/ratelimit echoes in the answer's dynamic metadata. So
//! keys named `tollgate.<field>` are consumed here, never echoed, and every other key
//! stays metadata as upstream treats it:
//! - `tollgate.algorithm`, `.unit_multiplier`, `.burst`, `.leaky_bucket`,
//!   `.time_zone`, `.lease`, `.lease_key`: into the descriptor's `rate_limit`;
//! - `tollgate.rate_limits`, `.hash_tag`, `.tarpit`, `.share_threshold`,
//!   `.value_to_metric`, `.overdraft`, `.global`: onto the descriptor;
//! - `tollgate.domain.failure_mode`, `.hash_tag`, `.raw_body`: onto the domain (only
//!   on a first-level descriptor).
//!
//! Values are the YAML's own shapes, checked by the file loader's checks afterwards;
//! an unknown `tollgate.` key is an error (a typo must not become metadata).

use prost_types::{Struct, Value, value::Kind};
use serde_json::{Map, Number, Value as Json};

/// The prefix of extension keys.
pub const PREFIX: &str = "tollgate.";
const DOMAIN_PREFIX: &str = "tollgate.domain.";

const RATE_LIMIT_KEYS: &[&str] = &[
    "algorithm",
    "unit_multiplier",
    "burst",
    "leaky_bucket",
    "time_zone",
    "lease",
    "lease_key",
];
const DESCRIPTOR_KEYS: &[&str] = &[
    "rate_limits",
    "hash_tag",
    "tarpit",
    "share_threshold",
    "value_to_metric",
    "overdraft",
    "global",
];
const DOMAIN_KEYS: &[&str] = &["failure_mode", "hash_tag", "raw_body"];

/// A descriptor's metadata sorted by destination, prefixes removed.
#[derive(Debug, Default, PartialEq)]
pub struct Extensions {
    pub rate_limit: Map<String, Json>,
    pub descriptor: Map<String, Json>,
    pub domain: Map<String, Json>,
    /// What is left: echoed in answers, as upstream does.
    pub metadata: Map<String, Json>,
}

/// Sorts `metadata`'s keys; fails on a `tollgate.` key that names nothing.
pub fn split(metadata: Option<Map<String, Json>>) -> Result<Extensions, String> {
    let mut out = Extensions::default();
    for (key, value) in metadata.unwrap_or_default() {
        if let Some(field) = key.strip_prefix(DOMAIN_PREFIX) {
            if !DOMAIN_KEYS.contains(&field) {
                return Err(unknown(&key, DOMAIN_PREFIX, DOMAIN_KEYS));
            }
            out.domain.insert(field.to_owned(), value);
        } else if let Some(field) = key.strip_prefix(PREFIX) {
            if RATE_LIMIT_KEYS.contains(&field) {
                out.rate_limit.insert(field.to_owned(), value);
            } else if DESCRIPTOR_KEYS.contains(&field) {
                out.descriptor.insert(field.to_owned(), value);
            } else {
                let all: Vec<&str> = RATE_LIMIT_KEYS
                    .iter()
                    .chain(DESCRIPTOR_KEYS)
                    .copied()
                    .collect();
                return Err(unknown(&key, PREFIX, &all));
            }
        } else {
            out.metadata.insert(key, value);
        }
    }
    Ok(out)
}

fn unknown(key: &str, prefix: &str, known: &[&str]) -> String {
    let known: Vec<String> = known.iter().map(|k| format!("{prefix}{k}")).collect();
    format!(
        "metadata: unknown tollgate extension '{key}' (expected one of {})",
        known.join(", ")
    )
}

/// A protobuf `Struct` as JSON. Numbers are doubles on the wire; a whole number is
/// written as an integer so that `tollgate.burst: 10` reads as the YAML's `10`, not
/// `10.0` (which a count refuses). NaN and infinities, which JSON lacks, become null.
pub fn struct_to_json(s: Struct) -> Map<String, Json> {
    s.fields
        .into_iter()
        .map(|(k, v)| (k, value_to_json(v)))
        .collect()
}

fn value_to_json(v: Value) -> Json {
    match v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(b),
        Some(Kind::StringValue(s)) => Json::String(s),
        Some(Kind::NumberValue(n)) => number(n),
        Some(Kind::ListValue(list)) => {
            Json::Array(list.values.into_iter().map(value_to_json).collect())
        }
        Some(Kind::StructValue(s)) => Json::Object(struct_to_json(s)),
    }
}

fn number(n: f64) -> Json {
    // 2^53: beyond it a double no longer holds every integer.
    const EXACT: f64 = 9_007_199_254_740_992.0;
    if n.fract() == 0.0 && n.abs() <= EXACT {
        // In range and whole, so the cast is exact.
        return Json::Number(Number::from(n as i64));
    }
    Number::from_f64(n).map_or(Json::Null, Json::Number)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Json) -> Option<Map<String, Json>> {
        v.as_object().cloned()
    }

    #[test]
    fn extension_keys_are_sorted_and_the_rest_stays_metadata() {
        let split = split(map(json!({
            "tollgate.algorithm": "gcra",
            "tollgate.burst": 10,
            "tollgate.hash_tag": ["tenant"],
            "tollgate.domain.failure_mode": "deny",
            "team": "payments",
        })))
        .unwrap();
        assert_eq!(
            split.rate_limit,
            map(json!({"algorithm": "gcra", "burst": 10})).unwrap()
        );
        assert_eq!(
            split.descriptor,
            map(json!({"hash_tag": ["tenant"]})).unwrap()
        );
        assert_eq!(split.domain, map(json!({"failure_mode": "deny"})).unwrap());
        assert_eq!(split.metadata, map(json!({"team": "payments"})).unwrap());
    }

    #[test]
    fn an_unknown_extension_key_is_an_error_naming_the_known_ones() {
        let error = split(map(json!({"tollgate.algoritm": "gcra"}))).unwrap_err();
        assert!(error.contains("'tollgate.algoritm'"), "{error}");
        assert!(error.contains("tollgate.algorithm"), "{error}");
        let error = split(map(json!({"tollgate.domain.burst": 1}))).unwrap_err();
        assert!(error.contains("tollgate.domain.failure_mode"), "{error}");
    }

    #[test]
    fn whole_doubles_become_integers() {
        assert_eq!(number(10.0), json!(10));
        assert_eq!(number(-3.0), json!(-3));
        assert_eq!(number(0.5), json!(0.5));
        assert_eq!(number(f64::NAN), Json::Null);
        assert_eq!(number(1e300), json!(1e300));
    }
}
