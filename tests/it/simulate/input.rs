//! Input the simulator must survive: CSV lines (parsed, or refused with their line
//! number), setups outside the config's bounds, and arbitrary text, which must never
//! panic whatever it holds.

use proptest::prelude::*;
use tollgate::algorithm::Algorithm;
use tollgate::simulate::patterns::parse_csv;
use tollgate::simulate::{Pattern, Setup, SimulateError, Simulation, svg, table};

use super::{L, W};

#[test]
fn csv_lines_parse_and_errors_name_the_line() {
    let text = "\u{feff}timestamp_ms,cost\n# a comment\n100\n\n50, 3\n100;0\n7\t2\n";
    let arrivals = parse_csv(text).unwrap();
    let pairs: Vec<(u64, u64)> = arrivals.iter().map(|a| (a.at_ms, a.cost)).collect();
    assert_eq!(
        pairs,
        [(7, 2), (50, 3), (100, 1), (100, 0)],
        "sorted, stable"
    );
    let cases = [
        ("10\n20\nabc\n", 3, "timestamp 'abc'"),
        ("10\n-5\n", 2, "timestamp '-5'"),
        ("10,1,2\n", 1, "got 3 fields"),
        ("# c\n10,x\n", 2, "cost 'x'"),
        ("10,4294967296\n", 1, "cost '4294967296'"),
        ("1.5\n", 1, "whole number"),
        ("99999999999999999999\n", 1, "timestamp"),
        ("253402300800000\n", 1, "after the year 9999"),
        ("ts\nheader-again\n", 2, "timestamp 'header-again'"),
    ];
    for (text, line, needle) in cases {
        match parse_csv(text) {
            Err(SimulateError::Csv { line: got, message }) => {
                assert_eq!(got, line, "{text:?}: {message}");
                assert!(message.contains(needle), "{text:?}: {message}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
    assert!(matches!(
        parse_csv("\n# nothing\n"),
        Err(SimulateError::Invalid(_))
    ));
}

#[test]
fn bad_setups_are_refused_with_a_reason() {
    let refused = |setup: Setup| {
        Simulation::from_pattern(&setup, &Pattern::Burst { count: 1 }, None, 1)
            .unwrap_err()
            .to_string()
    };
    assert!(refused(Setup::new(0, W)).contains("limit"));
    assert!(refused(Setup::new(L, 1500)).contains("whole number of seconds"));
    assert!(
        refused(Setup::new(20_000, W)).contains("10000"),
        "sliding_log's MAX_LIMIT"
    );
    let without_log = Setup {
        algorithms: vec![Algorithm::SlidingWindow],
        ..Setup::new(20_000, W)
    };
    assert!(Simulation::from_pattern(&without_log, &Pattern::Burst { count: 1 }, None, 1).is_ok());
    let setup = Setup::new(L, W);
    let err = Simulation::from_pattern(
        &setup,
        &Pattern::Steady {
            per_second: f64::NAN,
        },
        None,
        1,
    )
    .unwrap_err();
    assert!(err.to_string().contains("rate"));
    let err = Simulation::from_pattern(&setup, &Pattern::Steady { per_second: 1e12 }, None, 1)
        .unwrap_err();
    assert!(err.to_string().contains("more than"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Whatever the CSV holds, parsing either fails with a line number or gives
    /// arrivals that simulate, tabulate and chart without a panic.
    #[test]
    fn no_input_panics(
        lines in proptest::collection::vec(
            prop_oneof![
                "[0-9]{1,6}",
                "[0-9]{1,6},[0-9]{1,3}",
                "[0-9]{15,21}",
                "[ -~]{0,12}",
            ],
            0..40,
        ),
        limit in 1u64..12,
        window_s in 1u64..5,
        burst in proptest::option::of(1u64..20),
    ) {
        let text = lines.join("\n");
        match parse_csv(&text) {
            Ok(arrivals) => {
                let setup = Setup { burst, ..Setup::new(limit, window_s * 1000) };
                if let Ok(sim) = Simulation::from_arrivals(&setup, "csv".into(), arrivals, None) {
                    for r in &sim.runs {
                        prop_assert!(r.admitted() + r.denied() == sim.arrivals.len() as u64);
                    }
                    let chart = svg::render(&sim);
                    prop_assert!(chart.starts_with("<svg") && !chart.contains("NaN"));
                    prop_assert!(table::render(&sim).contains("fixed_window"));
                }
            }
            Err(SimulateError::Csv { line, .. }) => prop_assert!(line >= 1 && line <= lines.len()),
            Err(SimulateError::Invalid(_)) => {}
        }
    }
}
