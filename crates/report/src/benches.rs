//! `cargo bench` figures: criterion's saved estimates (`target/criterion`)
//! read into the comparison, so one page carries the workloads and the
//! benches, and `lockbench report` re-renders both from `comparison.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Reading criterion's directory failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The directory is not there.
    #[error("{0}: no such directory (run `cargo bench --bench locks` first; criterion writes target/criterion)")]
    Missing(PathBuf),
    /// It holds no benchmark with saved estimates.
    #[error("{0}: no criterion estimates found (no <group>/<id>/new/estimates.json below it)")]
    Empty(PathBuf),
    /// A file could not be read or parsed.
    #[error("{path}: {why}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
}

/// One benchmark: criterion's median time per iteration with its interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchFigure {
    /// Criterion's group (`floor`, `uncontended`, `peer`, `try_held`,
    /// `contended/<backend>`, ...).
    pub group: String,
    /// The benchmark in the group (a backend, or `<tasks>-one-key`).
    pub id: String,
    /// Median, ns per iteration (per cycle).
    pub median_ns: f64,
    /// Its 95 % interval, low end.
    pub low_ns: f64,
    /// High end.
    pub high_ns: f64,
}

/// Every benchmark criterion saved, sorted by group and id.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Benches {
    /// The directory read, as given.
    pub source: String,
    /// The figures.
    pub figures: Vec<BenchFigure>,
}

#[derive(Deserialize)]
struct Ident {
    group_id: String,
    function_id: Option<String>,
    value_str: Option<String>,
}

#[derive(Deserialize)]
struct Interval {
    lower_bound: f64,
    upper_bound: f64,
}

#[derive(Deserialize)]
struct Estimate {
    point_estimate: f64,
    confidence_interval: Interval,
}

#[derive(Deserialize)]
struct Estimates {
    median: Estimate,
}

fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, BenchError> {
    let bad = |why: String| BenchError::Bad {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(format!("not criterion's format: {e}")))
}

/// Reads every `<...>/new/{benchmark,estimates}.json` below `dir`.
///
/// # Errors
/// A missing directory, one without estimates, or a file that is not
/// criterion's.
pub fn read_criterion(dir: &Path) -> Result<Benches, BenchError> {
    if !dir.is_dir() {
        return Err(BenchError::Missing(dir.to_path_buf()));
    }
    let mut figures = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| BenchError::Bad {
            path: d.clone(),
            why: e.to_string(),
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            if !p.is_dir() {
                continue;
            }
            // criterion's own HTML report is not a benchmark.
            if p.file_name().is_some_and(|n| n == "report") {
                continue;
            }
            let (bench, est) = (p.join("new/benchmark.json"), p.join("new/estimates.json"));
            if bench.is_file() && est.is_file() {
                let id: Ident = read(&bench)?;
                let e: Estimates = read(&est)?;
                figures.push(BenchFigure {
                    group: id.group_id,
                    id: match (id.function_id, id.value_str) {
                        (Some(f), Some(v)) => format!("{f}/{v}"),
                        (Some(f), None) => f,
                        (None, Some(v)) => v,
                        (None, None) => String::new(),
                    },
                    median_ns: e.median.point_estimate,
                    low_ns: e.median.confidence_interval.lower_bound,
                    high_ns: e.median.confidence_interval.upper_bound,
                });
            } else {
                stack.push(p);
            }
        }
    }
    if figures.is_empty() {
        return Err(BenchError::Empty(dir.to_path_buf()));
    }
    figures.sort_by(|a, b| (&a.group, &a.id).cmp(&(&b.group, &b.id)));
    Ok(Benches {
        source: dir.display().to_string(),
        figures,
    })
}

impl Benches {
    /// The figure of `group` / `id`.
    pub fn get(&self, group: &str, id: &str) -> Option<&BenchFigure> {
        self.figures.iter().find(|f| f.group == group && f.id == id)
    }

    /// Backends with an `uncontended` figure, in order.
    pub fn backends(&self) -> Vec<&str> {
        self.figures
            .iter()
            .filter(|f| f.group == "uncontended")
            .map(|f| f.id.as_str())
            .collect()
    }

    /// Cycles per second of `contended/<backend>` with `tasks` tasks on one
    /// key (`one_key`) or a key each: criterion times one cycle per
    /// iteration there.
    pub fn contended_per_s(&self, backend: &str, tasks: usize, one_key: bool) -> Option<f64> {
        let id = format!("{tasks}-{}", if one_key { "one-key" } else { "own-keys" });
        self.get(&format!("contended/{backend}"), &id)
            .filter(|f| f.median_ns > 0.0)
            .map(|f| 1e9 / f.median_ns)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn put(dir: &Path, rel: &str, group: &str, id: &str, median: f64) {
        let d = dir.join(rel).join("new");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("benchmark.json"),
            format!(r#"{{"group_id":"{group}","function_id":"{id}","value_str":null,"throughput":null,"full_id":"x","directory_name":"x","title":"x"}}"#),
        )
        .unwrap();
        let e = format!(
            r#"{{"point_estimate":{median},"confidence_interval":{{"confidence_level":0.95,"lower_bound":{},"upper_bound":{}}},"standard_error":1.0}}"#,
            median * 0.9,
            median * 1.1
        );
        std::fs::write(
            d.join("estimates.json"),
            format!(
                r#"{{"mean":{e},"median":{e},"median_abs_dev":{e},"slope":null,"std_dev":{e}}}"#
            ),
        )
        .unwrap();
    }

    #[test]
    fn reads_groups_and_turns_contended_times_into_rates() {
        let t = tempfile::tempdir().unwrap();
        put(t.path(), "floor/redis", "floor", "redis", 200_000.0);
        put(
            t.path(),
            "uncontended/redis",
            "uncontended",
            "redis",
            250_000.0,
        );
        put(
            t.path(),
            "contended_redis/4-one-key",
            "contended/redis",
            "4-one-key",
            500_000.0,
        );
        std::fs::create_dir_all(t.path().join("report")).unwrap();
        let b = read_criterion(t.path()).unwrap();
        assert_eq!(b.figures.len(), 3);
        assert_eq!(b.backends(), vec!["redis"]);
        assert_eq!(b.get("floor", "redis").unwrap().median_ns, 200_000.0);
        assert!((b.contended_per_s("redis", 4, true).unwrap() - 2000.0).abs() < 1e-6);
        assert!(b.contended_per_s("redis", 4, false).is_none());
    }

    #[test]
    fn a_missing_or_empty_directory_is_named() {
        let t = tempfile::tempdir().unwrap();
        let e = read_criterion(&t.path().join("nope"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains("cargo bench"), "{e}");
        let e = read_criterion(t.path()).unwrap_err().to_string();
        assert!(e.contains("no criterion estimates"), "{e}");
        put(t.path(), "floor/redis", "floor", "redis", 1.0);
        std::fs::write(t.path().join("floor/redis/new/estimates.json"), "{").unwrap();
        let e = read_criterion(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("estimates.json") && e.contains("criterion"),
            "{e}"
        );
    }
}
