//! The compiled, immutable form of a `rate_limit`: what the matcher returns and the
//! limiter turns into counter operations.

use std::sync::Arc;

use crate::proto::rate_limit_response::rate_limit::Unit as ProtoUnit;

/// A limit's time unit. Windows are whole multiples of the unit's length in seconds,
/// aligned to the Unix epoch, with the lengths envoyproxy/ratelimit uses (a month is
/// 30 days, a year 365 days) so counters roll over at the same instants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Every unit with its YAML spelling, for parsing and for error messages.
    pub const ALL: [(Unit, &'static str); 7] = [
        (Unit::Second, "second"),
        (Unit::Minute, "minute"),
        (Unit::Hour, "hour"),
        (Unit::Day, "day"),
        (Unit::Week, "week"),
        (Unit::Month, "month"),
        (Unit::Year, "year"),
    ];

    /// Parses the YAML spelling; envoyproxy/ratelimit compares case-insensitively.
    pub fn parse(s: &str) -> Option<Unit> {
        Self::ALL
            .iter()
            .find(|(_, name)| name.eq_ignore_ascii_case(s))
            .map(|(unit, _)| *unit)
    }

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(unit, _)| *unit == self)
            .map(|(_, name)| *name)
            .unwrap_or("unknown")
    }

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub fn to_proto(self) -> ProtoUnit {
        match self {
            Unit::Second => ProtoUnit::Second,
            Unit::Minute => ProtoUnit::Minute,
            Unit::Hour => ProtoUnit::Hour,
            Unit::Day => ProtoUnit::Day,
            Unit::Week => ProtoUnit::Week,
            Unit::Month => ProtoUnit::Month,
            Unit::Year => ProtoUnit::Year,
        }
    }

    /// Converts the wire enum (`RateLimitUnit` and `RateLimit.Unit` share numbers);
    /// `None` for UNKNOWN or a number this build does not know.
    pub fn from_proto(value: i32) -> Option<Unit> {
        match ProtoUnit::try_from(value).ok()? {
            ProtoUnit::Unknown => None,
            ProtoUnit::Second => Some(Unit::Second),
            ProtoUnit::Minute => Some(Unit::Minute),
            ProtoUnit::Hour => Some(Unit::Hour),
            ProtoUnit::Day => Some(Unit::Day),
            ProtoUnit::Week => Some(Unit::Week),
            ProtoUnit::Month => Some(Unit::Month),
            ProtoUnit::Year => Some(Unit::Year),
        }
    }
}

/// A finite limit: at most `requests_per_unit` hits per `unit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// What a matched node says about requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleKind {
    /// Always OK; reported with remaining `u32::MAX` and no `current_limit`.
    Unlimited,
    Limited(Limit),
}

/// A compiled `rate_limit` at one node of a domain's descriptor tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The node's path in the config (`key_value.key2`), for logs and metrics.
    pub path: Arc<str>,
    /// The limit's `name`, reported in `current_limit.name` and used by `replaces`.
    pub name: Option<Arc<str>>,
    pub kind: RuleKind,
    /// Names of limits this one supersedes when both apply to one request.
    pub replaces: Vec<Arc<str>>,
    /// Decide and count, but always answer OK for this rule.
    pub shadow_mode: bool,
    /// Metrics may carry descriptor values for this rule (envoyproxy/ratelimit meaning).
    pub detailed_metric: bool,
    /// tollgate extension: the descriptor keys whose entries form the Redis Cluster
    /// hash tag of this rule's counters (nearest `hash_tag` up the tree, else the
    /// domain's); `None` tags with every entry.
    pub hash_tag: Option<Arc<[Arc<str>]>>,
}
