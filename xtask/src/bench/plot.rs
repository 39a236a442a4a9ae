//! `cargo xtask bench --report FILE... --plot DIR`: the workload's results as SVG plots.
//!
//! Each plot puts the object counts on a log-scale x axis (100, 1000 and 10,000 sit evenly
//! apart) and draws a line per manager (and phase), each point the median of that manager's
//! runs at that count, as the report's ratio and growth tables take them. A value that is
//! missing (a manager not measured at a count, a NaN in the JSON, or a value a log axis cannot
//! show) leaves a gap in its line: it is never drawn as zero. Every plot has a white background
//! of its own and dark text, so it reads the same on a light or a dark page.
//!
//! [`render`] also draws time series ([`XScale::Seconds`], lines without markers), as
//! `cargo xtask dashboards` does for the dashboards' panels.
//!
//! The SVG is written by hand: a few lines, markers, axes and labels are all these need, and a
//! plotting crate would bring a font stack or a rasteriser for nothing.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use super::report::{self, Point, Results};
use super::workload::Run;
use super::{OURS, REFERENCE};

/// One plot, before it is drawn.
#[derive(Debug)]
pub struct Chart {
    /// The file's name without `.svg`.
    pub file: &'static str,
    pub title: String,
    /// A line or two under the title: what is plotted, and what each point is.
    pub subtitle: Vec<String>,
    /// Small print at the bottom: the machine and the builds measured.
    pub footer: Vec<String>,
    pub y_label: String,
    pub y_scale: Scale,
    /// What the x axis holds.
    pub x_scale: XScale,
    /// A horizontal line across the plot, and its label (1 on a ratio plot).
    pub rule: Option<(f64, String)>,
    pub series: Vec<Series>,
}

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// From zero up.
    Linear,
    /// Powers of ten evenly apart; values at or below zero cannot be shown.
    Log,
}

/// What the x axis holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XScale {
    /// Object counts, powers of ten evenly apart, a tick at each count measured.
    Objects,
    /// Seconds from the start of a run, from zero up.
    Seconds,
}

/// The shape of a series' markers, so lines differ by more than their colour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
}

/// A line of a plot: its name in the legend, its look, and a point per object count.
#[derive(Debug)]
pub struct Series {
    pub name: String,
    pub color: &'static str,
    pub dashed: bool,
    /// A marker at each point, or none (a time series of many points).
    pub marker: Option<Marker>,
    /// `(x, value)` by ascending x; `None` where nothing was measured.
    pub points: Vec<(f64, Option<f64>)>,
}

/// A value of a run, as the report's tables take it.
type Value = fn(&Run) -> f64;

/// Writes every plot of `results` into `dir` as `<name>.svg`, and returns the files written.
///
/// # Errors
/// When the results hold no workload runs, or a file cannot be written.
pub fn write(results: &Results, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let charts = charts(results);
    if charts.is_empty() {
        anyhow::bail!(
            "--plot: the results hold no workload runs (converge, scale, burst), which is what the plots show"
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    charts
        .iter()
        .map(|chart| {
            let path = dir.join(format!("{}.svg", chart.file));
            std::fs::write(&path, render(chart))
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        })
        .collect()
}

/// The plots of `results`' workload runs: none without runs.
pub fn charts(results: &Results) -> Vec<Chart> {
    if results.runs.is_empty() {
        return Vec::new();
    }
    let points = report::points(&results.runs);
    let counts: Vec<usize> = points
        .iter()
        .map(|p| p.objects)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let managers = managers(&points);
    let runs = runs_note(&points, &counts);
    let footer = footer(results);
    let chart = |file, title: &str, what: String, y_label: &str, y_scale| Chart {
        file,
        title: title.to_owned(),
        subtitle: vec![what, runs.clone()],
        footer: footer.clone(),
        y_label: y_label.to_owned(),
        y_scale,
        x_scale: XScale::Objects,
        rule: None,
        series: Vec::new(),
    };
    // Two values of each manager, the first a solid line, the second dashed.
    let pair_of_each = |first: (&str, Value), second: (&str, Value)| {
        managers
            .iter()
            .enumerate()
            .flat_map(|(index, manager)| {
                [(first, false), (second, true)].map(|((what, value), dashed)| {
                    let (color, marker) = manager_style(manager, index);
                    Series {
                        name: format!("{manager}, {what}"),
                        color,
                        dashed,
                        marker: Some(marker),
                        points: medians(&points, &counts, manager, value),
                    }
                })
            })
            .collect::<Vec<_>>()
    };

    let mut charts = Vec::new();
    charts.push(Chart {
        series: pair_of_each(
            ("converge", |r| r.convergence.seconds),
            ("scale", |r| r.scale.seconds),
        ),
        ..chart(
            "time",
            "Time until every object converged, and after a scale event",
            "Seconds, log scales on both axes.".to_owned(),
            "seconds",
            Scale::Log,
        )
    });
    charts.push(Chart {
        series: pair_of_each(
            ("converge + scale", report::cpu_ms_per_object),
            ("burst", report::burst_cpu_ms_per_object),
        ),
        ..chart(
            "cpu-per-object",
            "The manager's CPU time per object",
            "Over the converge and scale phases, and over the burst (the same 100 scale events at every count)."
                .to_owned(),
            "CPU ms per object",
            Scale::Linear,
        )
    });
    charts.push(Chart {
        series: managers
            .iter()
            .enumerate()
            .map(|(index, manager)| {
                let (color, marker) = manager_style(manager, index);
                Series {
                    name: (*manager).to_owned(),
                    color,
                    dashed: false,
                    marker: Some(marker),
                    points: medians(&points, &counts, manager, |r| r.memory.peak_mib),
                }
            })
            .collect(),
        ..chart(
            "peak-rss",
            "The manager's peak resident memory",
            "MiB, log scale.".to_owned(),
            "peak RSS (MiB)",
            Scale::Log,
        )
    });
    charts.push(Chart {
        series: pair_of_each(
            ("converge", |r| r.convergence.requests_per_object),
            ("scale", |r| r.scale.requests_per_object),
        ),
        ..chart(
            "requests-per-object",
            "API requests per object, counted by the API server",
            "Every request of the manager's ServiceAccount, Events and watches included."
                .to_owned(),
            "requests per object",
            Scale::Linear,
        )
    });
    let ratios = ratio_series(&points, &counts);
    if !ratios.is_empty() {
        charts.push(Chart {
            rule: Some((1.0, format!("{REFERENCE} = 1"))),
            series: ratios,
            ..chart(
                "ratios",
                &format!("Ours over {REFERENCE}"),
                "Each value of ours divided by the reference's at the same count: below 1 is better for ours.".to_owned(),
                "ours / reference",
                Scale::Linear,
            )
        });
    }
    charts
}

/// The managers of `points`: ours first, the reference last, any other build between them in
/// the order it first ran.
fn managers<'a>(points: &[Point<'a>]) -> Vec<&'a str> {
    let mut names: Vec<&str> = Vec::new();
    for point in points {
        if !names.contains(&point.manager) {
            names.push(point.manager);
        }
    }
    names.sort_by_key(|name| match *name {
        OURS => 0,
        REFERENCE => 2,
        _ => 1,
    });
    names
}

/// Colour-blind-safe colours (Okabe and Ito's), ours blue and the reference vermilion.
const PALETTE: [&str; 6] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
];
/// The ratio plot's colours, one per value.
const RATIO_COLORS: [&str; 5] = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00"];
const MARKERS: [Marker; 4] = [
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
];

/// The colour and marker of the `index`-th manager.
fn manager_style(manager: &str, index: usize) -> (&'static str, Marker) {
    match manager {
        OURS => (PALETTE[0], Marker::Circle),
        REFERENCE => (PALETTE[1], Marker::Square),
        _ => (
            PALETTE[2 + index % (PALETTE.len() - 2)],
            MARKERS[2 + index % 2],
        ),
    }
}

/// `manager`'s median of `value` at each of `counts`, `None` where it has no run there or the
/// value is not a number.
fn medians(
    points: &[Point<'_>],
    counts: &[usize],
    manager: &str,
    value: Value,
) -> Vec<(f64, Option<f64>)> {
    counts
        .iter()
        .map(|&count| {
            let median = points
                .iter()
                .find(|p| p.manager == manager && p.objects == count)
                .map(|p| p.median(value))
                .filter(|v| v.is_finite());
            (count_as_f64(count), median)
        })
        .collect()
}

/// Ours (and any other build of ours) over the reference at each count, a series per value.
fn ratio_series(points: &[Point<'_>], counts: &[usize]) -> Vec<Series> {
    let pairs = report::pairs(points);
    let mut builds: Vec<&str> = Vec::new();
    for (ours, _) in &pairs {
        if !builds.contains(&ours.manager) {
            builds.push(ours.manager);
        }
    }
    let values: [(&str, Value); 5] = [
        ("converge time", |r| r.convergence.seconds),
        ("scale time", |r| r.scale.seconds),
        ("requests per object (converge)", |r| {
            r.convergence.requests_per_object
        }),
        ("CPU per object", report::cpu_ms_per_object),
        ("peak RSS", |r| r.memory.peak_mib),
    ];
    let mut series = Vec::new();
    for (build_index, build) in builds.iter().enumerate() {
        for (index, (what, value)) in values.iter().enumerate() {
            let name = if builds.len() > 1 {
                format!("{build}: {what}")
            } else {
                (*what).to_owned()
            };
            series.push(Series {
                name,
                color: RATIO_COLORS[index % RATIO_COLORS.len()],
                dashed: build_index > 0,
                marker: Some(MARKERS[index % MARKERS.len()]),
                points: counts
                    .iter()
                    .map(|&count| {
                        let ratio = pairs
                            .iter()
                            .find(|(ours, _)| ours.manager == *build && ours.objects == count)
                            .map(|(ours, reference)| ours.median(value) / reference.median(value))
                            .filter(|v| v.is_finite());
                        (count_as_f64(count), ratio)
                    })
                    .collect(),
            });
        }
    }
    series
}

/// How many runs each point is the median of, in words.
fn runs_note(points: &[Point<'_>], counts: &[usize]) -> String {
    let per_count: Vec<Option<usize>> = counts
        .iter()
        .map(|&count| {
            let runs: BTreeSet<usize> = points
                .iter()
                .filter(|p| p.objects == count)
                .map(|p| p.runs.len())
                .collect();
            match runs.len() {
                1 => runs.first().copied(),
                _ => None,
            }
        })
        .collect();
    if per_count.iter().all(|runs| *runs == Some(1)) {
        return "One run of each manager at each count.".to_owned();
    }
    match per_count.into_iter().collect::<Option<Vec<usize>>>() {
        Some(runs) => format!(
            "Medians of {} runs at {} objects.",
            and_list(&runs.iter().map(ToString::to_string).collect::<Vec<_>>()),
            and_list(&counts.iter().map(|&c| thousands(c)).collect::<Vec<_>>())
        ),
        None => "Each point the median of that count's runs.".to_owned(),
    }
}

/// The machine and the builds, as the report's first lines name them.
fn footer(results: &Results) -> Vec<String> {
    let m = &results.machine;
    let mut lines = vec![format!(
        "{} cores, {} GiB; Kubernetes {}, {}",
        m.cores,
        m.memory_gib,
        m.kubernetes,
        if m.real_node {
            "fake nodes and the real node"
        } else {
            "fake nodes only"
        }
    )];
    if !results.builds.is_empty() {
        let builds: Vec<String> = results
            .builds
            .iter()
            .map(|b| format!("{} {}", b.manager, b.short_digest()))
            .collect();
        lines.push(format!("Builds: {}", builds.join(", ")));
    }
    lines
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// An object count with thousands separated: `10,000`.
fn thousands(count: usize) -> String {
    let digits = count.to_string();
    let mut out = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

#[allow(clippy::cast_precision_loss)]
fn count_as_f64(count: usize) -> f64 {
    count as f64
}

/// A value as a label shows it: thousands separated, at most two decimals, no trailing zeros.
fn number(value: f64) -> String {
    // Two decimals, or three significant digits below 1: the ticks of a small range (0.005,
    // 0.01, 0.015) stay apart.
    let magnitude = value.abs();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let decimals = if magnitude >= 1.0 || magnitude == 0.0 || !magnitude.is_finite() {
        2
    } else {
        (2.0 - magnitude.log10().floor()).clamp(2.0, 9.0) as usize
    };
    let text = format!("{magnitude:.decimals$}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let whole = whole
        .parse::<usize>()
        .map_or_else(|_| whole.to_owned(), thousands);
    let sign = if value < 0.0 && text != "0" { "-" } else { "" };
    if fraction.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{fraction}")
    }
}

// The drawing's layout, in SVG user units (pixels at 100%).
const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 450.0;
/// The plot area: left of it the y axis' ticks and label, right of it the legend.
const PLOT_LEFT: f64 = 78.0;
const PLOT_RIGHT: f64 = 550.0;
const PLOT_TOP: f64 = 86.0;
const PLOT_BOTTOM: f64 = 360.0;
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif";
const INK: &str = "#1a1a1a";
const MUTED: &str = "#555555";
const GRID: &str = "#e2e2e2";

/// The chart as a standalone SVG document.
pub fn render(chart: &Chart) -> String {
    let xs: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|(x, _)| *x))
        .filter(|x| chart.x_scale.shows(*x))
        .collect::<Vec<f64>>();
    let x_axis = XAxis::new(chart.x_scale, &xs);
    let mut shown: Vec<f64> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|(_, y)| *y))
        .filter(|y| visible(chart.y_scale, *y))
        .collect();
    if let Some((value, _)) = chart.rule {
        shown.push(value);
    }
    let y_axis = YAxis::new(chart.y_scale, &shown);

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" role="img" aria-labelledby="title">"#
    );
    let _ = writeln!(svg, r#"<title id="title">{}</title>"#, escape(&chart.title));
    // Its own background, so the plot reads the same on a light or a dark page.
    let _ = writeln!(
        svg,
        r##"<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="20" y="30" font-size="17" font-weight="600" fill="{INK}">{}</text>"#,
        escape(&chart.title)
    );
    for (index, line) in chart.subtitle.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = 50.0 + index as f64 * 16.0;
        let _ = writeln!(
            svg,
            r#"<text x="20" y="{y:.1}" font-size="12.5" fill="{MUTED}">{}</text>"#,
            escape(line)
        );
    }

    // The grid and the y axis' ticks.
    svg.push_str("<g class=\"y-axis\">\n");
    for tick in &y_axis.ticks {
        let y = y_axis.position(*tick);
        let _ = writeln!(
            svg,
            r#"<line x1="{PLOT_LEFT}" y1="{y:.1}" x2="{PLOT_RIGHT}" y2="{y:.1}" stroke="{GRID}" stroke-width="1"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12" fill="{INK}" text-anchor="end">{}</text>"#,
            PLOT_LEFT - 8.0,
            y + 4.0,
            number(*tick)
        );
    }
    let middle = f64::midpoint(PLOT_TOP, PLOT_BOTTOM);
    let _ = writeln!(
        svg,
        r#"<text x="22" y="{middle:.1}" font-size="13" fill="{INK}" text-anchor="middle" transform="rotate(-90 22 {middle:.1})">{}</text>"#,
        escape(&chart.y_label)
    );
    svg.push_str("</g>\n<g class=\"x-axis\">\n");
    for tick in &x_axis.ticks {
        let x = x_axis.position(*tick);
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{PLOT_TOP}" x2="{x:.1}" y2="{PLOT_BOTTOM}" stroke="{GRID}" stroke-width="1"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" font-size="12" fill="{INK}" text-anchor="middle">{}</text>"#,
            PLOT_BOTTOM + 18.0,
            number(*tick)
        );
    }
    let x_label = match chart.x_scale {
        XScale::Objects => "objects (log scale)",
        XScale::Seconds => "seconds into the run",
    };
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" fill="{INK}" text-anchor="middle">{x_label}</text>"#,
        f64::midpoint(PLOT_LEFT, PLOT_RIGHT),
        PLOT_BOTTOM + 40.0
    );
    svg.push_str("</g>\n");
    // The axes themselves, over the grid.
    let _ = writeln!(
        svg,
        r#"<path d="M{PLOT_LEFT} {PLOT_TOP} V{PLOT_BOTTOM} H{PLOT_RIGHT}" fill="none" stroke="{INK}" stroke-width="1.2"/>"#
    );

    if let Some((value, label)) = &chart.rule {
        let y = y_axis.position(*value);
        let _ = writeln!(
            svg,
            r#"<line class="rule" x1="{PLOT_LEFT}" y1="{y:.1}" x2="{PLOT_RIGHT}" y2="{y:.1}" stroke="{INK}" stroke-width="1.2" stroke-dasharray="2 3"/>"#
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11.5" fill="{INK}" text-anchor="end">{}</text>"#,
            PLOT_RIGHT - 4.0,
            y - 5.0,
            escape(label)
        );
    }

    // The first series last, so the legend's first line is drawn over any other it meets.
    for series in chart.series.iter().rev() {
        let _ = writeln!(
            svg,
            r#"<g class="series" data-series="{}">"#,
            escape(&series.name)
        );
        // A line through each run of consecutive points; a missing one breaks it.
        let mut segment: Vec<(f64, f64)> = Vec::new();
        let mut segments = Vec::new();
        for (x, y) in &series.points {
            match y {
                Some(y) if visible(chart.y_scale, *y) && chart.x_scale.shows(*x) => {
                    segment.push((x_axis.position(*x), y_axis.position(*y)));
                }
                _ => segments.push(std::mem::take(&mut segment)),
            }
        }
        segments.push(segment);
        for segment in segments.iter().filter(|s| s.len() > 1) {
            let coordinates: Vec<String> = segment
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2.2"{} stroke-linejoin="round"/>"#,
                coordinates.join(" "),
                series.color,
                dash(series.dashed)
            );
        }
        for (x, y) in &series.points {
            let Some(y) = y.filter(|y| visible(chart.y_scale, *y)) else {
                continue;
            };
            if !chart.x_scale.shows(*x) {
                continue;
            }
            let (px, py) = (x_axis.position(*x), y_axis.position(y));
            let at = match chart.x_scale {
                XScale::Objects => format!("{} objects", number(*x)),
                XScale::Seconds => format!("{} s", number(*x)),
            };
            let shape = series
                .marker
                .map(|shape| marker(shape, px, py, series.color))
                .unwrap_or_default();
            let _ = writeln!(
                svg,
                r#"<g class="point" data-x="{x}" data-y="{y}"><title>{}: {} at {at}</title>{shape}</g>"#,
                escape(&series.name),
                number(y),
            );
        }
        svg.push_str("</g>\n");
    }

    // The legend, right of the plot.
    svg.push_str("<g class=\"legend\">\n");
    let legend_x = PLOT_RIGHT + 24.0;
    for (index, series) in chart.series.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = PLOT_TOP + 8.0 + index as f64 * 22.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2.2"{}/>"#,
            legend_x + 30.0,
            series.color,
            dash(series.dashed)
        );
        if let Some(shape) = series.marker {
            svg.push_str(&marker(shape, legend_x + 15.0, y, series.color));
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="12.5" fill="{INK}">{}</text>"#,
            legend_x + 38.0,
            y + 4.0,
            escape(&series.name)
        );
    }
    svg.push_str("</g>\n");

    for (index, line) in chart.footer.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = HEIGHT - 12.0 - (chart.footer.len() - 1 - index) as f64 * 15.0;
        let _ = writeln!(
            svg,
            r#"<text x="20" y="{y:.1}" font-size="11" fill="{MUTED}">{}</text>"#,
            escape(line)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Whether an axis of `scale` can show `value`.
fn visible(scale: Scale, value: f64) -> bool {
    value.is_finite() && (scale == Scale::Linear || value > 0.0)
}

fn dash(dashed: bool) -> &'static str {
    if dashed {
        r#" stroke-dasharray="7 4""#
    } else {
        ""
    }
}

/// A marker centred on `(x, y)`, filled white inside a coloured outline.
fn marker(shape: Marker, x: f64, y: f64, color: &str) -> String {
    let style = format!(r##"fill="#ffffff" stroke="{color}" stroke-width="2""##);
    match shape {
        Marker::Circle => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="4.2" {style}/>"#),
        Marker::Square => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="7.6" height="7.6" {style}/>"#,
            x - 3.8,
            y - 3.8
        ),
        Marker::Triangle => format!(
            r#"<path d="M{x:.1} {:.1} L{:.1} {:.1} L{:.1} {:.1} Z" {style}/>"#,
            y - 5.0,
            x + 4.6,
            y + 3.4,
            x - 4.6,
            y + 3.4
        ),
        Marker::Diamond => format!(
            r#"<path d="M{x:.1} {:.1} L{:.1} {y:.1} L{x:.1} {:.1} L{:.1} {y:.1} Z" {style}/>"#,
            y - 5.2,
            x + 5.2,
            y + 5.2,
            x - 5.2
        ),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

impl XScale {
    /// Whether the axis can show `x`.
    fn shows(self, x: f64) -> bool {
        x.is_finite()
            && match self {
                XScale::Objects => x > 0.0,
                XScale::Seconds => x >= 0.0,
            }
    }
}

/// The x axis: object counts on a log scale, a tick at each count measured; or seconds from
/// zero, a tick at each round step.
struct XAxis {
    scale: XScale,
    /// The values at the plot's left and right edges (for object counts, their log10).
    low: f64,
    high: f64,
    ticks: Vec<f64>,
}

impl XAxis {
    fn new(scale: XScale, xs: &[f64]) -> Self {
        if scale == XScale::Seconds {
            let end = xs.iter().copied().fold(0.0, f64::max);
            let end = if end > 0.0 { end } else { 1.0 };
            let step = nice_step(end / 6.0);
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ticks = (0..=(end / step).floor() as usize)
                .map(|i| step * count_as_f64(i))
                .collect();
            return Self {
                scale,
                low: 0.0,
                high: end,
                ticks,
            };
        }
        let mut ticks: Vec<f64> = xs.to_vec();
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        let (low, high) = match (ticks.first(), ticks.last()) {
            (Some(first), Some(last)) => (first.log10(), last.log10()),
            _ => (0.0, 1.0),
        };
        // A margin of an eighth of the span (at least a fifth of a decade) either side, so the
        // end points sit clear of the axes and the legend.
        let margin = ((high - low) / 8.0).max(0.2);
        Self {
            scale,
            low: low - margin,
            high: high + margin,
            ticks,
        }
    }

    fn position(&self, x: f64) -> f64 {
        let value = match self.scale {
            XScale::Objects => x.log10(),
            XScale::Seconds => x,
        };
        PLOT_LEFT + (value - self.low) / (self.high - self.low) * (PLOT_RIGHT - PLOT_LEFT)
    }
}

/// The y axis: its scale, the range it shows and its ticks.
struct YAxis {
    scale: Scale,
    /// The values at the plot's bottom and top (for a log scale, their log10).
    low: f64,
    high: f64,
    ticks: Vec<f64>,
}

impl YAxis {
    fn new(scale: Scale, values: &[f64]) -> Self {
        let max = values.iter().copied().fold(f64::NAN, f64::max);
        let min = values.iter().copied().fold(f64::NAN, f64::min);
        match scale {
            Scale::Linear => {
                let top = if max.is_finite() && max > 0.0 {
                    max * 1.05
                } else {
                    1.0
                };
                let step = nice_step(top / 5.0);
                let steps = (top / step).ceil();
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let ticks = (0..=steps as usize)
                    .map(|i| step * count_as_f64(i))
                    .collect();
                Self {
                    scale,
                    low: 0.0,
                    high: step * steps,
                    ticks,
                }
            }
            Scale::Log => {
                let (min, max) = if min.is_finite() && max.is_finite() {
                    (min, max)
                } else {
                    (1.0, 10.0)
                };
                let mut low = one_two_five_below(min);
                let mut high = one_two_five_above(max);
                if high <= low {
                    low /= 2.0;
                    high *= 2.0;
                }
                let candidates: Vec<f64> = one_two_five_between(low, high);
                // Every 1, 2 and 5 over two decades or less; only the powers of ten over more.
                let ticks = if high / low > 150.0 {
                    candidates
                        .into_iter()
                        .filter(|t| (t.log10() - t.log10().round()).abs() < 1e-9)
                        .collect()
                } else {
                    candidates
                };
                Self {
                    scale,
                    low: low.log10(),
                    high: high.log10(),
                    ticks,
                }
            }
        }
    }

    fn position(&self, y: f64) -> f64 {
        let value = match self.scale {
            Scale::Linear => y,
            Scale::Log => y.log10(),
        };
        PLOT_BOTTOM - (value - self.low) / (self.high - self.low) * (PLOT_BOTTOM - PLOT_TOP)
    }
}

/// The step of 1, 2, 2.5 or 5 times a power of ten at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// The values 1, 2 and 5 times a power of ten from `low` to `high`.
fn one_two_five_between(low: f64, high: f64) -> Vec<f64> {
    let mut values = Vec::new();
    let mut power = 10f64.powf(low.log10().floor());
    while power <= high * (1.0 + 1e-9) {
        for m in [1.0, 2.0, 5.0] {
            let value = m * power;
            if value >= low * (1.0 - 1e-9) && value <= high * (1.0 + 1e-9) {
                values.push(value);
            }
        }
        power *= 10.0;
    }
    values
}

/// The largest of 1, 2 or 5 times a power of ten at or below `value`.
fn one_two_five_below(value: f64) -> f64 {
    let power = 10f64.powf(value.log10().floor());
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * power)
        .find(|v| *v <= value * (1.0 + 1e-9))
        .unwrap_or(power)
}

/// The smallest of 1, 2 or 5 times a power of ten at or above `value`.
fn one_two_five_above(value: f64) -> f64 {
    let power = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * power)
        .find(|v| *v >= value * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::{results_of, run};

    /// The `(x, y)` of every marker the SVG draws for `series`, in order.
    fn drawn(svg: &str, series: &str) -> Vec<(f64, f64)> {
        let start = format!(r#"<g class="series" data-series="{}">"#, escape(series));
        let Some(begin) = svg.find(&start) else {
            return Vec::new();
        };
        let body = &svg[begin + start.len()..];
        let body = &body[..body.find("\n</g>").expect("the series' group closes")];
        body.split(r#"<g class="point" data-x=""#)
            .skip(1)
            .map(|rest| {
                let (x, rest) = rest.split_once('"').expect("x");
                let rest = rest.strip_prefix(r#" data-y=""#).expect("y");
                let (y, _) = rest.split_once('"').expect("y");
                (x.parse().expect("a number"), y.parse().expect("a number"))
            })
            .collect()
    }

    fn chart<'a>(charts: &'a [Chart], file: &str) -> &'a Chart {
        charts
            .iter()
            .find(|c| c.file == file)
            .unwrap_or_else(|| panic!("no chart {file}"))
    }

    fn series<'a>(chart: &'a Chart, name: &str) -> &'a Series {
        chart
            .series
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no series {name} in {}", chart.file))
    }

    #[test]
    fn an_svg_has_each_series_and_its_points() {
        let results = results_of(vec![
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(OURS, 1000, 20.0, 4.0, 10.0),
            run(REFERENCE, 1000, 40.0, 8.0, 40.0),
        ]);
        let charts = charts(&results);
        let files: Vec<&str> = charts.iter().map(|c| c.file).collect();
        assert_eq!(
            files,
            [
                "time",
                "cpu-per-object",
                "peak-rss",
                "requests-per-object",
                "ratios"
            ]
        );

        let time = chart(&charts, "time");
        let names: Vec<&str> = time.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "ours, converge",
                "ours, scale",
                "controller-runtime, converge",
                "controller-runtime, scale"
            ],
            "ours first, whichever ran first"
        );
        assert_eq!(
            series(time, "ours, converge").points,
            [(100.0, Some(2.0)), (1000.0, Some(20.0))]
        );
        let svg = render(time);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains(r##"fill="#ffffff""##), "its own background");
        for name in &names {
            assert!(
                svg.contains(&format!(">{name}</text>")),
                "{name} not in the legend"
            );
        }
        assert_eq!(
            drawn(&svg, "ours, converge"),
            [(100.0, 2.0), (1000.0, 20.0)]
        );
        assert_eq!(
            drawn(&svg, "controller-runtime, converge"),
            [(100.0, 4.0), (1000.0, 40.0)]
        );
        assert!(svg.contains("<title>ours, converge: 20 at 1,000 objects</title>"));
        // The counts label the x axis.
        assert!(svg.contains(">1,000</text>"), "{svg}");

        // CPU 1 s over the converge and 1 s over the scale phase of 100 objects: 20 ms each;
        // the burst 0.15 s over 10 objects.
        let cpu = chart(&charts, "cpu-per-object");
        let ours = series(cpu, "ours, converge + scale");
        assert_eq!(ours.points[0], (100.0, Some(20.0)));
        let burst = series(cpu, "ours, burst").points[0].1.expect("measured");
        assert!((burst - 15.0).abs() < 1e-9, "{burst}");

        let ratios = chart(&charts, "ratios");
        assert_eq!(
            series(ratios, "converge time").points,
            [(100.0, Some(0.5)), (1000.0, Some(0.5))]
        );
        assert_eq!(series(ratios, "peak RSS").points[1], (1000.0, Some(1.0)));
        let svg = render(ratios);
        assert!(svg.contains(">controller-runtime = 1</text>"), "{svg}");
    }

    #[test]
    fn a_missing_value_is_skipped_not_plotted_as_zero() {
        let mut runs = vec![
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            // The reference not measured at 1000 (a run stopped part-way).
            run(OURS, 1000, 20.0, 4.0, 10.0),
            run(OURS, 10_000, 200.0, 4.0, 100.0),
            run(REFERENCE, 10_000, 400.0, 8.0, 400.0),
        ];
        // And its peak memory at 10,000 unknown.
        runs[4].memory.peak_mib = f64::NAN;
        let charts = charts(&results_of(runs));

        let requests = chart(&charts, "requests-per-object");
        assert_eq!(
            series(requests, "controller-runtime, converge").points,
            [(100.0, Some(8.0)), (1000.0, None), (10_000.0, Some(8.0))]
        );
        let svg = render(requests);
        assert_eq!(
            drawn(&svg, "controller-runtime, converge"),
            [(100.0, 8.0), (10_000.0, 8.0)]
        );
        // No line across the gap: each side of it is a single point.
        let reference = &svg[svg
            .find(r#"data-series="controller-runtime, converge""#)
            .expect("drawn")..];
        let reference = &reference[..reference.find("\n</g>").expect("closed")];
        assert!(!reference.contains("<polyline"), "{reference}");
        // Ours, measured at every count, is one line.
        let ours = &svg[svg.find(r#"data-series="ours, converge""#).expect("drawn")..];
        assert_eq!(
            ours[..ours.find("\n</g>").expect("closed")]
                .matches("<polyline")
                .count(),
            1
        );

        let rss = chart(&charts, "peak-rss");
        assert_eq!(
            series(rss, "controller-runtime").points,
            [(100.0, Some(20.0)), (1000.0, None), (10_000.0, None)]
        );
        let svg = render(rss);
        assert_eq!(drawn(&svg, "controller-runtime"), [(100.0, 20.0)]);
        assert_eq!(drawn(&svg, "ours").len(), 3);

        // Where the reference has no run there is no ratio either.
        let ratios = chart(&charts, "ratios");
        assert_eq!(
            series(ratios, "converge time").points,
            [(100.0, Some(0.5)), (1000.0, None), (10_000.0, Some(0.5))]
        );
        assert_eq!(
            series(ratios, "peak RSS").points[2],
            (10_000.0, None),
            "NaN over a number is no ratio"
        );
    }

    #[test]
    fn a_value_a_log_axis_cannot_show_is_left_out() {
        let chart = Chart {
            file: "t",
            title: "T".to_owned(),
            subtitle: vec!["S & <b>".to_owned()],
            footer: vec!["f".to_owned()],
            y_label: "y".to_owned(),
            y_scale: Scale::Log,
            x_scale: XScale::Objects,
            rule: None,
            series: vec![Series {
                name: "a".to_owned(),
                color: PALETTE[0],
                dashed: true,
                marker: Some(Marker::Triangle),
                points: vec![
                    (100.0, Some(0.0)),
                    (1000.0, Some(5.0)),
                    (10_000.0, Some(f64::INFINITY)),
                ],
            }],
        };
        let svg = render(&chart);
        assert_eq!(drawn(&svg, "a"), [(1000.0, 5.0)]);
        assert!(svg.contains(">S &amp; &lt;b&gt;</text>"), "escaped: {svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }

    #[test]
    fn a_time_series_starts_at_zero_seconds_without_markers() {
        let chart = Chart {
            file: "",
            title: "Reconciles per second".to_owned(),
            subtitle: Vec::new(),
            footer: Vec::new(),
            y_label: "per second".to_owned(),
            y_scale: Scale::Linear,
            x_scale: XScale::Seconds,
            rule: None,
            series: vec![Series {
                name: "memcached success".to_owned(),
                color: PALETTE[0],
                dashed: false,
                marker: None,
                points: vec![(0.0, Some(1.0)), (5.0, Some(2.0)), (10.0, Some(1.5))],
            }],
        };
        let svg = render(&chart);
        assert!(svg.contains("seconds into the run"), "{svg}");
        assert_eq!(drawn(&svg, "memcached success").len(), 3, "x = 0 is shown");
        assert!(svg.contains("memcached success: 2 at 5 s"), "{svg}");
        // Markers are white inside a coloured outline; nothing else is.
        assert!(
            !svg.contains(r##"fill="#ffffff" stroke="##),
            "no markers: {svg}"
        );
        // The line starts at the plot's left edge: 0 s.
        assert!(
            svg.contains(&format!(r#"<polyline points="{PLOT_LEFT:.1},"#)),
            "{svg}"
        );
    }

    #[test]
    fn no_workload_runs_no_plots() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let error = write(&results_of(Vec::new()), dir.path()).expect_err("nothing to plot");
        assert!(error.to_string().contains("no workload runs"), "{error}");

        let results = results_of(vec![run(OURS, 100, 2.0, 4.0, 1.0)]);
        let written = write(&results, &dir.path().join("plots")).expect("written");
        let names: Vec<String> = written
            .iter()
            .map(|p| {
                p.file_name()
                    .expect("a name")
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        // Ours alone: no ratio to plot.
        assert_eq!(
            names,
            [
                "time.svg",
                "cpu-per-object.svg",
                "peak-rss.svg",
                "requests-per-object.svg"
            ]
        );
        let svg = std::fs::read_to_string(&written[0]).expect("read");
        assert!(
            svg.contains("One run of each manager at each count."),
            "{svg}"
        );
    }

    #[test]
    fn axes_pick_round_ticks() {
        let linear = YAxis::new(Scale::Linear, &[4.68, 35.52]);
        assert_eq!(linear.ticks, [0.0, 10.0, 20.0, 30.0, 40.0]);
        let log = YAxis::new(Scale::Log, &[4.2, 1160.77]);
        assert_eq!(log.ticks, [10.0, 100.0, 1000.0]);
        assert!((10f64.powf(log.low) - 2.0).abs() < 1e-9);
        assert!((10f64.powf(log.high) - 2000.0).abs() < 1e-6);
        let narrow = YAxis::new(Scale::Log, &[13.5, 127.7]);
        assert_eq!(narrow.ticks, [10.0, 20.0, 50.0, 100.0, 200.0]);
        assert_eq!(number(10_000.0), "10,000");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(1005.891), "1,005.89");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.005), "0.005");
        assert_eq!(number(0.015), "0.015");
        assert_eq!(number(0.012_345), "0.0123");
        assert_eq!(number(0.85), "0.85");
        assert_eq!(
            and_list(&["5".into(), "3".into(), "1".into()]),
            "5, 3 and 1"
        );
    }
}
