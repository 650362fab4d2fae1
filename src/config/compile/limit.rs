//! Validation of one `rate_limit` mapping (in `rate_limit:` or an entry of
//! `rate_limits:`) into a [`Limit`]: envoyproxy/ratelimit's rules for unit, unlimited
//! and replaces, plus tollgate's algorithm, unit_multiplier, burst, leaky_bucket,
//! time_zone and lease.

use std::sync::Arc;

use crate::config::yaml::At;

use crate::algorithm::{Algorithm, DEFAULT_LEASE};
use crate::config::diagnostics::{Report, key_line, parse_duration};
use crate::config::limit::{Limit, Unit};
use crate::config::schema::{RateLimitYaml, ReplacesYaml};

/// One validated mapping.
pub struct Parsed {
    /// `None` for `unlimited: true`.
    pub limit: Option<Limit>,
    /// Names from `replaces`, each with its line (for the self-replacement check).
    pub replaces: Vec<(Arc<str>, u64)>,
}

/// `field` names the mapping in messages (`rate_limit` or `rate_limits[2]`).
pub fn parse(
    source: &str,
    what: &str,
    field: &str,
    spanned: At<RateLimitYaml>,
    report: Report<'_>,
) -> Option<Parsed> {
    let line = spanned.line;
    let mut rl = spanned.value;
    let mut at = Mapping {
        source,
        what,
        field,
        report,
        ok: true,
    };
    let replaces = at.replaces(rl.replaces.take().unwrap_or_default());
    if rl.unlimited.unwrap_or(false) {
        if let Some(unit) = &rl.unit {
            at.error(
                unit.line,
                "unit: should not specify rate limit unit when unlimited",
            );
        }
        return at.ok.then_some(Parsed {
            limit: None,
            replaces,
        });
    }
    let algorithm = match &rl.algorithm {
        Some(a) => Some(at.algorithm(a)?),
        None => None,
    };
    // A lease rule's window is its lease, a duration rather than a unit.
    let (unit, unit_line, lease) = if algorithm.is_some_and(Algorithm::takes_lease) {
        at.lease(&rl, line)?
    } else {
        if let Some(lease) = &rl.lease {
            at.error(
                lease.line,
                format!(
                    "lease: only {} take a lease",
                    Algorithm::names_where(Algorithm::takes_lease)
                ),
            );
        }
        if let Some(key) = &rl.lease_key {
            at.error(
                key.line,
                format!(
                    "lease_key: only {} take a lease",
                    Algorithm::names_where(Algorithm::takes_lease)
                ),
            );
        }
        let (unit, unit_line) = at.unit(rl.unit.as_ref(), line)?;
        (unit, unit_line, None)
    };
    let mut limit = Limit::fixed(rl.requests_per_unit.as_ref().map_or(0, |r| r.value), unit);
    limit.name = rl
        .name
        .as_ref()
        .map(|n| n.value.clone())
        .filter(|n| !n.is_empty())
        .map(Arc::from);
    if let Some(algorithm) = algorithm {
        limit.algorithm = algorithm;
    }
    at.shape(&rl, &mut limit);
    if let Some(seconds) = lease {
        limit.unit_multiplier = seconds;
    }
    limit.lease_key = rl.lease_key.as_ref().map(|k| Arc::from(k.value.as_str()));
    if let Some(zone) = &rl.time_zone {
        limit.time_zone = at.time_zone(zone, &limit);
    }
    let rpu_line = rl.requests_per_unit.as_ref().map_or(unit_line, |r| r.line);
    at.rate(&limit, rpu_line);
    at.ok.then_some(Parsed {
        limit: Some(limit),
        replaces,
    })
}

/// The mapping being read: where it is, for messages, and whether it is still valid.
struct Mapping<'a, 'r> {
    source: &'a str,
    what: &'a str,
    field: &'a str,
    report: Report<'r>,
    ok: bool,
}

impl Mapping<'_, '_> {
    /// Reports `<what>: <field>.<message>` at `line`; the mapping is invalid.
    fn error(&mut self, line: u64, message: impl std::fmt::Display) {
        (self.report)(line, format!("{}: {}.{message}", self.what, self.field));
        self.ok = false;
    }

    /// Names from `replaces`, each with its line; an empty entry is an error.
    fn replaces(&mut self, entries: Vec<At<ReplacesYaml>>) -> Vec<(Arc<str>, u64)> {
        let mut replaces = Vec::new();
        for r in entries {
            match r.value.name.filter(|n| !n.is_empty()) {
                Some(replaced) => replaces.push((Arc::from(replaced), r.line)),
                None => self.error(r.line, "replaces: should not have an empty replaces entry"),
            }
        }
        replaces
    }

    /// The unit and the line that states it (or opens the mapping, when none does).
    fn unit(&mut self, unit: Option<&At<String>>, line: u64) -> Option<(Unit, u64)> {
        let (text, line) = match unit {
            Some(u) => (u.value.as_str(), u.line),
            // A block mapping's span starts at its first key; the mistake is the line
            // that opens it.
            None => (
                "",
                key_line(
                    self.source,
                    line,
                    self.field.split('[').next().unwrap_or(self.field),
                ),
            ),
        };
        if let Some(unit) = Unit::parse(text) {
            return Some((unit, line));
        }
        let expected: Vec<&str> = Unit::ALL.iter().map(|(_, n)| *n).collect();
        self.error(
            line,
            format!(
                "unit: invalid rate limit unit '{text}' (expected one of {})",
                expected.join(", ")
            ),
        );
        None
    }

    /// A lease rule's window: `lease` (whole seconds, as the unit `second` times them),
    /// else `unit` x `unit_multiplier` as any rule's, else [`DEFAULT_LEASE`].
    fn lease(&mut self, rl: &RateLimitYaml, line: u64) -> Option<(Unit, u64, Option<u32>)> {
        let Some(lease) = &rl.lease else {
            if rl.unit.is_some() {
                let (unit, unit_line) = self.unit(rl.unit.as_ref(), line)?;
                return Some((unit, unit_line, None));
            }
            let seconds = u32::try_from(DEFAULT_LEASE.as_secs()).unwrap_or(u32::MAX);
            return Some((Unit::Second, line, Some(seconds)));
        };
        let at = lease.line;
        if rl.unit.is_some() || rl.unit_multiplier.is_some() {
            self.error(
                at,
                "lease: the lease is a concurrency rule's window: give a lease or a unit, not both",
            );
        }
        let seconds = parse_duration(&lease.value)
            .filter(|d| d.subsec_nanos() == 0 && d.as_secs() >= 1)
            .and_then(|d| u32::try_from(d.as_secs()).ok());
        match seconds {
            Some(seconds) => Some((Unit::Second, at, Some(seconds))),
            None => {
                self.error(
                    at,
                    format!(
                        "lease: '{}' is not a whole number of seconds, at least 1 (like 90s, 5m or 1h)",
                        lease.value
                    ),
                );
                None
            }
        }
    }

    fn algorithm(&mut self, name: &At<String>) -> Option<Algorithm> {
        let algorithm = Algorithm::parse(&name.value);
        if algorithm.is_none() {
            let expected: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            self.error(
                name.line,
                format!(
                    "algorithm: unknown algorithm '{}' (expected one of {})",
                    name.value,
                    expected.join(", ")
                ),
            );
        }
        algorithm
    }

    /// tollgate's extensions of the window and the bucket: unit_multiplier, burst and
    /// the leaky bucket's options, each only where its algorithm has a use for it.
    fn shape(&mut self, rl: &RateLimitYaml, limit: &mut Limit) {
        let algorithm = limit.algorithm;
        if let Some(m) = &rl.unit_multiplier {
            if m.value == 0 {
                self.error(m.line, "unit_multiplier: must be at least 1");
            }
            limit.unit_multiplier = m.value.max(1);
        }
        if let Some(b) = &rl.burst {
            if !algorithm.uses_burst() {
                self.error(
                    b.line,
                    format!(
                        "burst: only {} have a burst, not {}",
                        Algorithm::names_where(Algorithm::uses_burst),
                        algorithm.name()
                    ),
                );
            } else if b.value == 0 {
                self.error(b.line, "burst: must be at least 1");
            }
            limit.burst = Some(b.value);
        }
        let Some(lb) = &rl.leaky_bucket else {
            return;
        };
        if !algorithm.takes_max_delay() {
            let line = key_line(self.source, lb.line, "leaky_bucket");
            self.error(
                line,
                format!(
                    "leaky_bucket: options given for algorithm {}",
                    algorithm.name()
                ),
            );
        }
        if let Some(d) = &lb.value.max_delay {
            match parse_duration(&d.value) {
                Some(delay) => limit.max_delay = Some(delay),
                None => self.error(
                    d.line,
                    format!(
                        "leaky_bucket.max_delay: '{}' is not a duration (like 250ms, 2s, 1m)",
                        d.value
                    ),
                ),
            }
        }
    }

    /// `time_zone`: a zone the database knows, on a unit that is a calendar period,
    /// counted by an algorithm that has periods (a bucket refills at a rate: a
    /// calendar would only change its rate by the month, which nobody means).
    fn time_zone(&mut self, zone: &At<String>, limit: &Limit) -> Option<chrono_tz::Tz> {
        let line = zone.line;
        let Ok(tz) = zone.value.parse::<chrono_tz::Tz>() else {
            self.error(
                line,
                format!(
                    "time_zone: unknown time zone '{}' (expected an IANA name such as Europe/Berlin, America/New_York or UTC)",
                    zone.value
                ),
            );
            return None;
        };
        if limit.unit.calendar().is_none() {
            self.error(
                line,
                format!(
                    "time_zone: only day, week, month and year are calendar periods, not {} (which counts from the epoch in every zone)",
                    limit.unit.name()
                ),
            );
        }
        if !limit.algorithm.takes_time_zone() {
            self.error(
                line,
                format!(
                    "time_zone: only {} count in calendar periods, not {}",
                    Algorithm::names_where(Algorithm::takes_time_zone),
                    limit.algorithm.name()
                ),
            );
        }
        Some(tz)
    }

    /// The bounds an algorithm puts on `requests_per_unit`.
    fn rate(&mut self, limit: &Limit, line: u64) {
        let algorithm = limit.algorithm;
        if !algorithm.allows_zero_rate() && limit.requests_per_unit == 0 {
            // A rate of zero has no emission interval; a fixed window of 0 denies all.
            self.error(
                line,
                format!("requests_per_unit: {} needs at least 1", algorithm.name()),
            );
        }
        if let Some(max) = algorithm.max_limit()
            && u64::from(limit.requests_per_unit) > max
        {
            // Only sliding_log has a maximum: the message gives its reason.
            self.error(
                line,
                format!(
                    "requests_per_unit: {} keeps one entry per hit, so it is limited to {max} per window (got {}); use sliding_window for larger limits",
                    algorithm.name(),
                    limit.requests_per_unit
                ),
            );
        }
    }
}
