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
//!     generated_utc: "20261202-120000".into(),
//!     tool_version: "0.1.0".into(),
//!     cores: 2,
//!     rows: Vec::new(),
//!     sale: Vec::new(),
//!     faults: Vec::new(),
//! };
//! assert!(report::decisions(&c).is_empty());
//! assert!(report::render(&c)?.starts_with("<!doctype html>"));
//! # Ok::<(), report::ReportError>(())
//! ```

mod chart;
mod decisions;
mod faults;
mod model;
mod verdict;

use harness::summary::Summary;
use serde::Serialize;

pub use decisions::decisions;
pub use faults::fault_lines;
pub use model::{Comparison, FaultCell, Row, SaleRun};

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
}

#[derive(Serialize)]
struct SaleLine {
    label: String,
    note: String,
    s: Summary,
}

impl<'a> From<&'a Comparison> for View<'a> {
    fn from(c: &'a Comparison) -> Self {
        // A broken lock's sale is not shown; the variants always are.
        let sales: Vec<SaleLine> = c
            .sales()
            .into_iter()
            .filter(|s| !s.negative_control)
            .map(|s| SaleLine {
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
