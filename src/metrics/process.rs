//! Process metrics, read from `/proc/self` when `/metrics` is scraped and never on
//! the request path: resident memory, CPU seconds, open and maximum file descriptors,
//! start time; and the log lines the log writer dropped. The names are those of the Prometheus client libraries
//! (`process_resident_memory_bytes`, `process_cpu_seconds_total`, ...), so existing
//! dashboards and alerts work unchanged. Where `/proc` is absent (not Linux) a value
//! that cannot be read is left out of the scrape rather than reported as 0.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

/// Clock ticks per second of `/proc/<pid>/stat`'s times. The kernel exports them in
/// USER_HZ, which is 100 on every architecture Linux user space sees (the Prometheus
/// Go client's procfs hard-codes it too); asking `sysconf` would need libc for one
/// constant.
const USER_HZ: f64 = 100.0;

/// What one scrape reads.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<f64>,
    pub virtual_bytes: Option<f64>,
    pub open_fds: Option<f64>,
    pub max_fds: Option<f64>,
}

/// The registered collector; the start time is read once (it does not change).
#[derive(Debug)]
pub(super) struct ProcessCollector {
    start_time_seconds: Option<f64>,
}

impl ProcessCollector {
    pub(super) fn new() -> Self {
        Self {
            start_time_seconds: start_time(),
        }
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let sample = sample();
        if let Some(cpu) = sample.cpu_seconds {
            let counter = ConstCounter::new(cpu);
            let metric = encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                counter.metric_type(),
            )?;
            counter.encode(metric)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                sample.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                sample.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                sample.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                None,
                sample.max_fds,
            ),
            (
                "process_start_time",
                "Start time of the process since the Unix epoch in seconds",
                Some(Unit::Seconds),
                self.start_time_seconds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            let Some(value) = value else { continue };
            let gauge = ConstGauge::new(value);
            let metric =
                encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        // Kept by the log writer itself (telemetry sits below the metrics).
        let dropped = ConstCounter::new(crate::telemetry::nonblocking::dropped_lines());
        let metric = encoder.encode_descriptor(
            "tollgate_log_lines_dropped",
            "Log lines dropped because stderr did not take them (a stuck log reader)",
            None,
            dropped.metric_type(),
        )?;
        dropped.encode(metric)
    }
}

/// Reads the process's current figures.
pub(super) fn sample() -> Sample {
    let stat = std::fs::read_to_string("/proc/self/stat").ok();
    let fields = stat.as_deref().and_then(stat_fields);
    let field = |i: usize| -> Option<f64> { fields.as_ref()?.get(i)?.parse().ok() };
    // Numbering as proc(5), from field 3 (state) on: utime is 14, stime 15, vsize 23.
    let cpu_seconds = match (field(14), field(15)) {
        (Some(user), Some(system)) => Some((user + system) / USER_HZ),
        _ => None,
    };
    Sample {
        cpu_seconds,
        resident_bytes: resident_bytes(),
        virtual_bytes: field(23),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|dir| dir.count() as f64),
        max_fds: max_fds(),
    }
}

/// `/proc/self/stat`'s fields, indexed as proc(5) numbers them (1-based). The command
/// name (field 2) is in parentheses and may itself hold spaces and parentheses, so
/// the split starts after its last `)`.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let (_, rest) = stat.rsplit_once(')')?;
    // Placeholders for index 0 (unused), pid and comm, so index n is field n.
    let mut fields = vec!["", "", ""];
    fields.extend(rest.split_whitespace());
    Some(fields)
}

/// `VmRSS` of `/proc/self/status` (kB there), so no page size is needed.
fn resident_bytes() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// The soft limit on open files, from `/proc/self/limits` (absent when unlimited).
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Boot time (`btime` of `/proc/stat`) plus the process's start in ticks after boot
/// (field 22 of `/proc/self/stat`); the process clock where `/proc` is missing.
fn start_time() -> Option<f64> {
    let from_proc = || -> Option<f64> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let ticks: f64 = stat_fields(&stat)?.get(22)?.parse().ok()?;
        let system = std::fs::read_to_string("/proc/stat").ok()?;
        let boot: f64 = system
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(boot + ticks / USER_HZ)
    };
    from_proc().or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()
            .map(|d| d.as_secs_f64())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_survive_a_command_name_with_spaces_and_parentheses() {
        let stat = "42 (tollgate (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 \
                    8 0 12345 1000000 300 18446744073709551615";
        let fields = stat_fields(stat).unwrap();
        assert_eq!(fields[3], "S");
        assert_eq!(fields[14], "250");
        assert_eq!(fields[15], "50");
        assert_eq!(fields[22], "12345");
        assert_eq!(fields[23], "1000000");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_sample_of_this_process_is_plausible() {
        let sample = sample();
        assert!(sample.resident_bytes.unwrap() > 1024.0 * 1024.0);
        assert!(
            sample.open_fds.unwrap() >= 1.0,
            "the directory being read is open"
        );
        assert!(sample.cpu_seconds.unwrap() >= 0.0);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let started = start_time().unwrap();
        assert!(started <= now.as_secs_f64() + 1.0 && started > now.as_secs_f64() - 86_400.0);
    }
}
