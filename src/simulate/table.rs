//! The simulation's text table: per algorithm, requests admitted and denied, the most
//! hits let through in any interval of length W (sliding, not only aligned windows)
//! and the longest shaping wait, under a header naming the pattern and the limit.

use std::fmt::Write;

use super::{Simulation, format_span, format_wait, max_in_window};

/// The table `tollgate simulate` prints.
pub fn render(sim: &Simulation) -> String {
    let window = format_span(sim.setup.window_ms);
    let costs_vary = sim.arrivals.iter().any(|a| a.cost != 1);
    let mut out = String::new();
    let _ = writeln!(out, "pattern  {}", sim.description);
    let _ = writeln!(out, "limit    {}", sim.setup.describe());
    let _ = write!(
        out,
        "span     {} ({} requests, {} hits)",
        format_span(sim.end_ms - sim.start_ms),
        sim.arrivals.len(),
        sim.offered_hits()
    );
    if sim.ignored > 0 {
        let _ = write!(out, "; {} later request(s) left out", sim.ignored);
    }
    out.push_str("\n\n");

    let max_header = format!("MAX IN ANY {window}");
    let mut header = vec!["ALGORITHM".to_owned(), "ADMITTED".to_owned()];
    if costs_vary {
        header.push("HITS".to_owned());
    }
    header.extend(["DENIED".to_owned(), max_header, "LONGEST WAIT".to_owned()]);

    let mut rows = vec![header];
    let offered_max = max_in_window(&sim.offered(), sim.setup.window_ms.saturating_mul(1000));
    let mut offered = vec!["offered".to_owned(), sim.arrivals.len().to_string()];
    if costs_vary {
        offered.push(sim.offered_hits().to_string());
    }
    offered.extend(["-".to_owned(), offered_max.to_string(), "-".to_owned()]);
    rows.push(offered);
    for run in &sim.runs {
        let mut row = vec![run.algorithm.name().to_owned(), run.admitted().to_string()];
        if costs_vary {
            row.push(run.admitted_hits().to_string());
        }
        row.extend([
            run.denied().to_string(),
            run.max_in_window().to_string(),
            format_wait(run.longest_wait_us()),
        ]);
        rows.push(row);
    }

    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(
        out,
        "\nMAX IN ANY {window}: the most hits let through in any interval [t, t + {window}), t anywhere."
    );
    if let Some(note) = held_note(sim) {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// Says when a held request counts, if any algorithm of the run held one (a shaping
/// leaky bucket): a chart of others alone needs no such note.
pub(super) fn held_note(sim: &Simulation) -> Option<String> {
    let held: Vec<&str> = sim
        .runs
        .iter()
        .filter(|run| run.longest_wait_us() > 0)
        .map(|run| run.algorithm.name())
        .collect();
    (!held.is_empty()).then(|| {
        format!(
            "{} lets a request through when its wait ends; the others at once.",
            held.join(" and ")
        )
    })
}
