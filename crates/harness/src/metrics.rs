//! The workers' Prometheus pages as one page: what `lockbench run
//! --metrics-addr` serves.
//!
//! Each worker process renders its own page (metrics-exporter-prometheus,
//! every sample labelled `worker`). Concatenated, they would repeat each
//! family's `# HELP` / `# TYPE` lines, which Prometheus refuses; merged,
//! each family appears once with every worker's samples under it.

use std::collections::BTreeMap;

#[derive(Debug, Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

fn family<'a>(
    families: &'a mut BTreeMap<String, Family>,
    order: &mut Vec<String>,
    name: &str,
) -> &'a mut Family {
    if !families.contains_key(name) {
        order.push(name.to_string());
    }
    families.entry(name.to_string()).or_default()
}

/// One Prometheus text page from several, families merged by name (in the
/// order first seen), samples kept as they are.
pub fn merge(pages: &[String]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for page in pages {
        // A sample belongs to the family of the `# TYPE` line above it
        // (a summary's `_sum` and `_count` included).
        let mut current: Option<String> = None;
        for line in page.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or_default();
                let f = family(&mut families, &mut order, name);
                f.help.get_or_insert_with(|| line.to_string());
                current = Some(name.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap_or_default();
                let f = family(&mut families, &mut order, name);
                f.kind.get_or_insert_with(|| line.to_string());
                current = Some(name.to_string());
            } else if line.starts_with('#') {
                continue;
            } else {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let owner = current
                    .clone()
                    .filter(|c| name.starts_with(c.as_str()))
                    .unwrap_or_else(|| name.to_string());
                family(&mut families, &mut order, &owner)
                    .samples
                    .push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for name in order {
        let Some(f) = families.get(&name) else {
            continue;
        };
        for l in f.help.iter().chain(f.kind.iter()).chain(f.samples.iter()) {
            out.push_str(l);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn families_appear_once_with_every_workers_samples() {
        let w0 = "# HELP a_total as\n# TYPE a_total counter\na_total{worker=\"0\"} 1\n\n# TYPE h summary\nh{worker=\"0\",quantile=\"0.5\"} 0.1\nh_sum{worker=\"0\"} 0.2\nh_count{worker=\"0\"} 2\n";
        let w1 = "# HELP a_total as\n# TYPE a_total counter\na_total{worker=\"1\"} 3\n";
        let m = merge(&[w0.to_string(), w1.to_string()]);
        assert_eq!(m.matches("# TYPE a_total counter").count(), 1, "{m}");
        assert_eq!(m.matches("# HELP a_total").count(), 1, "{m}");
        let a = m.find("a_total{worker=\"1\"} 3").unwrap();
        let h = m.find("# TYPE h summary").unwrap();
        assert!(a < h, "worker 1's sample under its family: {m}");
        assert!(m.contains("h_count{worker=\"0\"} 2\n"), "{m}");
        assert_eq!(merge(&[]), "");
    }
}
