//! The compiled, immutable form of one `rate_limit`: its [`Unit`] and window, its
//! algorithm and parameters. The YAML parser that builds it is `compile/limit.rs`.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::calendar::{Calendar, CalendarUnit};
use crate::algorithm::{Algorithm, Params};
use crate::proto::rate_limit_response::rate_limit::Unit as ProtoUnit;

/// A limit's time unit. Windows are whole multiples of the unit's length in seconds,
/// aligned to the Unix epoch, with the lengths envoyproxy/ratelimit uses (a month is
/// 30 days, a year 365 days) so counters roll over at the same instants; unless the
/// limit names a `time_zone`, which makes days, weeks, months and years that zone's
/// calendar periods.
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

    /// The calendar unit it is in a time zone; `None` for the units that are the same
    /// length everywhere (second, minute, hour).
    pub fn calendar(self) -> Option<CalendarUnit> {
        match self {
            Unit::Second | Unit::Minute | Unit::Hour => None,
            Unit::Day => Some(CalendarUnit::Day),
            Unit::Week => Some(CalendarUnit::Week),
            Unit::Month => Some(CalendarUnit::Month),
            Unit::Year => Some(CalendarUnit::Year),
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

/// A finite limit: at most `requests_per_unit` hits per `unit` x `unit_multiplier`,
/// counted by `algorithm`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// tollgate extension: the window is `unit` x this (5 minutes, 2 hours).
    pub unit_multiplier: u32,
    pub algorithm: Algorithm,
    /// Bucket capacity, GCRA burst or leaky-bucket queue length; `None`: the limit.
    pub burst: Option<u32>,
    /// Leaky bucket: the longest an admitted request may be held for its turn.
    pub max_delay: Option<Duration>,
    /// Reported in `current_limit.name`; what `replaces` refers to.
    pub name: Option<Arc<str>>,
    /// tollgate extension: days, weeks, months and years are this zone's calendar
    /// periods (validated: only with those units and an algorithm that takes one).
    pub time_zone: Option<chrono_tz::Tz>,
    /// tollgate extension: the entry naming the request, whose value is the lease's
    /// identity (validated: only where the algorithm takes a lease, and only the
    /// rule's own key, with no value).
    pub lease_key: Option<Arc<str>>,
}

impl Limit {
    /// envoyproxy/ratelimit's kind of limit: a fixed window of one unit.
    pub fn fixed(requests_per_unit: u32, unit: Unit) -> Self {
        Limit {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            algorithm: Algorithm::FixedWindow,
            burst: None,
            max_delay: None,
            name: None,
            time_zone: None,
            lease_key: None,
        }
    }

    pub fn window_secs(&self) -> u64 {
        self.unit
            .seconds()
            .saturating_mul(u64::from(self.unit_multiplier.max(1)))
    }

    /// The arithmetic the algorithms and scripts need.
    pub fn params(&self) -> Params {
        Params {
            algorithm: self.algorithm,
            limit: u64::from(self.requests_per_unit),
            window_ms: self.window_secs().saturating_mul(1000),
            burst: u64::from(self.burst.unwrap_or(self.requests_per_unit)),
            max_delay_ms: self
                .max_delay
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            calendar: self.calendar(),
        }
    }

    /// The calendar periods the windows follow, when a `time_zone` makes them so.
    pub fn calendar(&self) -> Option<Calendar> {
        Some(Calendar {
            zone: self.time_zone?,
            unit: self.unit.calendar()?,
            every: self.unit_multiplier.max(1),
        })
    }
}

impl std::fmt::Display for Limit {
    /// `10/minute`, `100/5 minute sliding_window`, `5/second token_bucket burst=20`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/", self.requests_per_unit)?;
        if self.unit_multiplier > 1 {
            write!(f, "{} ", self.unit_multiplier)?;
        }
        write!(f, "{}", self.unit.name())?;
        if self.algorithm != Algorithm::FixedWindow {
            write!(f, " {}", self.algorithm.name())?;
        }
        if let Some(burst) = self.burst {
            write!(f, " burst={burst}")?;
        }
        if let Some(delay) = self.max_delay {
            write!(f, " max_delay={delay:?}")?;
        }
        if let Some(zone) = self.time_zone {
            write!(f, " time_zone={}", zone.name())?;
        }
        if let Some(key) = &self.lease_key {
            write!(f, " lease_key={key}")?;
        }
        if let Some(name) = &self.name {
            write!(f, " name={name}")?;
        }
        Ok(())
    }
}
