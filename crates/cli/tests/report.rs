//! `lockbench report DIR`: re-renders the page byte for byte from
//! `comparison.json`, adds `cargo bench` figures with `--criterion`, and
//! names the file and the problem when `comparison.json` is missing,
//! truncated or from an older format.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod common;

use std::path::{Path, PathBuf};

use common::lockbench;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../report/tests/fixtures/comparison.json")
}

fn comparison_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(), d.path().join("comparison.json")).unwrap();
    d
}

fn report(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["report", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    lockbench(&args, "report")
}

#[test]
fn report_re_renders_the_page_byte_for_byte() {
    let d = comparison_dir();
    // What `compare` writes: report::render of the comparison it holds.
    let c = report::load(&d.path().join("comparison.json")).unwrap();
    let written = report::render(&c).unwrap();
    std::fs::write(d.path().join("index.html"), &written).unwrap();
    let json_before = std::fs::read(d.path().join("comparison.json")).unwrap();
    for _ in 0..2 {
        let out = report(d.path(), &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let again = std::fs::read_to_string(d.path().join("index.html")).unwrap();
        assert!(again == written, "the re-rendered page differs");
    }
    assert_eq!(
        std::fs::read(d.path().join("comparison.json")).unwrap(),
        json_before,
        "a plain re-render must not touch comparison.json"
    );
}

#[test]
fn report_adds_criterion_figures_to_the_comparison_and_the_page() {
    let d = comparison_dir();
    let crit = tempfile::tempdir().unwrap();
    for (rel, group, id, ns) in [
        ("floor/redis", "floor", "redis", 80_000.0),
        ("uncontended/redis", "uncontended", "redis", 96_000.0),
    ] {
        let new = crit.path().join(rel).join("new");
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(
            new.join("benchmark.json"),
            serde_json::json!({"group_id": group, "function_id": id, "value_str": null})
                .to_string(),
        )
        .unwrap();
        let e = serde_json::json!({"point_estimate": ns,
            "confidence_interval": {"confidence_level": 0.95, "lower_bound": ns * 0.99, "upper_bound": ns * 1.01}});
        std::fs::write(
            new.join("estimates.json"),
            serde_json::json!({"median": e, "mean": e}).to_string(),
        )
        .unwrap();
    }
    let out = report(d.path(), &["--criterion", crit.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = report::load(&d.path().join("comparison.json")).unwrap();
    assert_eq!(c.benches.as_ref().map(|b| b.figures.len()), Some(2));
    let html = std::fs::read_to_string(d.path().join("index.html")).unwrap();
    // 96 / 80 = 1.20x its floor, whose whole range is above 1.15.
    assert!(
        html.contains("redis ≤ 1.15× its raw floor"),
        "no target row"
    );
    assert!(html.contains("1.20×"), "no ratio");
    // A second plain re-render keeps the bench tables (they are in the JSON).
    let out = report(d.path(), &[]);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(d.path().join("index.html")).unwrap(),
        html
    );
}

fn fails_with(dir: &Path, needles: &[&str]) {
    let out = report(dir, &[]);
    assert!(!out.status.success(), "should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "`{n}` not in: {err}");
    }
}

#[test]
fn a_missing_truncated_or_older_comparison_is_named_with_its_problem() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("comparison.json");
    let name = file.display().to_string();
    fails_with(d.path(), &[&name, "cannot read it"]);

    let text = std::fs::read_to_string(fixture()).unwrap();
    std::fs::write(&file, &text[..text.len() / 2]).unwrap();
    fails_with(d.path(), &[&name, "truncated"]);

    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("format");
    std::fs::write(&file, v.to_string()).unwrap();
    fails_with(
        d.path(),
        &[
            &name,
            "format 1 (from before the format was recorded)",
            "reads format 2",
        ],
    );

    std::fs::write(&file, r#"{"backend": "redis"}"#).unwrap();
    fails_with(
        d.path(),
        &[&name, "not a lockbench comparison", "no `rows`"],
    );
}
