//! The page's distribution, scaling and timeline charts, hand-written as
//! inline SVG like the bar charts in `chart.rs`.
//!
//! Why not plotters: its SVG backend renders text through a font loader
//! unless text is left to the browser, and what these charts need (log
//! axes, a dashed floor, labelled bars in lanes) is a few hundred lines
//! that the tests below can pin down. No scripts, no external references.

use std::fmt::Write as _;

use harness::timeline::Timeline;

/// One colour per series, distinguishable on white and in print.
pub(crate) const PALETTE: &[&str] = &[
    "#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#c53030", "#319795", "#b7791f", "#d53f8c",
    "#4a5568", "#2c7a7b",
];

pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A log axis over `[lo, hi]` widened to whole decades (or powers of two).
#[derive(Debug, Clone, Copy)]
struct LogAxis {
    lo: f64,
    hi: f64,
    base: f64,
}

impl LogAxis {
    fn new(lo: f64, hi: f64, base: f64) -> Option<Self> {
        if !(lo > 0.0 && hi > 0.0 && lo.is_finite() && hi.is_finite()) {
            return None;
        }
        let lo = base.powf(lo.log(base).floor());
        let mut hi = base.powf(hi.log(base).ceil());
        if hi <= lo {
            hi = lo * base;
        }
        Some(Self { lo, hi, base })
    }

    /// Where `v` falls, 0 at `lo` to 1 at `hi` (clamped).
    fn at(&self, v: f64) -> f64 {
        let v = v.clamp(self.lo, self.hi);
        (v / self.lo).log(self.base) / (self.hi / self.lo).log(self.base)
    }

    fn ticks(&self) -> Vec<f64> {
        let mut t = Vec::new();
        let mut v = self.lo;
        while v <= self.hi * 1.000_001 && t.len() < 40 {
            t.push(v);
            v *= self.base;
        }
        t
    }
}

/// "250 µs", "1.2 ms", "3 s".
pub(crate) fn show_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if us >= 1e3 {
        let ms = us / 1e3;
        if ms >= 100.0 {
            format!("{ms:.0} ms")
        } else {
            format!("{ms:.1} ms")
        }
    } else if us >= 10.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

fn show_count(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// One CDF to draw: its name, `[quantile, µs]` points, and the floor to
/// mark as a dashed line (µs).
pub(crate) struct Cdf {
    pub name: String,
    pub points: Vec<[f64; 2]>,
    pub floor_us: Option<f64>,
}

const W: f64 = 760.0;
/// Timelines run the page's width: their lanes need it, and their
/// labels are long.
const TW: f64 = 1060.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 170.0;

/// An SVG's opening tag with its title as the first line.
fn svg_open(title: &str, width: f64, height: f64) -> String {
    format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{t}"><text x="0" y="14" class="ct">{t}</text>"#,
        t = esc(title)
    )
}

/// A vertical grid line and its label at every decade of `x`.
fn x_grid(
    svg: &mut String,
    x: &LogAxis,
    px: impl Fn(f64) -> f64,
    (top, plot_h): (f64, f64),
    label: fn(f64) -> String,
) {
    for t in x.ticks() {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1}" stroke="#e2e8f0"/><text x="{0:.1}" y="{2}" class="cl" text-anchor="middle">{3}</text>"##,
            px(t),
            top + plot_h,
            top + plot_h + 14.0,
            label(t)
        );
    }
}

/// CDFs on one log time axis; each series' floor dashed in its colour.
/// Empty when no series has two points.
pub(crate) fn cdf_chart(title: &str, series: &[Cdf]) -> String {
    let series: Vec<&Cdf> = series.iter().filter(|s| s.points.len() >= 2).collect();
    let values = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p[1]).chain(s.floor_us))
        .filter(|v| *v > 0.0);
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(l, h), v| (l.min(v), h.max(v)));
    let Some(x) = LogAxis::new(lo, hi, 10.0) else {
        return String::new();
    };
    let (top, plot_h) = (28.0, 240.0);
    let plot_w = W - LEFT - RIGHT;
    let height = top + plot_h + 44.0;
    let px = |v: f64| LEFT + x.at(v) * plot_w;
    let py = |q: f64| top + (1.0 - q.clamp(0.0, 1.0)) * plot_h;
    let mut svg = svg_open(title, W, height);
    // Grid: decades on x, quartiles on y.
    x_grid(&mut svg, &x, px, (top, plot_h), show_us);
    for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0] {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#edf2f7"/><text x="{2}" y="{3:.1}" class="cl" text-anchor="end">{4}</text>"##,
            py(q),
            LEFT + plot_w,
            LEFT - 4.0,
            py(q) + 4.0,
            // The p99 line sits 2.4 px under 100 %: labelled, the two
            // would print over each other.
            if q == 0.99 {
                String::new()
            } else {
                format!("{:.0} %", q * 100.0)
            }
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" class="cl" text-anchor="middle">time (log scale); dashed: the backend's raw floor p50</text>"#,
        LEFT + plot_w / 2.0,
        top + plot_h + 32.0
    );
    for (i, s) in series.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        // A step function: the share of samples at or below each time.
        let mut d = String::new();
        for (j, p) in s.points.iter().enumerate() {
            let (xv, yv) = (px(p[1]), py(p[0]));
            if j == 0 {
                let _ = write!(d, "M{xv:.1},{:.1} L{xv:.1},{yv:.1}", py(0.0));
            } else {
                let _ = write!(d, " H{xv:.1} V{yv:.1}");
            }
        }
        let _ = write!(
            svg,
            r#"<path d="{d}" fill="none" stroke="{c}" stroke-width="1.6"><title>{}</title></path>"#,
            esc(&s.name)
        );
        if let Some(f) = s.floor_us.filter(|f| *f > 0.0) {
            let _ = write!(
                svg,
                r#"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1}" stroke="{c}" stroke-dasharray="4 3"><title>{2}: raw floor p50 {3}</title></line>"#,
                px(f),
                top + plot_h,
                esc(&s.name),
                show_us(f)
            );
        }
        let p50 = s
            .points
            .iter()
            .find(|p| p[0] >= 0.5)
            .map_or(String::new(), |p| format!(" p50 {}", show_us(p[1])));
        let ly = top + 6.0 + i as f64 * 16.0;
        let _ = write!(
            svg,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{c}" stroke-width="2"/><text x="{2}" y="{3}" class="cl">{4}{5}</text>"#,
            W - RIGHT + 10.0,
            W - RIGHT + 26.0,
            W - RIGHT + 30.0,
            ly + 4.0,
            esc(&s.name),
            esc(&p50)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// One curve of a scaling chart.
pub(crate) struct Curve {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Its colour index (curves of one backend share a colour).
    pub color: usize,
    pub dashed: bool,
}

/// Cycles/s against workers, both axes log; solid and dashed curves.
pub(crate) fn scaling_chart(title: &str, x_label: &str, curves: &[Curve]) -> String {
    let curves: Vec<&Curve> = curves.iter().filter(|c| !c.points.is_empty()).collect();
    let xs = curves.iter().flat_map(|c| c.points.iter().map(|p| p.0));
    let ys = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1));
    let (xlo, xhi) = xs.fold((f64::INFINITY, 0.0_f64), |(l, h), v| (l.min(v), h.max(v)));
    let (ylo, yhi) = ys
        .filter(|v| *v > 0.0)
        .fold((f64::INFINITY, 0.0_f64), |(l, h), v| (l.min(v), h.max(v)));
    let (Some(x), Some(y)) = (LogAxis::new(xlo, xhi, 2.0), LogAxis::new(ylo, yhi, 10.0)) else {
        return String::new();
    };
    let (top, plot_h): (f64, f64) = (28.0, 260.0);
    let plot_w = W - LEFT - RIGHT;
    let legend_h = 16.0 * curves.len() as f64 + 12.0;
    let height = (top + plot_h + 44.0).max(top + legend_h);
    let px = |v: f64| LEFT + x.at(v) * plot_w;
    let py = |v: f64| top + (1.0 - y.at(v)) * plot_h;
    let mut svg = svg_open(title, W, height);
    x_grid(&mut svg, &x, px, (top, plot_h), show_count);
    for t in y.ticks() {
        let _ = write!(
            svg,
            r##"<line x1="{LEFT}" y1="{0:.1}" x2="{1}" y2="{0:.1}" stroke="#edf2f7"/><text x="{2}" y="{3:.1}" class="cl" text-anchor="end">{4}</text>"##,
            py(t),
            LEFT + plot_w,
            LEFT - 4.0,
            py(t) + 4.0,
            show_count(t)
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{}" y="{}" class="cl" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        top + plot_h + 32.0,
        esc(x_label)
    );
    for (i, c) in curves.iter().enumerate() {
        let col = PALETTE[c.color % PALETTE.len()];
        let dash = if c.dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let pts: Vec<String> = c
            .points
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", px(*a), py(*b)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{col}" stroke-width="1.8"{dash}><title>{}</title></polyline>"#,
            pts.join(" "),
            esc(&c.name)
        );
        for (a, b) in &c.points {
            let _ = write!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{col}"><title>{}: {} at {a}: {b:.0}/s</title></circle>"#,
                px(*a),
                py(*b),
                esc(&c.name),
                esc(x_label)
            );
        }
        let ly = top + 6.0 + i as f64 * 16.0;
        let _ = write!(
            svg,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{col}" stroke-width="2"{dash}/><text x="{2}" y="{3}" class="cl">{4}</text>"#,
            W - RIGHT + 10.0,
            W - RIGHT + 30.0,
            W - RIGHT + 34.0,
            ly + 4.0,
            esc(&c.name)
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A Jepsen-style timeline: one lane per worker, a bar per hold with its
/// token, the overlapping pair in red, fault windows shaded.
pub(crate) fn timeline_chart(title: &str, t: &Timeline) -> String {
    if t.lanes.is_empty() || t.span_ms <= 0.0 {
        return String::new();
    }
    let (left, top, lane_h) = (86.0, 44.0, 26.0);
    let plot_w = TW - left - 20.0;
    let char_px = crate::chart::LABEL_CHAR_PX;
    // A label starts at its x, or ends at the right edge when it would run
    // off it.
    let anchor = |x: f64, chars: usize| {
        let w = chars as f64 * char_px;
        if x + w <= TW - 4.0 {
            format!(r#"x="{x:.1}""#)
        } else if w <= TW - 8.0 {
            format!(r#"x="{:.1}" text-anchor="end""#, TW - 4.0)
        } else {
            r#"x="4""#.to_string()
        }
    };
    let height = top + lane_h * t.lanes.len() as f64 + 40.0;
    let px = |ms: f64| left + (ms / t.span_ms).clamp(0.0, 1.0) * plot_w;
    let lane_y = |w: u32| {
        let i = t.lanes.iter().position(|l| *l == w).unwrap_or(0);
        top + i as f64 * lane_h
    };
    let mut svg = svg_open(title, TW, height);
    for (i, f) in t.faults.iter().enumerate() {
        let (x0, x1) = (px(f.start_ms), px(f.end_ms.unwrap_or(t.span_ms)));
        // The caption below the chart carries the whole description; the
        // label is cut to what fits across the chart with "fault: " and
        // the suffix.
        let suffix = if f.end_ms.is_none() {
            " (not undone in the window)"
        } else {
            ""
        };
        let fixed = "fault: ".len() + suffix.chars().count();
        let fits = |chars: usize| (fixed + chars) as f64 * char_px <= TW - 8.0;
        let n = f.what.chars().count();
        let label: String = if fits(n) {
            f.what.clone()
        } else {
            let room = (0..n).rev().find(|c| fits(*c)).unwrap_or(0);
            f.what
                .chars()
                .take(room.saturating_sub(1))
                .chain(['…'])
                .collect()
        };
        let _ = write!(
            svg,
            r##"<rect x="{x0:.1}" y="{0}" width="{1:.1}" height="{2}" fill="#fefcbf" stroke="#d69e2e" stroke-dasharray="3 2"><title>{3}</title></rect><text {6} y="{4}" class="cl">fault: {7}{5}</text>"##,
            top - 6.0,
            (x1 - x0).max(1.0),
            lane_h * t.lanes.len() as f64 + 6.0,
            esc(&f.what),
            28.0 + i as f64 * 12.0,
            suffix,
            anchor(
                x0,
                "fault: ".len() + label.chars().count() + suffix.chars().count()
            ),
            esc(&label)
        );
    }
    for w in &t.lanes {
        let y = lane_y(*w);
        let _ = write!(
            svg,
            r##"<line x1="{left}" y1="{0}" x2="{1}" y2="{0}" stroke="#edf2f7"/><text x="{2}" y="{3}" class="cl" text-anchor="end">worker {w}</text>"##,
            y + lane_h / 2.0,
            left + plot_w,
            left - 6.0,
            y + lane_h / 2.0 + 4.0
        );
    }
    for b in &t.bars {
        let (x0, x1) = (px(b.start_ms), px(b.end_ms));
        let y = lane_y(b.worker) + 4.0;
        let fill = if b.in_pair { "#c53030" } else { "#90cdf4" };
        let token = b
            .token
            .map_or("no token".to_string(), |k| format!("token {k}"));
        let told = match b.told {
            Some(harness::history::Told::Lost) => ", told lost",
            Some(harness::history::Told::Expired) => ", its lease had expired",
            _ => "",
        };
        let _ = write!(
            svg,
            r#"<rect x="{x0:.1}" y="{y}" width="{0:.1}" height="{1}" fill="{fill}" rx="2"{2}><title>worker {3}: {4} to {5}, {token}{told}{6}</title></rect>"#,
            (x1 - x0).max(1.5),
            lane_h - 8.0,
            if b.open {
                r##" stroke="#742a2a" stroke-dasharray="2 2""##
            } else {
                ""
            },
            b.worker,
            show_us(b.start_ms * 1000.0),
            show_us(b.end_ms * 1000.0),
            if b.open { ", never released" } else { "" }
        );
        // A token is written on its bar only where it fits inside it: a
        // label running past its bar covered the next bar's label (the
        // overlapping pair's tokens are in the caption whatever the width,
        // and every bar's token is in its tooltip).
        let label = b.token.map_or("-".to_string(), |k| k.to_string());
        if x1 - x0 >= label.chars().count() as f64 * char_px + 6.0 {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" class="cv"{}>{}</text>"#,
                x0 + 3.0,
                y + lane_h - 12.0,
                if b.in_pair {
                    r##" fill="#fff" font-weight="600""##
                } else {
                    ""
                },
                label
            );
        }
    }
    let at = px(t.at_ms);
    let bottom = top + lane_h * t.lanes.len() as f64;
    let _ = write!(
        svg,
        r##"<line x1="{at:.1}" y1="{0}" x2="{at:.1}" y2="{bottom}" stroke="#742a2a" stroke-width="1.5"/><text {5} y="{1}" class="cl">worker {2} acquires while worker {3} still holds: both inside for {4}</text>"##,
        top - 4.0,
        bottom + 16.0,
        t.second_worker,
        t.first_worker,
        show_us(t.overlap_ms * 1000.0),
        anchor(at, 70)
    );
    let _ = write!(
        svg,
        r#"<text x="{left}" y="{0}" class="cl">0</text><text x="{1}" y="{0}" class="cl" text-anchor="end">{2}</text>"#,
        bottom + 32.0,
        left + plot_w,
        show_us(t.span_ms * 1000.0)
    );
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness::timeline::{Bar, Window};

    #[test]
    fn a_log_axis_places_decades_evenly_and_clamps() {
        let x = LogAxis::new(30.0, 4000.0, 10.0).unwrap();
        assert_eq!((x.lo, x.hi), (10.0, 10_000.0));
        assert!((x.at(100.0) - 1.0 / 3.0).abs() < 1e-9);
        assert!((x.at(1000.0) - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(x.at(1.0), 0.0);
        assert_eq!(x.at(1e9), 1.0);
        assert_eq!(x.ticks(), vec![10.0, 100.0, 1000.0, 10_000.0]);
        assert!(LogAxis::new(0.0, 10.0, 10.0).is_none());
    }

    #[test]
    fn a_cdf_draws_its_floor_dashed_and_nothing_without_points() {
        let s = Cdf {
            name: "redis".into(),
            points: vec![[0.0, 80.0], [0.5, 120.0], [1.0, 900.0]],
            floor_us: Some(70.0),
        };
        let svg = cdf_chart("t", &[s]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("stroke-dasharray"), "floor dashed");
        assert!(svg.contains("redis p50 120 µs"));
        let empty = Cdf {
            name: "x".into(),
            points: vec![[0.5, 1.0]],
            floor_us: None,
        };
        assert_eq!(cdf_chart("t", &[empty]), "");
    }

    #[test]
    fn a_scaling_chart_has_a_point_per_figure_and_escapes_names() {
        let c = Curve {
            name: "a<b".into(),
            points: vec![(1.0, 100.0), (4.0, 400.0), (16.0, 300.0)],
            color: 0,
            dashed: true,
        };
        let svg = scaling_chart("t", "workers", &[c]);
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("a&lt;b") && !svg.contains("a<b"));
    }

    #[test]
    fn a_timeline_marks_the_pair_the_tokens_and_the_fault() {
        let bar = |worker, start_ms, end_ms, token, in_pair| Bar {
            worker,
            start_ms,
            end_ms,
            open: false,
            token: Some(token),
            in_pair,
            told: None,
        };
        let t = Timeline {
            key: "k".into(),
            span_ms: 100.0,
            lanes: vec![0, 1],
            bars: vec![
                bar(0, 10.0, 70.0, 41, true),
                bar(1, 40.0, 90.0, 42, true),
                bar(1, 0.0, 5.0, 40, false),
            ],
            first_worker: 0,
            second_worker: 1,
            at_ms: 40.0,
            overlap_ms: 30.0,
            faults: vec![Window {
                what: "holder-pause: worker 0".into(),
                start_ms: 20.0,
                end_ms: Some(60.0),
            }],
            left_out: 0,
        };
        let svg = timeline_chart("t", &t);
        assert_eq!(svg.matches(r##"fill="#c53030""##).count(), 2, "the pair");
        assert!(
            svg.contains(">41<") && svg.contains(">42<"),
            "tokens on bars"
        );
        assert!(svg.contains("fault: holder-pause: worker 0"));
        assert!(svg.contains("worker 1 acquires while worker 0 still holds"));
    }
}
