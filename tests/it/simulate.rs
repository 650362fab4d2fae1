//! `tollgate simulate`: the pure simulation API on the boundary burst through every
//! algorithm, with the exact admissions each must give, sliding_window's worst case,
//! and the SVG chart's structure. `simulate/input.rs`: CSV parsing, line-numbered
//! errors, refused setups, no panic on arbitrary input; `simulate/cli.rs`: the built
//! binary (`simulate --pattern boundary --svg`, a bad CSV).

mod cli;
mod input;

use tollgate::algorithm::Algorithm;
use tollgate::simulate::{Arrival, Pattern, Run, Setup, Simulation, replay, svg, table};

/// L = 10 per W = 1 minute: the README's chart.
const L: u64 = 10;
const W: u64 = 60_000;

fn run(setup: &Setup, algorithm: Algorithm, arrivals: &[Arrival]) -> Run {
    replay(&setup.params(algorithm), arrivals)
}

/// L requests 1 ms before the boundary at W and L on it.
fn instant_boundary() -> Vec<Arrival> {
    let pattern = Pattern::Boundary {
        count: L,
        spread_ms: 0,
    };
    let arrivals = pattern.arrivals(W, 2 * W, 1).unwrap();
    assert_eq!(
        arrivals.iter().filter(|a| a.at_ms == W - 1).count(),
        L as usize
    );
    assert_eq!(arrivals.iter().filter(|a| a.at_ms == W).count(), L as usize);
    arrivals
}

/// Admitted requests and the most let through in any interval of length W.
fn admitted(setup: &Setup, algorithm: Algorithm, arrivals: &[Arrival]) -> (u64, u64) {
    let r = run(setup, algorithm, arrivals);
    (r.admitted(), r.max_in_window())
}

#[test]
fn the_boundary_burst_at_one_instant() {
    let arrivals = instant_boundary();
    let setup = Setup::new(L, W);
    // Two windows, L each: 2L inside 1 ms.
    assert_eq!(
        admitted(&setup, Algorithm::FixedWindow, &arrivals),
        (2 * L, 2 * L)
    );
    // Exact over any interval: the first L are still in the log 1 ms later.
    assert_eq!(admitted(&setup, Algorithm::SlidingLog, &arrivals), (L, L));
    // On the boundary the previous window weighs (W - 0) / W = 1: estimate L, full.
    assert_eq!(
        admitted(&setup, Algorithm::SlidingWindow, &arrivals),
        (L, L)
    );
    // B = L tokens at the end of the window, then what refilled in 1 ms: 1/6000 of a
    // token, so nothing.
    assert_eq!(admitted(&setup, Algorithm::TokenBucket, &arrivals), (L, L));
    assert_eq!(admitted(&setup, Algorithm::Gcra, &arrivals), (L, L));
    // A queue of B = L: the first L wait 0, 6, ..., 54 s; the queue is full after.
    let leaky = run(&setup, Algorithm::LeakyBucket, &arrivals);
    assert_eq!((leaky.admitted(), leaky.max_in_window()), (L, L));
    assert_eq!(leaky.longest_wait_us(), 54_000_000);
}

#[test]
fn the_boundary_burst_follows_the_burst_of_the_buckets() {
    let arrivals = instant_boundary();
    // B = 5: five at the end of the window, then nothing refilled.
    let small = Setup {
        burst: Some(5),
        ..Setup::new(L, W)
    };
    for algorithm in [
        Algorithm::TokenBucket,
        Algorithm::Gcra,
        Algorithm::LeakyBucket,
    ] {
        assert_eq!(admitted(&small, algorithm, &arrivals).0, 5, "{algorithm:?}");
    }
    // B = 2L: the L left in the bucket pass on the boundary too, like fixed_window ...
    let big = Setup {
        burst: Some(2 * L),
        ..Setup::new(L, W)
    };
    assert_eq!(
        admitted(&big, Algorithm::TokenBucket, &arrivals),
        (2 * L, 2 * L)
    );
    assert_eq!(admitted(&big, Algorithm::Gcra, &arrivals), (2 * L, 2 * L));
    // ... but a leaky bucket of 2L queues them: 2L admitted, still released 6 s apart,
    // so at most L reach the service in any minute, the last after 59.999 + 54 s.
    let leaky = run(&big, Algorithm::LeakyBucket, &arrivals);
    assert_eq!((leaky.admitted(), leaky.max_in_window()), (2 * L, L));
    assert_eq!(leaky.longest_wait_us(), 113_999_000);
    // With max_delay 30 s only the requests whose turn comes within 30 s: 0, 6, ..., 30.
    let patient = Setup {
        max_delay_ms: Some(30_000),
        ..Setup::new(L, W)
    };
    let leaky = run(&patient, Algorithm::LeakyBucket, &arrivals);
    assert_eq!(leaky.admitted(), 6);
    assert_eq!(leaky.longest_wait_us(), 30_000_000);
}

#[test]
fn the_default_boundary_run_of_the_readme_chart() {
    let setup = Setup::new(L, W);
    let pattern = Pattern::named("boundary", L, W).unwrap();
    assert_eq!(
        pattern,
        Pattern::Boundary {
            count: L,
            spread_ms: W / 10
        }
    );
    let sim = Simulation::from_pattern(&setup, &pattern, None, 1).unwrap();
    // 54.599 s .. 59.999 s and 60.000 s .. 65.400 s, 600 ms apart.
    assert_eq!(sim.arrivals.first().unwrap().at_ms, 54_599);
    assert_eq!(sim.arrivals.last().unwrap().at_ms, 65_400);
    assert_eq!((sim.start_ms, sim.end_ms), (0, 3 * W));
    let expect = [
        (Algorithm::FixedWindow, 20, 20),
        (Algorithm::SlidingWindow, 10, 10),
        (Algorithm::SlidingLog, 10, 10),
        (Algorithm::TokenBucket, 11, 11),
        (Algorithm::Gcra, 11, 11),
        (Algorithm::LeakyBucket, 11, 10),
    ];
    for (algorithm, total, max) in expect {
        let r = sim.run_of(algorithm).unwrap();
        assert_eq!(
            (r.admitted(), r.max_in_window()),
            (total, max),
            "{algorithm:?}"
        );
        assert_eq!(r.denied(), 20 - total);
    }
    // The token bucket: B = 10 during the first half (it refills 0.1 token per 600 ms,
    // so 0.9 token is back at 59.999 s), then one more at 60.6 s when the refill
    // crosses 1. sliding_window: the previous window's 10 weigh more than 9 until 6 s
    // into the window, after the second half.
    let tb = sim.run_of(Algorithm::TokenBucket).unwrap();
    let late: Vec<u64> = tb
        .outcomes
        .iter()
        .filter(|o| o.allowed && o.arrival.at_ms >= W)
        .map(|o| o.arrival.at_ms)
        .collect();
    assert_eq!(late, [60_600]);
    // The leaky bucket admits the same request, for the slot at 54.599 + 60 s.
    let leaky = sim.run_of(Algorithm::LeakyBucket).unwrap();
    assert_eq!(leaky.longest_wait_us(), 53_999_000);
    let text = table::render(&sim);
    assert!(text.contains("MAX IN ANY 1 min"), "{text}");
    assert!(text.contains("54.0 s"), "{text}");
}

#[test]
fn sliding_window_admits_almost_twice_the_limit_in_its_worst_case() {
    // L at the very end of a window, L at the very end of the next: the first L weigh
    // only 2/60000 at 119.998 s, so L - 1 more pass, 59.999 s after the first L.
    let mut arrivals: Vec<Arrival> = (0..L)
        .map(|_| Arrival {
            at_ms: W - 1,
            cost: 1,
        })
        .collect();
    arrivals.extend((0..L).map(|_| Arrival {
        at_ms: 2 * W - 2,
        cost: 1,
    }));
    let setup = Setup::new(L, W);
    let (total, max) = admitted(&setup, Algorithm::SlidingWindow, &arrivals);
    assert_eq!((total, max), (2 * L - 1, 2 * L - 1));
    assert!(max <= 2 * L, "the README's bound");
    // sliding_log still holds the first L at 119.998 s: exact, it admits none.
    assert_eq!(admitted(&setup, Algorithm::SlidingLog, &arrivals), (L, L));
}

#[test]
fn the_chart_is_well_formed_svg_with_one_line_per_algorithm() {
    let sim = Simulation::from_pattern(
        &Setup::new(L, W),
        &Pattern::named("boundary", L, W).unwrap(),
        None,
        1,
    )
    .unwrap();
    let chart = svg::render(&sim);
    assert!(
        chart.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{}",
        &chart[..80]
    );
    assert!(chart.trim_end().ends_with("</svg>"));
    assert_eq!(chart.matches("<polyline class=\"series\"").count(), 6);
    for algorithm in Algorithm::rate_limits() {
        let name = algorithm.name();
        assert_eq!(
            chart.matches(&format!("data-algorithm=\"{name}\"")).count(),
            1,
            "{name}"
        );
        assert!(
            chart.contains(&format!(">{name}</text>")),
            "legend entry for {name}"
        );
    }
    for text in [
        "boundary pattern",
        "limit 10 per 1 min",
        ">offered</text>",
        ">limit 10</text>",
        "hits in the trailing 1 min",
    ] {
        assert!(chart.contains(text), "missing {text}");
    }
    assert!(
        chart.contains("20 admitted, at most 20 per 1 min"),
        "fixed_window's total in the legend"
    );
    // Balanced elements, nothing unescaped.
    for (open, close) in [
        ("<svg", "</svg>"),
        ("<g", "</g>"),
        ("<text", "</text>"),
        ("<clipPath", "</clipPath>"),
    ] {
        assert_eq!(
            chart.matches(open).count(),
            chart.matches(close).count(),
            "{open}"
        );
    }
    assert_eq!(chart.matches('<').count(), chart.matches('>').count());
    assert!(!chart.contains("NaN") && !chart.contains("inf"));

    // Two algorithms chosen: two lines; a file name with markup is escaped.
    let setup = Setup {
        algorithms: vec![Algorithm::Gcra, Algorithm::SlidingLog],
        ..Setup::new(3, 1000)
    };
    let arrivals = vec![Arrival { at_ms: 5, cost: 2 }, Arrival { at_ms: 7, cost: 0 }];
    let sim = Simulation::from_arrivals(&setup, "csv: <a&b>.csv".into(), arrivals, None).unwrap();
    let chart = svg::render(&sim);
    assert_eq!(chart.matches("<polyline class=\"series\"").count(), 2);
    assert!(chart.contains("csv: &lt;a&amp;b&gt;.csv"));
}
