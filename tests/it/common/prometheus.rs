//! Reading the Prometheus text format in tests: one series' value.

/// The value of one series, written exactly as exposed (`name{labels}`); 0 when absent.
pub fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}
