//! The `time_zone` config key: read end to end by the limiter (the real end of the
//! month, memory store on a manual clock), refused at load where it means nothing,
//! and carried over xDS as tollgate metadata.

use std::sync::Arc;

use super::{ZONES, utc};
use crate::common::server::{config, descriptor, request};
use tollgate::clock::ManualClock;
use tollgate::limiter::{Limiter, LimiterOptions};
use tollgate::proto::rate_limit_response::Code;
use tollgate::store::memory::MemoryStore;

/// The config key end to end: `time_zone` on a rate_limit makes the limiter report
/// the real end of the month (memory store, manual clock).
#[tokio::test]
async fn the_limiter_reports_the_end_of_the_calendar_month() {
    let yaml = "domain: c
descriptors:
  - key: tenant
    rate_limit:
      unit: month
      requests_per_unit: 2
      time_zone: America/New_York
";
    let clock = Arc::new(ManualClock::new(utc("2024-02-29T12:00:00")));
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    let limiter = Limiter::new(config(yaml), store, LimiterOptions::default());
    let ask = || request("c", vec![descriptor(&[("tenant", "a")])]);
    let response = limiter.should_rate_limit(&ask()).await.expect("answer");
    let status = &response.statuses[0];
    assert_eq!(status.code, Code::Ok as i32);
    // 1 March 00:00 EST is 05:00 UTC: 17 hours after noon UTC on the leap day.
    let reset = status.duration_until_reset.expect("a reset");
    assert_eq!(reset.seconds, 17 * 3600);
    let _ = limiter.should_rate_limit(&ask()).await.expect("answer");
    clock.set_millis(utc("2024-03-01T04:59:59"));
    let response = limiter.should_rate_limit(&ask()).await.expect("answer");
    assert_eq!(
        response.overall_code,
        Code::OverLimit as i32,
        "still February"
    );
    clock.set_millis(utc("2024-03-01T05:00:00"));
    let response = limiter.should_rate_limit(&ask()).await.expect("answer");
    assert_eq!(response.overall_code, Code::Ok as i32, "March in New York");
}

/// `time_zone` is refused at load, with file, line and field, where it would mean
/// nothing: an unknown zone, a unit that is no calendar period, an algorithm without
/// periods.
#[test]
fn time_zone_is_refused_where_it_means_nothing() {
    let cases = [
        (
            "unit: month, requests_per_unit: 1, time_zone: Europe/Berln",
            "unknown time zone 'Europe/Berln'",
        ),
        (
            "unit: hour, requests_per_unit: 1, time_zone: Asia/Kolkata",
            "only day, week, month and year are calendar periods, not hour",
        ),
        (
            "unit: day, requests_per_unit: 1, time_zone: UTC, algorithm: token_bucket",
            "only fixed_window and sliding_window count in calendar periods, not token_bucket",
        ),
        (
            "unit: day, requests_per_unit: 1, time_zone: UTC, algorithm: sliding_log",
            "not sliding_log",
        ),
    ];
    for (limit, needle) in cases {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{{limit}}}\n");
        let errors =
            match tollgate::config::load_sources(&[(std::path::Path::new("t.yaml"), &yaml)]) {
                Ok(_) => panic!("{limit} loaded"),
                Err(errors) => errors.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
            };
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("t.yaml:4: "), "{}", errors[0]);
        assert!(
            errors[0].contains("rate_limit.time_zone: "),
            "{}",
            errors[0]
        );
        assert!(
            errors[0].contains(needle),
            "'{}' lacks '{needle}'",
            errors[0]
        );
    }
    // Any IANA zone, or UTC, on the units that are periods.
    for zone in ZONES
        .into_iter()
        .chain(["America/Santiago", "Pacific/Chatham"])
    {
        let yaml = format!(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: week, requests_per_unit: 1, time_zone: {zone}, algorithm: sliding_window}}\n"
        );
        tollgate::config::load_sources(&[(std::path::Path::new("t.yaml"), &yaml)])
            .unwrap_or_else(|e| panic!("{zone}: {e:?}"));
    }
}

/// Over xDS the key is `tollgate.time_zone` in the descriptor's metadata, moved into
/// its `rate_limit` as the YAML has it.
#[test]
fn time_zone_arrives_over_xds_as_tollgate_metadata() {
    use prost_types::{Struct, Value, value::Kind};
    use tollgate::proto::ratelimit::config::ratelimit::v3::{
        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
    };
    let zone = Value {
        kind: Some(Kind::StringValue("Asia/Kolkata".into())),
    };
    let resource = RateLimitConfig {
        name: "billing".into(),
        domain: "billing".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "tenant".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Day as i32,
                requests_per_unit: 100,
                ..Default::default()
            }),
            metadata: Some(Struct {
                fields: [("tollgate.time_zone".to_owned(), zone)].into(),
            }),
            ..Default::default()
        }],
    };
    let yaml = tollgate::xds::translate::to_yaml(&resource).expect("translates");
    assert_eq!(
        yaml["descriptors"][0]["rate_limit"]["time_zone"], "Asia/Kolkata",
        "{yaml}"
    );
}
