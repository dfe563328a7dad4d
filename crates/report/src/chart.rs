//! Inline SVG bar charts (no scripts, no external references).

use std::fmt::Write as _;

use crate::model::Comparison;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Width of one character of an 11 px sans-serif label, with room to
/// spare: DejaVu Sans (the usual Linux fallback) runs about 6.1 px for
/// lower case and 7 px for digits, wider than the fonts of a Mac or
/// Windows, so a label measured this way fits everywhere.
pub(crate) const LABEL_CHAR_PX: f64 = 6.8;

const COLORS: &[&str] = &["#2b6cb0", "#a0aec0", "#dd6b20", "#38a169", "#805ad5"];

/// Horizontal grouped bars: one group per label, one bar per series.
pub(crate) fn bar_chart(title: &str, groups: &[(String, Vec<(&str, f64)>)]) -> String {
    if groups.is_empty() {
        return String::new();
    }
    let max = groups
        .iter()
        .flat_map(|(_, s)| s.iter().map(|(_, v)| *v))
        .fold(0.0_f64, f64::max);
    if max <= 0.0 {
        return String::new();
    }
    let names: Vec<&str> = {
        let mut n: Vec<&str> = Vec::new();
        for (_, s) in groups {
            for (name, _) in s {
                if !n.contains(name) {
                    n.push(name);
                }
            }
        }
        n
    };
    // The labels end at the bars, so the column must hold the longest
    // one: a fixed width cut long variant names off at the left edge.
    let longest = groups
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let label_w = (longest as f64 * LABEL_CHAR_PX + 16.0).max(120.0);
    let (plot_w, bar_h, gap) = (430.0, 14.0, 10.0);
    let group_h = |n: usize| n as f64 * bar_h + gap;
    let height: f64 = 40.0 + groups.iter().map(|(_, s)| group_h(s.len())).sum::<f64>() + 24.0;
    let width = label_w + plot_w + 90.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" aria-label="{t}"><text x="0" y="14" class="ct">{t}</text>"#,
        t = esc(title)
    );
    // Legend.
    let mut lx = label_w;
    for (i, n) in names.iter().enumerate() {
        let _ = write!(
            svg,
            r#"<rect x="{lx}" y="22" width="10" height="10" fill="{}"/><text x="{}" y="31" class="cl">{}</text>"#,
            COLORS[i % COLORS.len()],
            lx + 14.0,
            esc(n)
        );
        lx += 24.0 + 7.0 * n.len() as f64;
    }
    let mut y = 40.0;
    for (label, series) in groups {
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" class="cl" text-anchor="end">{}</text>"#,
            label_w - 8.0,
            y + bar_h * series.len() as f64 / 2.0 + 4.0,
            esc(label)
        );
        for (name, v) in series {
            let i = names.iter().position(|n| n == name).unwrap_or(0);
            let w = (v / max * plot_w).max(1.0);
            let _ = write!(
                svg,
                r#"<rect x="{label_w}" y="{y}" width="{w:.1}" height="{}" fill="{}"><title>{}: {} = {v:.1}</title></rect><text x="{:.1}" y="{:.1}" class="cv">{}</text>"#,
                bar_h - 2.0,
                COLORS[i % COLORS.len()],
                esc(label),
                esc(name),
                label_w + w + 4.0,
                y + bar_h - 4.0,
                fmt_num(*v)
            );
            y += bar_h;
        }
        y += gap;
    }
    svg.push_str("</svg>");
    svg
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Uncontended cycle p50 next to the raw floor, per backend.
pub(crate) fn latency_chart(c: &Comparison) -> String {
    let groups: Vec<(String, Vec<(&str, f64)>)> = c
        .rows
        .iter()
        .filter_map(|r| {
            let s = r.latency_measured()?;
            let mut bars = vec![("lock cycle p50 µs", s.cycle_p50_us)];
            if let Some(f) = s.floor_p50_us {
                bars.push(("raw floor p50 µs", f));
            }
            Some((r.backend.clone(), bars))
        })
        .collect();
    bar_chart(
        "uncontended acquire + release vs raw floor (lower is better)",
        &groups,
    )
}

/// Cycles per second on one key and on one key per worker, per backend.
pub(crate) fn throughput_chart(c: &Comparison) -> String {
    let groups: Vec<(String, Vec<(&str, f64)>)> = c
        .rows
        .iter()
        .filter_map(|r| {
            let mut bars = Vec::new();
            if let Some(s) = r.contended_measured() {
                bars.push(("one key, cycles/s", s.throughput_per_s));
            }
            if let Some(s) = r.disjoint_measured() {
                bars.push(("one key per worker, cycles/s", s.throughput_per_s));
            }
            (!bars.is_empty()).then(|| (r.backend.clone(), bars))
        })
        .collect();
    bar_chart("throughput (higher is better)", &groups)
}
