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
mod faults;
mod model;
pub mod stats;
mod verdict;

use harness::summary::Summary;
use serde::Serialize;

pub use decisions::decisions;
pub use faults::fault_lines;
pub use model::{load, LoadError, LockTimeout, ServersNeeded};
pub use model::{
    Comparison, FaultCell, Measured, Profile, Row, SaleRun, Samples, ScalePoint, FORMAT,
};

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
}

/// The repeated-measurement section, as text cells.
#[derive(Serialize)]
struct RepeatsView {
    repeats: u32,
    aa: Option<String>,
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
                        est(&s.cycle_p50_us, 1),
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
                let r = |f: fn(&Samples) -> &Vec<f64>| {
                    stats::Estimate::ratio(f(sd), f(sv))
                        .map_or("-".into(), |e| format!("{}×", e.show(2)))
                };
                price.push([
                    sd.backend.clone(),
                    r(|s| &s.cycle_p50_us),
                    r(|s| &s.handovers_per_s),
                    r(|s| &s.disjoint_per_s),
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
            if let Some(e) = stats::Estimate::ratio(&rl.cycle_p50_us, &r.cycle_p50_us) {
                targets.push([
                    "redlock ≤ 1.3× redis (cycle p50, separate fleets)".into(),
                    format!("{}×", e.show(2)),
                    stats::target(&e, 1.3).to_string(),
                ]);
            }
        }
    }
    Some(RepeatsView {
        repeats: m.repeats,
        aa: m.aa_backend.clone(),
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
        View {
            c,
            verdicts: c
                .rows
                .iter()
                .map(|r| verdict::verdict(r, &faults::judged(c)))
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
        }
    }
}
