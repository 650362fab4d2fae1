//! The chart's frame: where the plot area sits in the SVG, how time and counts map to
//! pixels ([`Frame`]), and the grid, ticks, window boundaries and axis titles.

use std::fmt::Write;

use super::{Simulation, format_span};

pub(super) const WIDTH: f64 = 1000.0;
pub(super) const HEIGHT: f64 = 580.0;
pub(super) const X0: f64 = 72.0;
pub(super) const X1: f64 = 730.0;
pub(super) const Y0: f64 = 92.0;
pub(super) const Y1: f64 = 496.0;

/// Pixel mapping of the plot area.
pub(super) struct Frame {
    pub(super) start_us: u64,
    pub(super) end_us: u64,
    pub(super) y_max: f64,
}

impl Frame {
    pub(super) fn x(&self, t_us: u64) -> f64 {
        let span = self.end_us.saturating_sub(self.start_us).max(1) as f64;
        X0 + (t_us.saturating_sub(self.start_us) as f64 / span).min(1.0) * (X1 - X0)
    }

    pub(super) fn y(&self, value: f64) -> f64 {
        Y1 - value / self.y_max * (Y1 - Y0)
    }

    /// `x,y x,y ...` of a step function, shifted `dy` pixels.
    pub(super) fn points(&self, steps: &[(u64, u64)], dy: f64) -> String {
        let mut out = String::new();
        let mut previous: Option<f64> = None;
        for &(t, v) in steps {
            let x = self.x(t);
            // Zero is the axis: no need to tell lines apart there.
            let y = self.y(v as f64) + if v == 0 { 0.0 } else { dy };
            if let Some(py) = previous {
                let _ = write!(out, " {x:.1},{py:.1}");
            }
            let _ = write!(out, " {x:.1},{y:.1}");
            previous = Some(y);
        }
        if let Some(py) = previous {
            let _ = write!(out, " {X1:.1},{py:.1}");
        }
        out.trim_start().to_owned()
    }
}

/// 1, 2 or 5 times a power of ten, so that `range` holds about `ticks` steps.
pub(super) fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(f64::MIN_POSITIVE);
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|s| *s >= raw);
    step.unwrap_or(10.0 * power)
}

/// A tick label with as many decimals as the step needs.
fn tick_label(value: f64, step: f64) -> String {
    let decimals = (-step.log10().floor()).clamp(0.0, 6.0) as usize;
    format!("{value:.decimals$}")
}

/// Grid, ticks, window boundaries and axis titles.
pub(super) fn axes(svg: &mut String, frame: &Frame, sim: &Simulation, y_step: f64) {
    let mut y = 0.0;
    while y <= frame.y_max + y_step / 1000.0 {
        let py = frame.y(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{X0}" y1="{py:.1}" x2="{X1}" y2="{py:.1}" stroke="#e6e6e6"/>"##
        );
        let _ = writeln!(
            svg,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
            X0 - 8.0,
            py + 4.0,
            tick_label(y, y_step)
        );
        y += y_step;
    }
    let unit = time_ticks(svg, frame, sim);
    window_boundaries(svg, frame, sim);
    let _ = writeln!(
        svg,
        r##"<line x1="{X0}" y1="{Y1}" x2="{X1}" y2="{Y1}" stroke="#444"/>"##
    );
    let _ = writeln!(
        svg,
        r##"<line x1="{X0}" y1="{Y0}" x2="{X0}" y2="{Y1}" stroke="#444"/>"##
    );
    let origin = if sim.start_ms == 0 {
        String::new()
    } else {
        format!(" after {} ms since the epoch", sim.start_ms)
    };
    let _ = writeln!(
        svg,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">time ({unit}{}; 0 is a window boundary)</text>"##,
        (X0 + X1) / 2.0,
        Y1 + 40.0,
        escape(&origin)
    );
    let _ = writeln!(
        svg,
        r##"<text transform="translate(22 {:.1}) rotate(-90)" text-anchor="middle" fill="#333">hits in the trailing {}</text>"##,
        (Y0 + Y1) / 2.0,
        format_span(sim.setup.window_ms)
    );
}

/// The time axis' ticks, in a unit that suits the span; returns the unit's name.
fn time_ticks(svg: &mut String, frame: &Frame, sim: &Simulation) -> &'static str {
    let span_ms = sim.end_ms.saturating_sub(sim.start_ms).max(1);
    // Steps that divide minutes, hours and days, so windows fall on ticks.
    let (unit_ms, unit, friendly): (u64, &str, &[f64]) = match span_ms {
        0..300_000 => (1000, "s", &[1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0]),
        300_000..18_000_000 => (
            60_000,
            "min",
            &[1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0],
        ),
        18_000_000..432_000_000 => (3_600_000, "h", &[1.0, 2.0, 3.0, 6.0, 12.0, 24.0]),
        _ => (86_400_000, "d", &[]),
    };
    let range = span_ms as f64 / unit_ms as f64;
    let raw = range / 8.0;
    let x_step = match friendly.iter().find(|&&s| s >= raw) {
        Some(&step) if raw >= 1.0 || step == 1.0 && raw > 0.5 => step,
        _ => nice_step(range, 8.0),
    };
    let mut k = 0.0;
    while k * x_step <= range + x_step / 1000.0 {
        let value = k * x_step;
        let t_us = frame
            .start_us
            .saturating_add((value * unit_ms as f64 * 1000.0).round() as u64);
        let px = frame.x(t_us);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{Y1}" x2="{px:.1}" y2="{:.1}" stroke="#444"/>"##,
            Y1 + 5.0
        );
        let _ = writeln!(
            svg,
            r##"<text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="#444">{}</text>"##,
            Y1 + 19.0,
            tick_label(value, x_step)
        );
        k += 1.0;
    }
    unit
}

/// Fixed-window boundaries (epoch-aligned), when few enough to be drawn apart.
fn window_boundaries(svg: &mut String, frame: &Frame, sim: &Simulation) {
    let window = sim.setup.window_ms;
    let span_ms = sim.end_ms.saturating_sub(sim.start_ms).max(1);
    if span_ms / window > 40 {
        return;
    }
    let mut b = sim.start_ms - sim.start_ms % window + window;
    while b < sim.end_ms {
        let px = frame.x(b.saturating_mul(1000));
        let _ = writeln!(
            svg,
            r##"<line class="boundary" x1="{px:.1}" y1="{Y0}" x2="{px:.1}" y2="{Y1}" stroke="#9e9e9e" stroke-width="1" stroke-dasharray="2 3"/>"##
        );
        b = b.saturating_add(window);
    }
}

/// Escapes text for an SVG text node or attribute.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
