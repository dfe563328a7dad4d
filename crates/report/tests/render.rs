//! The report says what the numbers say: a broken lock is never
//! recommended, an uncaught negative control is flagged, and the page is
//! self-contained.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use distlock::{Capabilities, TokenSource};
use harness::summary::Summary;
use report::{Comparison, Row};
use serde_json::json;

fn summary(backend: &str, violations: u64, lost: u64, cycle_us: f64, rate: f64) -> Summary {
    let p = json!({"count": 100, "p50_us": cycle_us, "p90_us": cycle_us, "p99_us": cycle_us,
                   "p999_us": cycle_us, "max_us": cycle_us});
    serde_json::from_value(json!({
        "backend": backend, "workload": "ledger", "workers": 4, "ops_ok": 400, "ops_failed": 0,
        "ops_info": 0, "release_not_held": 0, "violations": violations, "max_overlap_ms": 0.0,
        "acquire_p50_us": cycle_us, "acquire_p99_us": cycle_us, "acquire": p.clone(),
        "cycle_p50_us": cycle_us, "cycle_p99_us": cycle_us, "cycle": p,
        "floor_p50_us": cycle_us / 2.0, "floor_ratio": 2.0, "peers": {},
        "acquire_round_trips_mean": 1.0, "throughput_per_s": rate, "wall_s": 1.0,
        "timed_out": false, "counters": {},
        "ledger": {"fenceable": true, "writes": 400, "accepted": 400, "rejected": 0,
                   "stale_writes_accepted": 0, "stale_writes_unfenced": 0, "acknowledged": 400,
                   "counter_final": 400 - lost, "lost_updates": lost, "verdict": "ok"}
    }))
    .unwrap()
}

const FENCED: Capabilities = Capabilities {
    fencing: true,
    reentrant: true,
    fair: false,
    lost_signal: true,
    renewal: true,
    survives_failover: false,
    token_source: TokenSource::Counter,
};

fn row(backend: &str, control: bool, violations: u64, lost: u64, cycle_us: f64) -> Row {
    let s = summary(backend, violations, lost, cycle_us, 1000.0);
    Row {
        backend: backend.into(),
        about: format!("<{backend}> & co"),
        negative_control: control,
        needs_fault: None,
        capabilities: FENCED,
        ledger: Some(s.clone()),
        latency: Some(s.clone()),
        contended: Some(s),
        disjoint: None,
        coupon: None,
        open_loop: None,
        servers: None,
    }
}

fn comparison(rows: Vec<Row>) -> Comparison {
    Comparison {
        format: report::FORMAT,
        scaling: Vec::new(),
        benches: None,
        interrupted: None,
        generated_utc: "20261202-120000".into(),
        tool_version: "0.1.0".into(),
        cores: 2,
        rows,
        sale: Vec::new(),
        faults: Vec::new(),
        measured: None,
    }
}

#[test]
fn the_fastest_lock_is_not_recommended_when_it_overlapped() {
    // "fast" is quicker but overlapped once; "slow" is clean.
    let c = comparison(vec![
        row("fast", false, 1, 0, 100.0),
        row("slow", false, 0, 0, 300.0),
    ]);
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("Lowest uncontended cost in this single run"),
        "{d}"
    );
    assert!(d.contains("): slow ("), "{d}");
    assert!(!d.contains("fast"), "{d}");
    let html = report::render(&c).unwrap();
    assert!(
        html.contains("UNSAFE in these runs: 1 overlapping"),
        "verdict missing"
    );
    assert!(html.contains("class=\"warn\">fast:"), "warning missing");
}

#[test]
fn an_uncaught_negative_control_is_flagged() {
    let caught = comparison(vec![row("ctl", true, 5, 3, 100.0)]);
    assert!(!report::render(&caught).unwrap().contains("was NOT caught"));
    let missed = comparison(vec![row("ctl", true, 0, 0, 100.0)]);
    assert!(report::render(&missed)
        .unwrap()
        .contains("Negative control ctl was NOT caught"));
}

#[test]
fn a_control_that_needs_a_fault_is_not_a_missed_one() {
    let mut r = row("crashy", true, 0, 0, 100.0);
    r.needs_fault = Some("a crash between two calls".into());
    let html = report::render(&comparison(vec![r.clone()])).unwrap();
    assert!(!html.contains("was NOT caught"), "{html}");
    assert!(
        html.contains("it breaks only under a crash between two calls"),
        "{html}"
    );
    // Caught anyway (a fault happened): still reported as unsafe.
    let mut hit = row("crashy", true, 2, 1, 100.0);
    hit.needs_fault = r.needs_fault;
    assert!(report::render(&comparison(vec![hit]))
        .unwrap()
        .contains("UNSAFE in these runs"));
}

#[test]
fn lost_updates_alone_make_a_backend_unsafe() {
    let c = comparison(vec![row("lossy", false, 0, 7, 100.0)]);
    let html = report::render(&c).unwrap();
    assert!(
        html.contains("UNSAFE in these runs: 7 lost updates"),
        "{html}"
    );
    assert!(report::decisions(&c).is_empty());
}

#[test]
fn the_page_is_self_contained_and_escaped() {
    let c = comparison(vec![
        row("a", false, 0, 0, 100.0),
        row("b", false, 0, 0, 200.0),
    ]);
    let html = report::render(&c).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    // Nothing to fetch: no scripts, stylesheets, images or fonts by URL.
    for needle in ["<script", "<link", "src=", "http://", "https://", "url("] {
        let hits: Vec<_> = html.match_indices(needle).collect();
        // The SVG namespace is an identifier, not a fetch.
        let fetches = hits
            .iter()
            .filter(|(i, _)| !html[*i..].starts_with("http://www.w3.org/2000/svg"))
            .count();
        assert_eq!(fetches, 0, "{needle} in the page");
    }
    assert!(
        html.contains("&lt;a&gt; &amp; co"),
        "about text not escaped"
    );
    assert!(html.contains("<svg"), "no chart");
}

#[test]
fn each_verdict_class_renders_as_its_css_class() {
    let mut unfenced = row("unfenced", false, 0, 0, 100.0);
    unfenced.capabilities.fencing = false;
    let mut idle = row("idle", false, 0, 0, 100.0);
    (idle.ledger, idle.latency, idle.contended) = (None, None, None);
    let c = comparison(vec![
        row("good", false, 0, 0, 100.0),
        row("bad", false, 2, 0, 100.0),
        unfenced,
        idle,
    ]);
    let html = report::render(&c).unwrap();
    for (class, backend) in [
        ("safe", "good"),
        ("unsafe", "bad"),
        ("caveat", "unfenced"),
        ("not-run", "idle"),
    ] {
        assert!(
            html.contains(&format!("<tr class=\"{class}\"><td>{backend}<")),
            "{backend} should be {class}: {html}"
        );
    }
}

fn cell(
    backend: &str,
    fault: &str,
    violations: u64,
    records: serde_json::Value,
) -> report::FaultCell {
    report::FaultCell {
        backend: backend.into(),
        fault: fault.into(),
        setup: "test".into(),
        summary: summary(backend, violations, 0, 100.0, 100.0),
        records: records.as_array().unwrap().clone(),
        timeout: None,
    }
}

/// The fault matrix: a control its fault caught is unsafe without the
/// "expected without a fault" caveat; a failover survived by a backend
/// that declares it does not survive one is a finding; a correct lock
/// that overlapped under a node pause is unsafe and a finding.
#[test]
fn the_fault_matrix_judges_against_the_declared_capabilities() {
    let mut ctl = row("crashy", true, 0, 0, 100.0);
    ctl.needs_fault = Some("a crash between two calls".into());
    let mut c = comparison(vec![ctl, row("good", false, 0, 0, 100.0)]);
    c.faults = vec![
        cell(
            "crashy",
            "acquire-crash",
            0,
            json!([{"recovery_ms": null, "note": "lock never freed: test"}]),
        ),
        cell("good", "failover", 0, json!([{"recovery_ms": 12.0}])),
        cell("good", "node-pause", 3, json!([{"recovery_ms": 1.0}])),
    ];
    let html = report::render(&c).unwrap();
    assert!(!html.contains("it breaks only under"), "{html}");
    assert!(
        html.contains("under acquire-crash: lock never freed"),
        "{html}"
    );
    assert!(
        html.contains("declared not to survive a failover, yet survived"),
        "{html}"
    );
    assert!(html.contains("under node-pause: 3 overlap(s)"), "{html}");
    let lines = report::fault_lines(&c);
    assert_eq!(lines.len(), 3);
    assert!(
        lines[2].contains("BROKE") && lines[2].contains("finding"),
        "{lines:?}"
    );
}

/// A holder paused past its lease overlaps by design; with a fence that
/// refused every stale write the terminal line says the fence held, not
/// "held: N overlap(s)" as if the lock had.
#[test]
fn a_fenced_holder_pause_says_what_held() {
    let mut c = comparison(vec![row("good", false, 0, 0, 100.0)]);
    c.faults = vec![cell("good", "holder-pause", 7, json!([{}]))];
    let lines = report::fault_lines(&c);
    assert!(
        lines[0].starts_with("good / holder-pause: safe: 7 overlap(s)")
            && lines[0].contains("outlived its lease")
            && lines[0].contains("the fence held"),
        "{lines:?}"
    );
    assert!(!lines[0].contains("held: 7"), "{lines:?}");
}

/// A run during which a server died on its own measured an outage: the
/// page warns, naming the run and the server; a fault cell that held is
/// "not run", one that broke stays broken.
#[test]
fn a_run_whose_server_died_is_named_and_judges_nothing() {
    let mut good = row("good", false, 0, 0, 100.0);
    if let Some(l) = good.ledger.as_mut() {
        l.servers_exited =
            vec!["redis-0 (127.0.0.2:21000) exited during the run (signal: 9)".into()];
    }
    let mut c = comparison(vec![good, row("other", false, 0, 0, 100.0)]);
    c.faults = vec![
        cell("other", "node-pause", 0, json!([{"recovery_ms": 1.0}])),
        cell("other", "node-kill", 2, json!([{"recovery_ms": 1.0}])),
    ];
    for f in &mut c.faults {
        f.summary.servers_exited = vec!["etcd-1 exited during the run (exit status: 1)".into()];
    }
    let outages = report::outages(&c);
    assert_eq!(outages.len(), 3, "{outages:?}");
    assert!(
        outages[0].starts_with("good, ledger") && outages[0].contains("127.0.0.2:21000"),
        "{outages:?}"
    );
    let html = report::render(&c).unwrap();
    assert!(
        html.contains("an outage&#x27;s") || html.contains("an outage's"),
        "{html}"
    );
    let lines = report::fault_lines(&c);
    assert!(
        lines[0].contains("not run") && lines[0].contains("etcd-1"),
        "{lines:?}"
    );
    assert!(lines[1].contains("BROKE"), "{lines:?}");
}

/// Repeats of two clean backends (and the first one's A/A twin) whose
/// cycle p50s are `a` and `b` per repeat.
fn repeated(a: &[f64], b: &[f64], aa: &[f64]) -> Comparison {
    let mut c = comparison(vec![
        row("alpha", false, 0, 0, a[0]),
        row("beta", false, 0, 0, b[0]),
    ]);
    let samples = |name: &str, v: &[f64]| report::Samples {
        backend: name.into(),
        cycle_p50_us: v.to_vec(),
        handovers_per_s: v.iter().map(|x| 1e6 / x).collect(),
        ..Default::default()
    };
    c.measured = Some(report::Measured {
        repeats: u32::try_from(a.len()).unwrap(),
        aa_backend: Some("alpha".into()),
        profiles: vec![
            report::Profile {
                durability: "durable".into(),
                ran: true,
                backends: vec![
                    samples("alpha", a),
                    samples("beta", b),
                    samples("alpha (A/A)", aa),
                ],
                ..Default::default()
            },
            report::Profile {
                durability: "volatile".into(),
                ran: false,
                ..Default::default()
            },
        ],
    });
    c
}

#[test]
fn overlapping_intervals_render_as_a_tie() {
    let c = repeated(
        &[100.0, 104.0, 98.0, 101.0, 103.0],
        &[102.0, 99.0, 105.0, 100.0, 97.0],
        &[101.0, 103.0, 99.0, 100.0, 102.0],
    );
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("Lowest uncontended cost (acquire + release, p50 of each run, median over repeats): tie (within noise) between"),
        "{d}"
    );
    assert!(d.contains("Most hand-overs per second on one hot key (to a different worker, after an ok release): tie"), "{d}");
    assert!(
        d.contains("A/A check: alpha against its twin is a tie"),
        "{d}"
    );
    let html = report::render(&c).unwrap();
    assert!(html.contains("id=\"repeats\""), "repeats section missing");
    assert!(
        html.contains("not run (<code>--durability</code>"),
        "volatile not marked"
    );
    // Only the durable profile ran: the heading names it alone.
    assert!(
        html.contains("repeats, durable</h2>") && !html.contains("durable and volatile"),
        "repeats heading names a profile that did not run"
    );
}

#[test]
fn separated_intervals_name_the_winner() {
    let c = repeated(
        &[100.0, 104.0, 98.0, 101.0, 103.0],
        &[200.0, 210.0, 205.0, 198.0, 207.0],
        &[101.0, 103.0, 99.0, 100.0, 102.0],
    );
    let d = report::decisions(&c).join("\n");
    assert!(
        d.contains("Lowest uncontended cost (acquire + release, p50 of each run, median over repeats): alpha ("),
        "{d}"
    );
    assert!(d.contains("ahead of beta"), "{d}");
    assert!(d.contains("A/A noise floor"), "{d}");
    assert!(!d.contains("tie (within noise)"), "{d}");
    // A twin that drifted away from its original is called out.
    let drifted = repeated(
        &[100.0, 104.0, 98.0, 101.0, 103.0],
        &[200.0, 210.0, 205.0, 198.0, 207.0],
        &[150.0, 152.0, 149.0, 151.0, 153.0],
    );
    let d = report::decisions(&drifted).join("\n");
    assert!(d.contains("A/A check FAILED"), "{d}");
}

/// Two clean fenced backends that declare they survive a failover, each
/// met a holder pause and a failover.
fn guided() -> Comparison {
    let mut c = comparison(vec![
        row("quick", false, 0, 0, 100.0),
        row("steady", false, 0, 0, 300.0),
    ]);
    for r in &mut c.rows {
        r.capabilities.survives_failover = true;
    }
    c.faults = vec![
        cell("quick", "holder-pause", 0, json!([{"recovery_ms": 5.0}])),
        cell("steady", "holder-pause", 0, json!([{"recovery_ms": 5.0}])),
        cell("quick", "failover", 0, json!([{"recovery_ms": 20.0}])),
        cell("steady", "failover", 0, json!([{"recovery_ms": 20.0}])),
    ];
    c
}

fn need<'a>(g: &'a [report::Answer], start: &str) -> &'a report::Answer {
    g.iter().find(|a| a.need.starts_with(start)).unwrap()
}

/// One measured figure changes, and so does the answer that rests on it.
#[test]
fn the_guide_changes_its_answer_when_one_figure_changes() {
    let base = report::guide(&guided());
    assert!(need(&base, "The lowest latency")
        .answer
        .starts_with("quick:"));
    assert!(need(&base, "Money movement")
        .answer
        .starts_with("quick, steady:"));

    // Only quick's cycle p50 differs: the lowest latency moves.
    let mut slower = guided();
    slower.rows[0].latency.as_mut().unwrap().cycle_p50_us = 400.0;
    let g = report::guide(&slower);
    assert!(
        need(&g, "The lowest latency").answer.starts_with("steady:"),
        "{:?}",
        need(&g, "The lowest latency")
    );

    // Only the stale writes the fenced ledger accepted differ.
    let mut stale = guided();
    let l = stale.faults[0].summary.ledger.as_mut().unwrap();
    l.stale_writes_unfenced = 2;
    l.stale_writes_accepted = 2;
    let g = report::guide(&stale);
    let m = need(&g, "Money movement");
    assert!(m.answer.starts_with("steady:"), "{m:?}");
    assert!(
        m.rests_on
            .iter()
            .any(|r| r.contains("quick") && r.contains("2 accepted")),
        "{m:?}"
    );
    // And the rendered pages differ in that answer.
    let (a, b) = (
        report::render(&guided()).unwrap(),
        report::render(&stale).unwrap(),
    );
    assert!(
        a.contains("quick, steady: the paused holder kept the lock")
            && !b.contains("quick, steady: the paused holder kept the lock")
    );
}

/// A backend that overlapped under a fault is never given as safe under
/// it, however fast it is.
#[test]
fn the_guide_never_calls_a_backend_that_broke_safe_under_that_fault() {
    let mut c = guided();
    c.faults[2].summary.violations = 3;
    c.faults[2].summary.max_overlap_ms = 42.0;
    let g = report::guide(&c);
    let f = need(&g, "Surviving a failover");
    assert!(f.answer.starts_with("steady:"), "{f:?}");
    assert!(!f.answer.contains("quick"), "{f:?}");
    assert!(
        f.rests_on
            .iter()
            .any(|r| r == "quick: not safe under failover (3 overlap(s), longest 42 ms)"),
        "{f:?}"
    );
    let l = need(&g, "The lowest latency");
    assert!(
        l.answer
            .contains("but not safe under faults: 3 overlap(s) under failover"),
        "{l:?}"
    );
    assert_eq!(l.class, "caveat");
    let cron = need(&g, "A scheduled job");
    assert!(cron.answer.starts_with("steady:"), "{cron:?}");
}

/// The run the browser test loads: a real `lockbench compare`, with a
/// run's records as the harness writes them (`"skipped": null` included).
fn fixture() -> report::Comparison {
    report::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/comparison.json"),
    )
    .unwrap()
}

/// Every need is answered from a real run that had faults, and no
/// backend that overlapped under a fault is named for surviving it.
#[test]
fn the_guide_answers_every_need_from_a_real_run() {
    let c = fixture();
    let g = report::guide(&c);
    for a in &g {
        assert!(!a.answer.starts_with("not answered"), "{a:?}");
    }
    let f = need(&g, "Surviving a failover");
    for broke in c
        .faults
        .iter()
        .filter(|x| x.fault == "failover" && x.summary.violations > 0)
    {
        let named = f.answer.split(':').next().unwrap();
        assert!(
            !named.split(", ").any(|b| b == broke.backend),
            "{} overlapped under failover but the guide names it: {f:?}",
            broke.backend
        );
    }
    // RedLock has no safe token: never the answer for money.
    let m = need(&g, "Money movement");
    assert!(!m.answer.contains("redlock"), "{m:?}");
    // In this run redis and redis-cluster overlapped under failover too,
    // redis-wait only under holder-pause: fewer broken faults comes first.
    let r = need(&g, "I only run Redis");
    assert!(r.answer.starts_with("redis-wait"), "{r:?}");
}

/// The one-key run's fairness figures: `workers` per-worker counts, and a
/// most-overtaken (= longest) wait of worker 1 seeing `overtakes` acquires
/// by its `rivals` rivals.
fn fair_figures(counts: &[u64], overtakes: u64, rivals: u32) -> serde_json::Value {
    let wait = json!({"worker": 1, "wait_us": 4321.0, "overtakes": overtakes, "outcome": "fail",
                      "rivals": rivals, "fifo_bound": 2 * rivals});
    let starved: Vec<usize> = (0..counts.len()).filter(|w| counts[*w] == 0).collect();
    let spread = harness::handover::spread(counts);
    json!({"acquires_by_worker": counts, "jain_index": 0.5, "max_share": 1.0, "min_share": 0.0,
           "spread": spread, "starved": starved, "longest_wait": wait.clone(),
           "most_overtaken": wait})
}

/// A backend that declares `fair` while one wait saw more acquires by
/// others than FIFO lets through is flagged as a contradicted capability,
/// in the table and in the warnings; the same figures from a backend that
/// does not declare `fair`, and a FIFO-looking run from one that does, are
/// not. A starved worker shows as starved, never as a ratio.
#[test]
fn a_declared_fair_lock_that_let_others_overtake_is_a_finding() {
    let mut liar = row("liar", false, 0, 0, 100.0);
    liar.capabilities.fair = true;
    let mut figures = serde_json::to_value(liar.contended.take().unwrap()).unwrap();
    figures["fairness"] = fair_figures(&[40, 0, 30], 37, 2);
    liar.contended = Some(serde_json::from_value(figures.clone()).unwrap());
    let mut honest = row("honest", false, 0, 0, 100.0);
    honest.contended = Some(serde_json::from_value(figures).unwrap());
    let mut fifo = row("fifo", false, 0, 0, 100.0);
    fifo.capabilities.fair = true;
    let mut figures = serde_json::to_value(fifo.contended.take().unwrap()).unwrap();
    figures["fairness"] = fair_figures(&[20, 21, 20], 2, 2);
    fifo.contended = Some(serde_json::from_value(figures).unwrap());
    let mut c = comparison(vec![liar, honest, fifo]);
    let html = report::render(&c).unwrap();
    let claim = "declares fair (FIFO), yet worker 1 waited 4321 µs while other workers took the lock 37 times (FIFO lets at most 4 through with 2 rivals)";
    assert_eq!(html.matches(claim).count(), 2, "table and warnings: {html}");
    assert!(html.contains(&format!("<div class=\"warn\">liar: {claim}</div>")));
    assert!(!html.contains("honest: declares fair"), "{html}");
    assert!(!html.contains("fifo: declares fair"), "{html}");
    assert!(html.contains("starved: worker 1"), "{html}");
    assert!(
        html.contains("4321 µs, worker 1, 37 acquires by others (gave up)"),
        "{html}"
    );
    // The FIFO run's spread is a ratio: 21 / 20.
    assert!(html.contains("<td>1.05</td>"), "{html}");

    // The scaling table judges its points the same way.
    c.scaling = vec![report::ScalePoint {
        backend: "liar".into(),
        workers: 3,
        one_key_per_s: Some(100.0),
        fairness: serde_json::from_value(fair_figures(&[40, 0, 30], 37, 2)).unwrap(),
        servers_cpu_us_per_cycle: Some(1336.4),
        workers_cpu_us_per_cycle: Some(900.0),
        ..Default::default()
    }];
    let html = report::render(&c).unwrap();
    assert!(html.contains(&format!("finding: {claim}")), "{html}");
    // Where the rate went: the CPU per cycle of the servers and workers.
    assert!(
        html.contains("CPU µs per cycle (servers, workers)"),
        "{html}"
    );
    assert!(html.contains("<td>1336, 900</td>"), "{html}");
    assert_eq!(html.matches(claim).count(), 3, "{html}");
    // The terminal says the same: rows in order, then the scaling point.
    let lines = report::fairness_lines(&c);
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[0].starts_with(
            "liar, 4 workers: declared fair yes; acquires per worker max ÷ min starved: worker 1"
        ) && lines[0].ends_with(&format!("[finding: {claim}]")),
        "{lines:?}"
    );
    assert!(
        !lines[1].contains("finding") && !lines[2].contains("finding"),
        "{lines:?}"
    );
    assert!(lines[3].starts_with("liar, 3 workers (scaling)") && lines[3].contains("finding"));
}

/// What a backend's topology needs to survive one failure: `None` is the
/// costs table's "cannot".
fn servers(for_one_failure: Option<u32>) -> report::ServersNeeded {
    report::ServersNeeded {
        started: "test servers".into(),
        count: 1,
        for_one_failure,
        for_two_failures: None,
        rule: "test rule".into(),
    }
}

/// The probe's two pages: a single PostgreSQL (costs: `cannot` survive a
/// failure) green for surviving a failover on a node-pause alone, and
/// RedLock green on "0 overlaps under node-pause" while its verdict said
/// UNSAFE and its partition-clients run was not counted. A pause is not a
/// server dying; the answer rests on the faults that kill or cut off a
/// server, names them, and is never green for an UNSAFE verdict or a
/// backend that cannot survive a failure.
#[test]
fn the_failover_answer_rests_only_on_a_server_dying_or_cut_off() {
    // pg-advisory, cmp1: holder-kill, holder-pause, node-pause, all clean.
    let mut pg = row("pg-advisory", false, 0, 0, 600.0);
    pg.servers = Some(servers(None));
    let mut c = comparison(vec![pg]);
    c.faults = vec![
        cell(
            "pg-advisory",
            "holder-kill",
            0,
            json!([{"recovery_ms": 31.0}]),
        ),
        cell(
            "pg-advisory",
            "holder-pause",
            0,
            json!([{"recovery_ms": 5.0}]),
        ),
        cell(
            "pg-advisory",
            "node-pause",
            0,
            json!([{"recovery_ms": 9.0}]),
        ),
    ];
    let f = need(&report::guide(&c), "Surviving a failover").clone();
    assert_ne!(f.class, "safe", "{f:?}");
    assert!(!f.answer.starts_with("pg-advisory:"), "{f:?}");
    assert!(f.answer.contains("node-kill"), "names what counts: {f:?}");
    // The same clean backend under node-kill still cannot survive a
    // failure by its design: not green either, and the answer says why.
    c.faults.push(cell(
        "pg-advisory",
        "node-kill",
        0,
        json!([{"recovery_ms": 900.0}]),
    ));
    let f = need(&report::guide(&c), "Surviving a failover").clone();
    assert_ne!(f.class, "safe", "{f:?}");
    assert!(
        f.rests_on.iter().any(
            |r| r.starts_with("pg-advisory: 0 overlaps under node-kill;") && r.contains("cannot")
        ),
        "{f:?}"
    );

    // redlock, cmp2: clean under node-pause and partition-clients, one
    // overlap under clock-jump, so its verdict is UNSAFE.
    let mut redlock = row("redlock", false, 0, 0, 2700.0);
    redlock.capabilities.survives_failover = true;
    redlock.servers = Some(servers(Some(3)));
    let mut c = comparison(vec![redlock]);
    c.faults = vec![
        cell("redlock", "node-pause", 0, json!([{"recovery_ms": 58.0}])),
        cell(
            "redlock",
            "partition-clients",
            0,
            json!([{"recovery_ms": 19.0}]),
        ),
        cell("redlock", "clock-jump", 1, json!([{"recovery_ms": 2.0}])),
    ];
    let f = need(&report::guide(&c), "Surviving a failover").clone();
    assert_eq!(f.class, "unsafe", "{f:?}");
    assert!(!f.answer.starts_with("redlock:"), "{f:?}");
    assert!(
        f.rests_on.iter().any(
            |r| r.starts_with("redlock: 0 overlaps under partition-clients;")
                && !r.contains("node-pause")
                && r.contains("UNSAFE")
        ),
        "{f:?}"
    );

    // Without the clock-jump overlap the same figures are green, resting
    // on partition-clients alone and saying how many servers it takes.
    c.faults.pop();
    let f = need(&report::guide(&c), "Surviving a failover").clone();
    assert_eq!(f.class, "safe", "{f:?}");
    assert!(f.answer.starts_with("redlock: "), "{f:?}");
    assert!(f.answer.contains("(redlock: partition-clients)"), "{f:?}");
    assert!(f.answer.contains("on 3 servers"), "{f:?}");
    assert!(!f.answer.contains("node-pause"), "{f:?}");
}

/// A latency summary of a run in which no acquire succeeded: the zeros
/// the harness writes for an empty set.
fn acquired_nothing(backend: &str) -> Summary {
    let mut s = summary(backend, 0, 0, 0.0, 0.0);
    s.ops_ok = 0;
    s.ops_failed = 7;
    s.cycle.count = 0;
    s.acquire.count = 0;
    s.acquire_round_trips_mean = 0.0;
    s.floor_p50_us = None;
    s.floor_ratio = None;
    s
}

/// The probe's cmp2: redlock's latency run acquired nothing (n = 0), and
/// the page called it the lowest latency at "0 µs per uncontended cycle",
/// with 0.00 round trips in the latency and costs tables. A run with no
/// acquisition is not measured, and never the best.
#[test]
fn a_run_with_no_acquisition_is_not_measured_and_never_the_lowest() {
    let mut empty = row("empty", false, 0, 0, 100.0);
    empty.latency = Some(acquired_nothing("empty"));
    empty.contended = Some(acquired_nothing("empty"));
    let c = comparison(vec![empty, row("real", false, 0, 0, 2754.0)]);
    let g = report::guide(&c);
    let l = need(&g, "The lowest latency");
    assert!(l.answer.starts_with("real: 2754 µs"), "{l:?}");
    assert!(!l.rests_on.iter().any(|r| r.starts_with("empty")), "{l:?}");
    let pg = need(&g, "The lowest latency");
    assert!(!pg.answer.contains("0 µs per"), "{pg:?}");
    let d = report::decisions(&c).join("\n");
    assert!(!d.contains("empty ("), "{d}");
    let html = report::render(&c).unwrap();
    assert!(!html.contains("empty: 0 µs"), "{html}");
    assert!(
        html.contains("<td>empty</td><td>0</td><td colspan=\"12\" class=\"l not-run\">not measured: no acquire succeeded (7 failed, 0 unknown)</td>"),
        "latency table: {html}"
    );
    assert!(
        html.contains("<td>empty</td>\n<td colspan=\"12\" class=\"l not-run\">not measured: no acquire succeeded (7 failed, 0 unknown)</td>"),
        "throughput table: {html}"
    );
    // The costs table: no 0.00 round trips for either run of `empty`.
    assert_eq!(
        html.matches("<td>not measured (0 acquisitions)</td>")
            .count(),
        2,
        "{html}"
    );

    // With repeats: a repeat that acquired nothing is written as a 0 µs
    // cycle p50; it is left out, not taken as the fastest.
    let mut c = c;
    c.measured = Some(report::Measured {
        repeats: 2,
        aa_backend: None,
        profiles: vec![report::Profile {
            durability: "durable".into(),
            ran: true,
            backends: vec![
                report::Samples {
                    backend: "empty".into(),
                    cycle_p50_us: vec![0.0, 0.0],
                    ..Default::default()
                },
                report::Samples {
                    backend: "real".into(),
                    cycle_p50_us: vec![2754.0, 2760.0],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }],
    });
    let g = report::guide(&c);
    let l = need(&g, "The lowest latency");
    assert!(l.answer.starts_with("real: 2757 µs"), "{l:?}");
    let d = report::decisions(&c).join("\n");
    assert!(!d.contains("empty (0"), "{d}");
    let html = report::render(&c).unwrap();
    assert!(!html.contains("<td>0.0 ["), "{html}");
}

/// An open-loop summary: `offered` arrivals/s, `achieved` successful
/// cycles/s, cycle p50 `p50_us`.
fn open_loop(backend: &str, offered: f64, achieved: f64, p50_us: f64) -> Summary {
    let mut s = summary(backend, 0, 0, p50_us, achieved);
    s.open_loop_rate = Some(offered);
    s
}

/// The probe's open-loop points: pg-advisory offered 1174/s achieved
/// 493/s (p50 1.1 s), etcd offered 210/s achieved 108/s: beyond capacity,
/// flagged, with the achieved rate beside the offered one; pg-advisory of
/// cmp3 (1134/s offered, 1076/s achieved, 95 %) is not flagged.
#[test]
fn an_open_loop_point_that_fell_behind_is_flagged_beyond_capacity() {
    let mut pg = row("pg-advisory", false, 0, 0, 596.0);
    pg.open_loop = Some(open_loop("pg-advisory", 1173.55, 493.19, 1_101_004.8));
    let mut kept = row("kept-up", false, 0, 0, 617.0);
    kept.open_loop = Some(open_loop("kept-up", 1133.66, 1076.25, 13_942.8));
    // minijinja escapes "/" as "&#x2f;".
    let html = report::render(&comparison(vec![pg, kept])).unwrap();
    assert!(
        html.contains("<td class=\"l note caveat\">beyond capacity: latencies include queueing; offered 1174&#x2f;s, achieved 493&#x2f;s (42 %): p50 1101005 &#x2f; p99 n &lt; 1,000 µs</td>"),
        "{html}"
    );
    assert!(
        html.contains("<td class=\"l note\">offered 1134&#x2f;s, achieved 1076&#x2f;s (95 %): p50 13943 &#x2f; p99 n &lt; 1,000 µs</td>"),
        "{html}"
    );
    assert!(
        html.contains("achieved under 90 % of it is marked"),
        "{html}"
    );
}

/// A comparison cut short (Ctrl-C) says so first, names the phase, and
/// does not read its missing phases as turned off; a whole one
/// says neither.
#[test]
fn a_comparison_cut_short_says_where_it_stopped() {
    let mut c = comparison(vec![row("redis", false, 0, 0, 300.0)]);
    let whole = report::render(&c).unwrap();
    assert!(!whole.contains("interrupted"), "a whole comparison");
    assert!(whole.contains("--faults none"));
    c.interrupted = Some("the performance runs".into());
    let json = serde_json::to_string(&c).unwrap();
    let back: Comparison = serde_json::from_str(&json).unwrap();
    assert_eq!(back.interrupted.as_deref(), Some("the performance runs"));
    let page = report::render(&back).unwrap();
    let banner = page
        .find("interrupted during the performance runs")
        .expect("the banner");
    assert!(
        banner < page.find("id=\"verdict\"").unwrap(),
        "the banner comes before the verdict"
    );
    // Neither says the user turned a phase off, nor hides that they may
    // have.
    assert!(page.contains(
        "No fault run finished: the comparison was cut short before one did, or <code>--faults none</code> left them out."
    ));
    assert!(page.contains(
        "the comparison was cut short before the scaling runs finished, or <code>--scaling none</code> left them out"
    ));
    assert!(!page.contains("Not run: <code>lockbench compare --scaling none</code>"));
    // No green verdict from part of the suite.
    assert!(
        whole.contains("<tr class=\"safe\"><td>redis"),
        "the whole one is green"
    );
    assert!(
        !page.contains("<tr class=\"safe\">"),
        "a green verdict when cut short"
    );
    assert!(page.contains("the comparison was cut short, so not every run happened"));
    // Nothing is recommended from part of the suite: a fault that did not
    // run could have broken the backend an answer names.
    let whole_guide = report::guide(&c_whole(&back));
    assert!(whole_guide.iter().any(|a| a.answer.contains("redis")));
    for a in report::guide(&back) {
        assert!(
            a.answer
                .starts_with("not answered: the comparison was cut short"),
            "{}: {}",
            a.need,
            a.answer
        );
        assert!(a.rests_on.is_empty());
    }
    let headlines = report::decisions(&back);
    assert_eq!(headlines.len(), 1, "{headlines:?}");
    assert!(headlines[0].starts_with("No headline"), "{headlines:?}");
}

fn c_whole(c: &Comparison) -> Comparison {
    let mut c = c.clone();
    c.interrupted = None;
    c
}
