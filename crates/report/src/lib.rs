//! `report`: a comparison run's JSON -> one self-contained HTML page.
//!
//! The page has no external references (inline CSS, inline SVG charts, no
//! scripts), so it opens offline from disk. Every figure on it comes from
//! the [`Comparison`] it is given; the decision section is derived from
//! those figures by the rules in [`decisions`], never written by hand.

use std::fmt::Write as _;

use distlock::Capabilities;
use harness::summary::Summary;
use serde::{Deserialize, Serialize};

/// One comparison run: every backend on the same workloads, same machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// When it ran (UTC, `YYYYmmdd-HHMMSS`).
    pub generated_utc: String,
    /// lockbench version.
    pub tool_version: String,
    /// CPU cores of the machine (servers, workers and client share them).
    pub cores: usize,
    /// One row per backend.
    pub rows: Vec<Row>,
    /// Flash-sale variants beyond each backend's own coupon run: lock
    /// scopes, the lock-free baselines and the unlock-before-commit bug.
    pub sale: Vec<SaleRun>,
}

/// Everything measured for one backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Registry name.
    pub backend: String,
    /// What it is.
    pub about: String,
    /// A deliberately broken lock kept to prove the checkers work.
    pub negative_control: bool,
    /// For a negative control that only a fault exposes (a crash or pause
    /// at the wrong moment): that fault. Such a control passing a
    /// fault-free run is expected, not a broken checker.
    #[serde(default)]
    pub needs_fault: Option<String>,
    /// What it declares.
    pub capabilities: Capabilities,
    /// Ledger workload: overlap, fenced ledger, lost updates.
    pub ledger: Option<Summary>,
    /// Uncontended latency next to the raw floor and peers.
    pub latency: Option<Summary>,
    /// Throughput, all workers on one key.
    pub contended: Option<Summary>,
    /// Throughput, one key per worker.
    pub disjoint: Option<Summary>,
    /// Flash sale with a per-user lock.
    pub coupon: Option<Summary>,
}

/// One flash-sale variant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SaleRun {
    /// What varied, short (e.g. "redis, lock per voucher").
    pub label: String,
    /// How it works, one line.
    #[serde(default)]
    pub note: String,
    /// The backend whose servers it ran on.
    pub backend: String,
    /// Its summary (with `coupon` filled in).
    pub summary: Summary,
}

/// Rendering failed (a template bug: the message names it).
#[derive(Debug, thiserror::Error)]
#[error("report template: {0}")]
pub struct ReportError(#[from] minijinja::Error);

const TEMPLATE: &str = include_str!("../templates/report.html.j2");

/// The whole page.
///
/// # Errors
/// Only a broken template.
pub fn render(c: &Comparison) -> Result<String, ReportError> {
    let mut env = minijinja::Environment::new();
    // The .html name turns on HTML auto-escaping.
    env.add_template("report.html", TEMPLATE)?;
    let view = View::from(c);
    Ok(env.get_template("report.html")?.render(&view)?)
}

// ---- view model ----------------------------------------------------------

#[derive(Serialize)]
struct View<'a> {
    c: &'a Comparison,
    verdicts: Vec<Verdict>,
    decisions: Vec<String>,
    warnings: Vec<String>,
    latency_chart: String,
    throughput_chart: String,
    sale_chart: String,
    sales: Vec<SaleLine>,
}

#[derive(Serialize)]
struct Verdict {
    backend: String,
    control: bool,
    /// "safe", "unsafe" or "not run".
    class: &'static str,
    text: String,
}

#[derive(Serialize)]
struct SaleLine {
    label: String,
    note: String,
    s: Summary,
}

impl<'a> From<&'a Comparison> for View<'a> {
    fn from(c: &'a Comparison) -> Self {
        let mut sales: Vec<SaleLine> = c
            .rows
            .iter()
            .filter(|r| !r.negative_control)
            .filter_map(|r| {
                r.coupon.clone().map(|s| SaleLine {
                    label: format!("{}, lock per user+voucher", r.backend),
                    note: String::new(),
                    s,
                })
            })
            .collect();
        sales.extend(c.sale.iter().map(|s| SaleLine {
            label: s.label.clone(),
            note: s.note.clone(),
            s: s.summary.clone(),
        }));
        View {
            c,
            verdicts: c.rows.iter().map(verdict).collect(),
            decisions: decisions(c),
            warnings: warnings(c),
            latency_chart: latency_chart(c),
            throughput_chart: throughput_chart(c),
            sale_chart: bar_chart(
                "clicks per second (higher is better)",
                &sales
                    .iter()
                    .filter_map(|l| {
                        l.s.coupon
                            .as_ref()
                            .map(|k| (l.label.clone(), vec![("clicks/s", k.clicks_per_s)]))
                    })
                    .collect::<Vec<_>>(),
            ),
            sales,
        }
    }
}

/// Observed unsafety of one run: overlaps, lost updates, stale writes the
/// fenced ledger accepted, broken coupon invariants.
fn harm(s: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    if s.violations > 0 {
        out.push(format!(
            "{} overlapping critical sections (longest {:.1} ms)",
            s.violations, s.max_overlap_ms
        ));
    }
    if let Some(l) = &s.ledger {
        if l.lost_updates > 0 {
            out.push(format!("{} lost updates", l.lost_updates));
        }
        if l.fenceable && l.stale_writes_accepted > 0 {
            out.push(format!(
                "{} stale writes accepted by the fenced ledger",
                l.stale_writes_accepted
            ));
        }
    }
    if let Some(k) = &s.coupon {
        if !k.valid {
            out.push(format!(
                "flash sale broken: {} oversold, {} users with two orders",
                k.check.oversold, k.check.users_with_two_orders
            ));
        }
    }
    out
}

fn verdict(r: &Row) -> Verdict {
    let runs: Vec<&Summary> = [&r.ledger, &r.contended, &r.disjoint, &r.coupon]
        .into_iter()
        .flatten()
        .collect();
    let harms: Vec<String> = runs.iter().flat_map(|s| harm(s)).collect();
    let (class, text) = if runs.is_empty() {
        ("not-run", "not run".to_string())
    } else if !harms.is_empty() {
        (
            "unsafe",
            format!("UNSAFE in these runs: {}", harms.join("; ")),
        )
    } else if let Some(fault) = r.needs_fault.as_deref().filter(|_| r.negative_control) {
        (
            "caveat",
            format!("no overlap observed, as expected without a fault: it breaks only under {fault}, which these runs do not inject"),
        )
    } else if !r.capabilities.fencing {
        (
            "caveat",
            "no overlap or lost update observed; no safe fencing token (a paused holder cannot be stopped at the resource)".to_string(),
        )
    } else {
        (
            "safe",
            "no overlap, lost update or accepted stale write observed; fenced".to_string(),
        )
    };
    Verdict {
        backend: r.backend.clone(),
        control: r.negative_control,
        class,
        text,
    }
}

/// "Which lock for which job", from the numbers alone.
pub fn decisions(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    let clean: Vec<&Row> = c
        .rows
        .iter()
        .filter(|r| !r.negative_control && verdict(r).class != "unsafe" && r.ledger.is_some())
        .collect();
    let best = |f: &dyn Fn(&Row) -> Option<f64>, low: bool| -> Option<(&Row, f64)> {
        clean
            .iter()
            .filter_map(|r| f(r).filter(|v| *v > 0.0).map(|v| (*r, v)))
            .min_by(|a, b| {
                let o = a.1.total_cmp(&b.1);
                if low {
                    o
                } else {
                    o.reverse()
                }
            })
    };
    if let Some((r, v)) = best(&|r| r.latency.as_ref().map(|s| s.cycle_p50_us), true) {
        let ratio = r
            .latency
            .as_ref()
            .and_then(|s| s.floor_ratio)
            .map(|x| format!(", {x:.2}x its raw floor"))
            .unwrap_or_default();
        out.push(format!(
            "Lowest uncontended cost: {} ({v:.0} µs per acquire + release at p50{ratio}).",
            r.backend
        ));
    }
    if let Some((r, v)) = best(&|r| r.contended.as_ref().map(|s| s.throughput_per_s), false) {
        out.push(format!(
            "Most hand-overs per second on one hot key: {} ({v:.0} cycles/s).",
            r.backend
        ));
    }
    let fenced: Vec<&str> = clean
        .iter()
        .filter(|r| r.capabilities.fencing)
        .map(|r| r.backend.as_str())
        .collect();
    let unfenced: Vec<&str> = clean
        .iter()
        .filter(|r| !r.capabilities.fencing)
        .map(|r| r.backend.as_str())
        .collect();
    if !fenced.is_empty() {
        out.push(format!(
            "When a paused or partitioned holder must not corrupt data (the GC-pause scenario), use a lock with a fencing token the resource checks: {}.{}",
            fenced.join(", "),
            if unfenced.is_empty() {
                String::new()
            } else {
                format!(
                    " Not {}: no safe token, so the resource cannot reject a stale holder.",
                    unfenced.join(", ")
                )
            }
        ));
    }
    let sale_rate = |label_has: &str| -> Option<(String, f64)> {
        let mut all: Vec<(String, f64, bool)> = c
            .rows
            .iter()
            .filter_map(|r| {
                r.coupon.as_ref().and_then(|s| s.coupon.as_ref()).map(|k| {
                    (
                        format!("{}, lock per user+voucher", r.backend),
                        k.clicks_per_s,
                        k.valid,
                    )
                })
            })
            .collect();
        all.extend(c.sale.iter().filter_map(|s| {
            s.summary
                .coupon
                .as_ref()
                .map(|k| (s.label.clone(), k.clicks_per_s, k.valid))
        }));
        all.into_iter()
            .filter(|(l, _, ok)| *ok && l.contains(label_has))
            .map(|(l, v, _)| (l, v))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    };
    if let (Some((lock_l, lock_v)), Some((free_l, free_v))) =
        (sale_rate("lock per"), sale_rate("baseline"))
    {
        out.push(format!(
            "Flash sale: the fastest correct lock-based variant ({lock_l}) sold at {lock_v:.0} clicks/s; the fastest lock-free baseline ({free_l}) at {free_v:.0} clicks/s, {:.1}x. Where the invariant fits in one atomic statement or script, no distributed lock is needed.",
            free_v / lock_v
        ));
    }
    // Same backend, only the scope differs.
    if let (Some((_, user)), Some((_, voucher))) = (
        sale_rate("redis, lock per user+voucher"),
        sale_rate("redis, lock per voucher"),
    ) {
        out.push(format!(
            "Lock granularity (redis): a lock per user+voucher sold {:.1}x faster than one lock per voucher; the stock itself stays safe through UPDATE .. WHERE stock > 0, the lock only has to keep one user's clicks apart.",
            user / voucher
        ));
    }
    out
}

/// Things the reader must not miss: a negative control nobody caught means
/// a checker is broken.
fn warnings(c: &Comparison) -> Vec<String> {
    let mut out = Vec::new();
    for r in c.rows.iter().filter(|r| r.negative_control) {
        if r.ledger.is_some() && verdict(r).class != "unsafe" && r.needs_fault.is_none() {
            out.push(format!(
                "Negative control {} was NOT caught in this run: treat every verdict here with suspicion.",
                r.backend
            ));
        }
    }
    for r in c.rows.iter().filter(|r| !r.negative_control) {
        let v = verdict(r);
        if v.class == "unsafe" {
            out.push(format!("{}: {}", r.backend, v.text));
        }
    }
    for s in &c.sale {
        if let Some(k) = &s.summary.coupon {
            if !k.valid && !s.label.contains("bug") {
                out.push(format!("{}: flash-sale invariants broken", s.label));
            }
        }
    }
    out
}

// ---- charts (inline SVG) ---------------------------------------------------

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: &[&str] = &["#2b6cb0", "#a0aec0", "#dd6b20", "#38a169", "#805ad5"];

/// Horizontal grouped bars: one group per label, one bar per series.
fn bar_chart(title: &str, groups: &[(String, Vec<(&str, f64)>)]) -> String {
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
    let (label_w, plot_w, bar_h, gap) = (250.0, 430.0, 14.0, 10.0);
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

fn latency_chart(c: &Comparison) -> String {
    let groups: Vec<(String, Vec<(&str, f64)>)> = c
        .rows
        .iter()
        .filter_map(|r| {
            let s = r.latency.as_ref()?;
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

fn throughput_chart(c: &Comparison) -> String {
    let groups: Vec<(String, Vec<(&str, f64)>)> = c
        .rows
        .iter()
        .filter(|r| r.contended.is_some() || r.disjoint.is_some())
        .map(|r| {
            let mut bars = Vec::new();
            if let Some(s) = &r.contended {
                bars.push(("one key, cycles/s", s.throughput_per_s));
            }
            if let Some(s) = &r.disjoint {
                bars.push(("one key per worker, cycles/s", s.throughput_per_s));
            }
            (r.backend.clone(), bars)
        })
        .collect();
    bar_chart("throughput (higher is better)", &groups)
}
