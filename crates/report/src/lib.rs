//! `report`: a comparison run's JSON -> one self-contained HTML page.
//!
//! The page has no external references (inline CSS, inline SVG charts, no
//! scripts), so it opens offline from disk. Every figure on it comes from
//! the [`Comparison`] it is given; the decision section is derived from
//! those figures by the rules in [`decisions()`], never written by hand.
//!
//! The crate is split along the page's seams: the model (`model.rs`, what
//! `comparison.json` holds), the verdict per backend (`verdict.rs`), the
//! decision guide and warnings (`decisions.rs`), the fault matrix
//! (`faults.rs`) and the SVG charts
//! (`chart.rs`); this file turns them into the page.
//!
//! ```
//! let c = report::Comparison {
//!     format: report::FORMAT,
//!     scaling: Vec::new(),
//!     benches: None,
//!     interrupted: None,
//!     generated_utc: "20261202-120000".into(),
//!     tool_version: "0.1.0".into(),
//!     cores: 2,
//!     rows: Vec::new(),
//!     sale: Vec::new(),
//!     faults: Vec::new(),
//!     measured: None,
//! };
//! assert!(report::decisions(&c).is_empty());
//! assert!(report::render(&c)?.starts_with("<!doctype html>"));
//! # Ok::<(), report::ReportError>(())
//! ```

pub mod benches;
mod chart;
mod decisions;
mod fairness;
mod faults;
mod figures;
mod guide;
mod model;
pub mod stats;
mod verdict;

use harness::summary::Summary;
use serde::Serialize;

pub use decisions::{decisions, outages};
pub use fairness::fairness_lines;
pub use faults::fault_lines;
pub use guide::{guide, Answer};
pub use model::{load, LoadError, LockTimeout, ServersNeeded};
pub use model::{
    Comparison, FaultCell, Measured, Profile, Row, SaleRun, Samples, ScalePoint, FORMAT,
};
pub use verdict::harm;

use verdict::Verdict;

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
    faults: Vec<faults::Judged>,
    fault_names: Vec<String>,
    decisions: Vec<String>,
    warnings: Vec<String>,
    latency_chart: String,
    throughput_chart: String,
    sale_chart: String,
    sales: Vec<SaleLine>,
    repeats: Option<RepeatsView>,
    guide: Vec<Answer>,
    latency_cdf: String,
    contended_cdf: String,
    scaling_chart: String,
    scaling_source: String,
    scaling_rows: Vec<Vec<String>>,
    scaling_heads: Vec<String>,
    timelines: Vec<TimelineView>,
    costs: Vec<Vec<String>>,
    bench: Option<BenchView>,
    /// Fairness of each one-key throughput run, beside the declared `fair`.
    fair: Vec<fairness::FairCell>,
    /// Per row of `c.rows` (same index): which runs measured anything.
    measured: Vec<RowMeasured>,
    /// [`SATURATED_BELOW`] in per cent, for the page's explanation.
    saturated_below_pct: f64,
}

/// Which of one row's runs measured nothing, and why, so the page says
/// "not measured" where a run's figures are the zeros of an empty set.
/// `None`: the run measured (or did not run: the template checks that).
#[derive(Serialize)]
struct RowMeasured {
    latency: Option<String>,
    contended: Option<String>,
    disjoint: Option<String>,
    /// The open-loop point, as one cell.
    open_loop: Option<OpenLoopView>,
}

/// An open-loop point is taken as saturated when it achieved less than
/// this share of the rate it offered. A run that keeps up achieves the
/// offered rate within the spread of its Poisson arrivals, about 1/√n
/// (2 % for 2,000 arrivals, the compare default), so 90 % is several
/// spreads below: a run under it fell behind, and its latencies are mostly
/// the backlog it built.
const SATURATED_BELOW: f64 = 0.9;

/// The open-loop point of one backend, offered against achieved.
#[derive(Serialize)]
struct OpenLoopView {
    /// What the cell says.
    text: String,
    /// It could not keep up with the offered rate (achieved below
    /// [`SATURATED_BELOW`] of it).
    saturated: bool,
}

/// "not measured: ..." for a run that acquired nothing, with what the
/// run recorded about why.
fn not_measured(s: &Summary) -> String {
    let died = s.worker_deaths.first().map_or(String::new(), |d| {
        format!(
            "; worker {} died: {}{}",
            d.worker,
            d.message,
            match s.worker_deaths.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        )
    });
    format!(
        "not measured: no acquire succeeded ({} failed, {} unknown{died})",
        s.ops_failed, s.ops_info
    )
}

fn open_loop_view(r: &Row) -> Option<OpenLoopView> {
    let s = r.open_loop.as_ref()?;
    let offered = s.open_loop_rate?;
    let Some(m) = r.open_loop_measured() else {
        return Some(OpenLoopView {
            text: format!("offered {offered:.0}/s: not measured (0 acquisitions)"),
            saturated: false,
        });
    };
    // Successful cycles over the measured wall time: what the lock served.
    let achieved = m.throughput_per_s;
    let share = if offered > 0.0 {
        achieved / offered
    } else {
        0.0
    };
    let saturated = share < SATURATED_BELOW;
    let p99 = if m.cycle.count >= 1000 {
        format!("{:.0}", m.cycle.p99_us)
    } else {
        "n < 1,000".to_string()
    };
    let figures = format!(
        "offered {offered:.0}/s, achieved {achieved:.0}/s ({:.0} %): p50 {:.0} / p99 {p99} µs",
        share * 100.0,
        m.cycle.p50_us
    );
    Some(OpenLoopView {
        text: if saturated {
            format!("beyond capacity: latencies include queueing; {figures}")
        } else {
            figures
        },
        saturated,
    })
}

/// One violation's timeline.
#[derive(Serialize)]
struct TimelineView {
    title: String,
    svg: String,
    caption: String,
}

/// `cargo bench` figures as table rows.
#[derive(Serialize)]
struct BenchView {
    source: String,
    /// backend, floor, uncontended, ratio, try_held.
    uncontended: Vec<[String; 5]>,
    /// group, id, median, interval.
    all: Vec<[String; 4]>,
    /// target, figure, outcome.
    targets: Vec<[String; 3]>,
}

fn latency_cdfs(c: &Comparison) -> String {
    let series: Vec<figures::Cdf> = c
        .rows
        .iter()
        .filter_map(|r| {
            let s = r.latency_measured()?;
            Some(figures::Cdf {
                name: r.backend.clone(),
                points: s.cycle.cdf.clone(),
                floor_us: s.floor_p50_us,
            })
        })
        .collect();
    figures::cdf_chart(
        "uncontended acquire + release: share of cycles within a time (left is faster)",
        &series,
    )
}

fn contended_cdfs(c: &Comparison) -> String {
    let series: Vec<figures::Cdf> = c
        .rows
        .iter()
        .filter_map(|r| {
            let s = r.contended_measured()?;
            Some(figures::Cdf {
                name: r.backend.clone(),
                points: s.acquire.cdf.clone(),
                floor_us: None,
            })
        })
        .collect();
    figures::cdf_chart(
        "acquire latency on one hot key, worker processes contending (throughput runs)",
        &series,
    )
}

/// The scaling chart and table: from the scaling phase, else from the
/// `cargo bench` contended groups.
fn scaling(c: &Comparison) -> (String, String, Vec<String>, Vec<Vec<String>>) {
    let mut backends: Vec<&str> = Vec::new();
    for p in &c.scaling {
        if !backends.contains(&p.backend.as_str()) {
            backends.push(&p.backend);
        }
    }
    let fmt = |v: Option<f64>, d: usize| v.map_or("-".to_string(), |v| format!("{v:.d$}"));
    if !backends.is_empty() {
        let mut curves = Vec::new();
        let mut rows = Vec::new();
        for (i, b) in backends.iter().enumerate() {
            let pts: Vec<&ScalePoint> = c.scaling.iter().filter(|p| p.backend == *b).collect();
            for (one, name) in [(true, "one key"), (false, "a key each")] {
                curves.push(figures::Curve {
                    name: format!("{b}, {name}"),
                    points: pts
                        .iter()
                        .filter_map(|p| {
                            let v = if one {
                                p.one_key_per_s
                            } else {
                                p.key_each_per_s
                            };
                            v.filter(|v| *v > 0.0).map(|v| (f64::from(p.workers), v))
                        })
                        .collect(),
                    color: i,
                    dashed: !one,
                });
            }
            let fair = fairness::declared(c, b);
            for p in pts {
                let f = p.fairness.as_ref();
                rows.push(vec![
                    b.to_string(),
                    p.workers.to_string(),
                    fmt(p.one_key_per_s, 0),
                    fmt(p.key_each_per_s, 0),
                    fmt(p.handover_p50_us, 0),
                    fmt(p.handover_p99_us, 0),
                    fmt(p.acquire_p99_us, 0),
                    fmt(p.round_trips_per_acquire, 2),
                    match (p.servers_cpu_us_per_cycle, p.workers_cpu_us_per_cycle) {
                        (None, None) => "-".to_string(),
                        (srv, wk) => format!("{}, {}", fmt(srv, 0), fmt(wk, 0)),
                    },
                    // Comparisons from before `fairness` have the ratio only.
                    match f {
                        Some(_) => fairness::spread_text(f),
                        None => fmt(p.acquire_spread, 2),
                    },
                    fairness::wait_text(f.and_then(|f| f.longest_wait.as_ref())),
                    if fair { "yes" } else { "no" }.to_string(),
                    fairness::finding(fair, f)
                        .map(|x| format!("finding: {x}"))
                        .unwrap_or_default(),
                    p.failures.join("; "),
                ]);
            }
        }
        let heads = [
            "backend",
            "worker processes",
            "one key: cycles/s",
            "a key each: cycles/s",
            "hand-over p50 µs",
            "hand-over p99 µs",
            "acquire p99 µs",
            "round trips / acquire",
            "CPU µs per cycle (servers, workers)",
            "acquires per worker, max ÷ min",
            "longest wait while others acquired",
            "declared fair",
            "fairness",
            "failed",
        ];
        return (
            figures::scaling_chart(
                "cycles per second against worker processes (solid: all on one key; dashed: a key each)",
                "worker processes (log scale)",
                &curves,
            ),
            "the scaling phase of this comparison (worker processes, each run on fresh servers)".into(),
            heads.iter().map(|h| h.to_string()).collect(),
            rows,
        );
    }
    let Some(b) = &c.benches else {
        return (String::new(), String::new(), Vec::new(), Vec::new());
    };
    let mut curves = Vec::new();
    let mut rows = Vec::new();
    for (i, name) in b.backends().into_iter().enumerate() {
        for (one, label) in [(true, "one key"), (false, "a key each")] {
            let points: Vec<(f64, f64)> = [1usize, 4, 16, 64]
                .iter()
                .filter_map(|t| b.contended_per_s(name, *t, one).map(|v| (*t as f64, v)))
                .collect();
            for (t, v) in &points {
                rows.push(vec![
                    name.to_string(),
                    format!("{t}"),
                    label.to_string(),
                    format!("{v:.0}"),
                ]);
            }
            curves.push(figures::Curve {
                name: format!("{name}, {label}"),
                points,
                color: i,
                dashed: !one,
            });
        }
    }
    (
        figures::scaling_chart(
            "cycles per second against tasks in one process (cargo bench; solid: one key; dashed: a key each)",
            "tasks (log scale)",
            &curves,
        ),
        format!("`cargo bench` ({})", b.source),
        ["backend", "tasks", "keys", "cycles/s"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
        rows,
    )
}

/// A timeline for every run with a violation that kept one.
fn timelines(c: &Comparison) -> Vec<TimelineView> {
    let mut runs: Vec<(String, &Summary)> = Vec::new();
    for r in &c.rows {
        for (w, s) in [
            ("ledger", &r.ledger),
            ("latency", &r.latency),
            ("one key", &r.contended),
            ("a key each", &r.disjoint),
            ("flash sale", &r.coupon),
        ] {
            if let Some(s) = s {
                runs.push((format!("{}, {w}", r.backend), s));
            }
        }
    }
    for f in &c.faults {
        runs.push((format!("{} under {}", f.backend, f.fault), &f.summary));
    }
    for s in &c.sale {
        runs.push((format!("flash sale: {}", s.label), &s.summary));
    }
    runs.into_iter()
        .filter_map(|(what, s)| {
            let t = s.timeline.as_ref()?;
            let tokens = t
                .bars
                .iter()
                .filter(|b| b.in_pair)
                .map(|b| {
                    format!(
                        "worker {} token {}",
                        b.worker,
                        b.token.map_or("none".into(), |k| k.to_string())
                    )
                })
                .collect::<Vec<_>>()
                .join(" and ");
            Some(TimelineView {
                svg: figures::timeline_chart(
                    &format!(
                        "{what}: key {}, {} overlap(s) in the run",
                        t.key, s.violations
                    ),
                    t,
                ),
                caption: format!(
                    "{what}: {tokens} inside together for {}; {} hold(s) shown{}{}.",
                    figures::show_us(t.overlap_ms * 1000.0),
                    t.bars.len(),
                    if t.left_out > 0 {
                        format!(", {} more left out", t.left_out)
                    } else {
                        String::new()
                    },
                    if t.faults.is_empty() {
                        ", no fault in the window".to_string()
                    } else {
                        format!(
                            ", fault: {}",
                            t.faults
                                .iter()
                                .map(|f| f.what.clone())
                                .collect::<Vec<_>>()
                                .join("; ")
                        )
                    }
                ),
                title: what,
            })
        })
        .collect()
}

fn costs(c: &Comparison) -> Vec<Vec<String>> {
    let n = |v: Option<u32>| v.map_or("cannot".to_string(), |v| v.to_string());
    c.rows
        .iter()
        .filter(|r| !r.negative_control)
        .map(|r| {
            let s = r.servers.clone().unwrap_or_default();
            // A run with no successful acquire has no round trips per
            // acquire to show (its 0.00 is the mean of nothing).
            let rt = |x: &Option<Summary>| match x {
                None => "-".to_string(),
                Some(s) if s.ops_ok == 0 => "not measured (0 acquisitions)".to_string(),
                Some(s) => format!("{:.2}", s.acquire_round_trips_mean),
            };
            vec![
                r.backend.clone(),
                if s.started.is_empty() {
                    "not recorded".into()
                } else {
                    format!(
                        "{} ({} process{})",
                        s.started,
                        s.count,
                        if s.count == 1 { "" } else { "es" }
                    )
                },
                n(s.for_one_failure),
                n(s.for_two_failures),
                rt(&r.latency),
                rt(&r.contended),
                s.rule,
            ]
        })
        .collect()
}

fn bench_view(c: &Comparison) -> Option<BenchView> {
    let b = c.benches.as_ref()?;
    let us = |ns: f64| format!("{:.1}", ns / 1000.0);
    let mut uncontended = Vec::new();
    let mut targets = Vec::new();
    for name in b.backends() {
        let Some(u) = b.get("uncontended", name) else {
            continue;
        };
        let floor = b.get("floor", name);
        let ratio = floor.filter(|f| f.median_ns > 0.0).map(|f| {
            (
                u.median_ns / f.median_ns,
                u.low_ns / f.high_ns.max(1.0),
                u.high_ns / f.low_ns.max(1.0),
            )
        });
        uncontended.push([
            name.to_string(),
            floor.map_or("-".into(), |f| us(f.median_ns)),
            format!("{} [{}–{}]", us(u.median_ns), us(u.low_ns), us(u.high_ns)),
            ratio.map_or("-".into(), |r| {
                format!("{:.2}× [{:.2}–{:.2}]", r.0, r.1, r.2)
            }),
            b.get("try_held", name)
                .map_or("-".into(), |f| us(f.median_ns)),
        ]);
        if let Some((r, lo, hi)) = ratio {
            targets.push([
                format!("{name} ≤ 1.15× its raw floor"),
                format!("{r:.2}× [{lo:.2}–{hi:.2}]"),
                bench_outcome(lo, hi, 1.15).into(),
            ]);
        }
    }
    if let (Some(rl), Some(r)) = (
        b.get("uncontended", "redlock"),
        b.get("uncontended", "redis"),
    ) {
        let (x, lo, hi) = (
            rl.median_ns / r.median_ns.max(1.0),
            rl.low_ns / r.high_ns.max(1.0),
            rl.high_ns / r.low_ns.max(1.0),
        );
        targets.push([
            "redlock ≤ 1.3× redis".into(),
            format!("{x:.2}× [{lo:.2}–{hi:.2}]"),
            bench_outcome(lo, hi, 1.3).into(),
        ]);
    }
    let all = b
        .figures
        .iter()
        .map(|f| {
            [
                f.group.clone(),
                f.id.clone(),
                us(f.median_ns),
                format!("{}–{}", us(f.low_ns), us(f.high_ns)),
            ]
        })
        .collect();
    Some(BenchView {
        source: b.source.clone(),
        uncontended,
        all,
        targets,
    })
}

/// Met when the whole interval is within the target.
fn bench_outcome(lo: f64, hi: f64, target: f64) -> &'static str {
    if hi <= target {
        "met"
    } else if lo > target {
        "missed"
    } else {
        "inconclusive"
    }
}

/// The repeated-measurement section, as text cells.
#[derive(Serialize)]
struct RepeatsView {
    repeats: u32,
    aa: Option<String>,
    /// The profiles that ran, for the heading ("durable and volatile",
    /// "durable"): a heading naming both over one profile's table misled.
    ran: String,
    profiles: Vec<ProfileView>,
    /// Durable ÷ volatile per backend, when both ran.
    price: Vec<[String; 4]>,
    /// The project's speed targets against the durable repeats: target,
    /// the figure with its interval, met / missed / inconclusive.
    targets: Vec<[String; 3]>,
}

#[derive(Serialize)]
struct ProfileView {
    durability: String,
    ran: bool,
    settings: Vec<String>,
    first_order: String,
    rows: Vec<[String; 7]>,
}

fn est(v: &[f64], digits: usize) -> String {
    stats::Estimate::of(v).map_or("-".into(), |e| e.show(digits))
}

fn repeats_view(c: &Comparison) -> Option<RepeatsView> {
    let m = c.measured.as_ref()?;
    let profiles: Vec<ProfileView> = m
        .profiles
        .iter()
        .map(|p| ProfileView {
            durability: p.durability.clone(),
            ran: p.ran,
            settings: p.settings.clone(),
            first_order: p.orders.first().map(|o| o.join(" → ")).unwrap_or_default(),
            rows: p
                .backends
                .iter()
                .map(|s| {
                    [
                        s.backend.clone(),
                        est(&s.cycle_p50_measured_us(), 1),
                        est(&s.floor_p50_us, 1),
                        est(&s.floor_ratio, 2),
                        est(&s.paired_diff_us, 1),
                        est(&s.handovers_per_s, 0),
                        est(&s.disjoint_per_s, 0),
                    ]
                })
                .collect(),
        })
        .collect();
    let durable = m
        .profiles
        .iter()
        .find(|p| p.ran && p.durability == "durable");
    let volatile = m
        .profiles
        .iter()
        .find(|p| p.ran && p.durability == "volatile");
    let mut price = Vec::new();
    if let (Some(d), Some(v)) = (durable, volatile) {
        for sd in &d.backends {
            if let Some(sv) = v.backends.iter().find(|s| s.backend == sd.backend) {
                let r = |f: fn(&Samples) -> Vec<f64>| {
                    stats::Estimate::ratio(&f(sd), &f(sv))
                        .map_or("-".into(), |e| format!("{}×", e.show(2)))
                };
                price.push([
                    sd.backend.clone(),
                    r(Samples::cycle_p50_measured_us),
                    r(|s| s.handovers_per_s.clone()),
                    r(|s| s.disjoint_per_s.clone()),
                ]);
            }
        }
    }
    let mut targets = Vec::new();
    if let Some(d) = durable {
        for sd in d.backends.iter().filter(|s| !s.backend.ends_with("(A/A)")) {
            if let Some(e) = stats::Estimate::of(&sd.floor_ratio) {
                targets.push([
                    format!("{} ≤ 1.15× its raw floor", sd.backend),
                    format!("{}×", e.show(2)),
                    stats::target(&e, 1.15).to_string(),
                ]);
            }
        }
        let find = |n: &str| d.backends.iter().find(|s| s.backend == n);
        if let (Some(rl), Some(r)) = (find("redlock"), find("redis")) {
            if let Some(e) =
                stats::Estimate::ratio(&rl.cycle_p50_measured_us(), &r.cycle_p50_measured_us())
            {
                targets.push([
                    "redlock ≤ 1.3× redis (cycle p50, separate fleets)".into(),
                    format!("{}×", e.show(2)),
                    stats::target(&e, 1.3).to_string(),
                ]);
            }
        }
    }
    let ran: Vec<&str> = profiles
        .iter()
        .filter(|p| p.ran)
        .map(|p| p.durability.as_str())
        .collect();
    let ran = ran.join(" and ");
    Some(RepeatsView {
        repeats: m.repeats,
        aa: m.aa_backend.clone(),
        ran,
        profiles,
        price,
        targets,
    })
}

#[derive(Serialize)]
struct SaleLine {
    label: String,
    note: String,
    s: Summary,
    /// Orders over the time until the last is in PostgreSQL.
    durable_orders_per_s: Option<f64>,
}

impl<'a> From<&'a Comparison> for View<'a> {
    fn from(c: &'a Comparison) -> Self {
        // A broken lock's sale is not shown; the variants always are.
        let sales: Vec<SaleLine> = c
            .sales()
            .into_iter()
            .filter(|s| !s.negative_control)
            .map(|s| SaleLine {
                durable_orders_per_s: s.coupon().and_then(|k| {
                    model::durably_sold_out_ms(k)
                        .filter(|ms| *ms > 0.0)
                        .map(|ms| k.check.orders as f64 * 1000.0 / ms)
                }),
                note: s.note.to_string(),
                s: s.summary.clone(),
                label: s.label,
            })
            .collect();
        let scale = scaling(c);
        View {
            c,
            verdicts: c
                .rows
                .iter()
                .map(|r| {
                    let mut v = verdict::verdict(r, &faults::judged(c));
                    // Green needs the whole suite: the fault runs that
                    // did not happen could have broken it.
                    if c.interrupted.is_some() && v.class == verdict::VerdictClass::Safe {
                        v.class = verdict::VerdictClass::Caveat;
                        v.text.push_str("; the comparison was cut short, so not every run happened");
                    }
                    v
                })
                .collect(),
            faults: faults::judged(c),
            fault_names: {
                let mut names: Vec<String> = Vec::new();
                for f in &c.faults {
                    if !names.contains(&f.fault) {
                        names.push(f.fault.clone());
                    }
                }
                names
            },
            decisions: decisions(c),
            warnings: decisions::warnings(c),
            latency_chart: chart::latency_chart(c),
            throughput_chart: chart::throughput_chart(c),
            sale_chart: chart::bar_chart(
                "durable orders per second: orders ÷ time until the last is in PostgreSQL (higher is better)",
                &sales
                    .iter()
                    .filter_map(|l| {
                        l.durable_orders_per_s
                            .map(|v| (l.label.clone(), vec![("orders/s", v)]))
                    })
                    .collect::<Vec<_>>(),
            ),
            sales,
            repeats: repeats_view(c),
            guide: guide(c),
            latency_cdf: latency_cdfs(c),
            contended_cdf: contended_cdfs(c),
            scaling_chart: scale.0,
            scaling_source: scale.1,
            scaling_heads: scale.2,
            scaling_rows: scale.3,
            timelines: timelines(c),
            costs: costs(c),
            bench: bench_view(c),
            fair: fairness::cells(c),
            measured: c
                .rows
                .iter()
                .map(|r| RowMeasured {
                    latency: r
                        .latency
                        .as_ref()
                        .filter(|_| r.latency_measured().is_none())
                        .map(not_measured),
                    contended: r
                        .contended
                        .as_ref()
                        .filter(|_| r.contended_measured().is_none())
                        .map(not_measured),
                    disjoint: r
                        .disjoint
                        .as_ref()
                        .filter(|_| r.disjoint_measured().is_none())
                        .map(not_measured),
                    open_loop: open_loop_view(r),
                })
                .collect(),
            saturated_below_pct: SATURATED_BELOW * 100.0,
        }
    }
}
