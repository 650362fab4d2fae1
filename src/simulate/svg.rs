//! The simulation chart, as hand-written SVG (no plotting crate): for every algorithm,
//! the hits it let through in the trailing window W, over time, against the hits
//! offered and the limit. That is the quantity a limit promises to bound, so the
//! boundary burst shows at a glance: fixed_window's line climbs to 2L, above the
//! limit, while sliding_log's stays at L. One `<polyline class="series">` per
//! algorithm, a legend with each total, axes, window boundaries and a title naming
//! the pattern and the limit.

use std::fmt::Write;

use super::axes::{self, Frame, HEIGHT, WIDTH, X0, X1, Y0, Y1, escape, nice_step};
use super::series::trailing_steps;
use super::table::held_note;
use super::{Simulation, format_span, format_wait};
use crate::algorithm::Algorithm;

const LEGEND_X: f64 = 756.0;
/// Lines that coincide are drawn this far apart (pixels), so every one stays visible.
const SPREAD_PX: f64 = 2.0;
const FONT: &str =
    "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', Helvetica, Arial, sans-serif";

/// Colour-blind-safe colours (Okabe-Ito, then more), in the order of the algorithm
/// list, so a new algorithm gets the next colour without an edit here.
const PALETTE: [&str; 8] = [
    "#D55E00", "#E69F00", "#0072B2", "#009E73", "#CC79A7", "#6A3D9A", "#56B4E9", "#F0E442",
];

/// The algorithm's colour in the charts.
pub fn color(algorithm: Algorithm) -> &'static str {
    PALETTE[usize::from(algorithm.id() - 1) % PALETTE.len()]
}

/// The whole chart of a simulation, as an SVG document.
pub fn render(sim: &Simulation) -> String {
    let window_us = sim.setup.window_ms.saturating_mul(1000);
    let (start_us, end_us) = (
        sim.start_ms.saturating_mul(1000),
        sim.end_ms.saturating_mul(1000),
    );
    let offered = trailing_steps(&sim.offered(), window_us, start_us, end_us);
    let series: Vec<_> = sim
        .runs
        .iter()
        .map(|run| {
            (
                run.algorithm,
                trailing_steps(&run.passed(), window_us, start_us, end_us),
            )
        })
        .collect();
    let peak = series
        .iter()
        .flat_map(|(_, steps)| steps.iter())
        .chain(offered.iter())
        .map(|&(_, v)| v)
        .max()
        .unwrap_or(0)
        .max(sim.setup.limit) as f64;
    let y_step = nice_step(peak * 1.1, 6.0);
    let frame = Frame {
        start_us,
        end_us,
        y_max: ((peak * 1.1) / y_step).ceil().max(1.0) * y_step,
    };
    let mut svg = String::with_capacity(16 * 1024);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    heading(&mut svg, sim);
    axes::axes(&mut svg, &frame, sim, y_step);
    offered_and_limit(&mut svg, &frame, &offered, sim.setup.limit);
    lines(&mut svg, &frame, &series);
    legend(&mut svg, sim);
    let mut footnote = format!("Lines that coincide are drawn {SPREAD_PX} px apart.");
    if let Some(note) = held_note(sim) {
        footnote = format!("{footnote} {note}");
    }
    let _ = writeln!(
        svg,
        r##"<text x="{X0}" y="{:.1}" font-size="11" fill="#777">{} Drawn by tollgate simulate.</text>"##,
        HEIGHT - 12.0,
        escape(&footnote)
    );
    svg.push_str("</svg>\n");
    svg
}

/// The title (pattern and limit), the pattern's description and how to read a line.
fn heading(svg: &mut String, sim: &Simulation) {
    let window = format_span(sim.setup.window_ms);
    let title = format!(
        "tollgate simulate: {} pattern, limit {}",
        sim.pattern,
        sim.setup.describe()
    );
    let _ = writeln!(
        svg,
        r##"<text x="{X0}" y="32" font-size="19" font-weight="700" fill="#1a1a1a">{}</text>"##,
        escape(&title)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{X0}" y="56" font-size="13" fill="#444">{}</text>"##,
        escape(&sim.description)
    );
    let _ = writeln!(
        svg,
        r##"<text x="{X0}" y="76" font-size="12" fill="#666">Each line: hits let through in the trailing {window}, at every instant. A limit of {} promises at most {} there.</text>"##,
        sim.setup.limit, sim.setup.limit
    );
}

/// Offered traffic as a grey area under its trailing count, and the limit's line.
fn offered_and_limit(svg: &mut String, frame: &Frame, offered: &[(u64, u64)], limit: u64) {
    let mut area = format!("M {X0:.1},{Y1:.1} L {}", frame.points(offered, 0.0));
    let _ = write!(area, " L {X1:.1},{Y1:.1} Z");
    let _ = writeln!(
        svg,
        r##"<path class="offered" d="{area}" fill="#bdbdbd" fill-opacity="0.45" stroke="#8c8c8c" stroke-width="1"/>"##
    );
    let limit_y = frame.y(limit as f64);
    let _ = writeln!(
        svg,
        r##"<line class="limit" x1="{X0}" y1="{limit_y:.1}" x2="{X1}" y2="{limit_y:.1}" stroke="#1a1a1a" stroke-width="1.4" stroke-dasharray="7 4"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#1a1a1a">limit {limit}</text>"##,
        X0 + 6.0,
        limit_y - 5.0,
    );
}

/// One polyline per algorithm, clipped to the plot, spread apart where they coincide.
fn lines(svg: &mut String, frame: &Frame, series: &[(Algorithm, Vec<(u64, u64)>)]) {
    let _ = writeln!(
        svg,
        r#"<clipPath id="plot"><rect x="{X0}" y="{:.1}" width="{:.1}" height="{:.1}"/></clipPath>"#,
        Y0 - 8.0,
        X1 - X0,
        Y1 - Y0 + 16.0
    );
    let _ = writeln!(
        svg,
        r#"<g clip-path="url(#plot)" fill="none" stroke-width="2.2" stroke-linejoin="round">"#
    );
    let middle = (series.len() as f64 - 1.0) / 2.0;
    for (i, (algorithm, steps)) in series.iter().enumerate() {
        let dy = (i as f64 - middle) * SPREAD_PX;
        let _ = writeln!(
            svg,
            r#"<polyline class="series" data-algorithm="{}" stroke="{}" points="{}"/>"#,
            algorithm.name(),
            color(*algorithm),
            frame.points(steps, dy)
        );
    }
    let _ = writeln!(svg, "</g>");
}

/// How a legend entry is marked.
enum Swatch {
    Area,
    Line {
        color: &'static str,
        dash: &'static str,
        width: f64,
    },
    Boundary,
}

/// The legend, right of the plot: offered, each algorithm with its totals, the limit
/// and the window boundaries.
fn legend(svg: &mut String, sim: &Simulation) {
    let x = LEGEND_X;
    let mut y = Y0 + 4.0;
    for (swatch, name, detail) in legend_entries(sim) {
        let _ = match swatch {
            Swatch::Area => writeln!(
                svg,
                r##"<rect x="{x:.1}" y="{:.1}" width="26" height="10" fill="#bdbdbd" fill-opacity="0.45" stroke="#8c8c8c"/>"##,
                y - 5.0
            ),
            Swatch::Line { color, dash, width } => writeln!(
                svg,
                r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{width}" stroke-dasharray="{dash}"/>"#,
                x + 26.0
            ),
            Swatch::Boundary => writeln!(
                svg,
                r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#9e9e9e" stroke-dasharray="2 3"/>"##,
                x + 13.0,
                y - 8.0,
                x + 13.0,
                y + 8.0
            ),
        };
        let _ = writeln!(
            svg,
            r##"<text class="legend" x="{:.1}" y="{:.1}" font-size="13" font-weight="600" fill="#1a1a1a">{}</text>"##,
            x + 34.0,
            y + 4.0,
            escape(&name)
        );
        for (i, line) in detail.iter().enumerate() {
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" font-size="11" fill="#555">{}</text>"##,
                x + 34.0,
                y + 19.0 + 14.0 * i as f64,
                escape(line)
            );
        }
        y += 26.0 + 14.0 * detail.len() as f64;
    }
}

/// What the legend lists: each entry's swatch, name and lines of detail.
fn legend_entries(sim: &Simulation) -> Vec<(Swatch, String, Vec<String>)> {
    let window = format_span(sim.setup.window_ms);
    let offered_peak =
        super::max_in_window(&sim.offered(), sim.setup.window_ms.saturating_mul(1000));
    let mut entries = vec![(
        Swatch::Area,
        "offered".to_owned(),
        vec![format!(
            "{} hits, at most {offered_peak} per {window}",
            sim.offered_hits()
        )],
    )];
    for run in &sim.runs {
        let mut detail = vec![format!(
            "{} admitted, at most {} per {window}",
            run.admitted_hits(),
            run.max_in_window()
        )];
        if run.longest_wait_us() > 0 {
            detail.push(format!(
                "longest wait {}",
                format_wait(run.longest_wait_us())
            ));
        }
        let line = Swatch::Line {
            color: color(run.algorithm),
            dash: "none",
            width: 3.0,
        };
        entries.push((line, run.algorithm.name().to_owned(), detail));
    }
    let limit = Swatch::Line {
        color: "#1a1a1a",
        dash: "7 4",
        width: 1.4,
    };
    entries.push((
        limit,
        format!("limit {}", sim.setup.limit),
        vec![format!("per {window}")],
    ));
    entries.push((
        Swatch::Boundary,
        "window boundary".to_owned(),
        vec!["where fixed windows reset".to_owned()],
    ));
    entries
}
