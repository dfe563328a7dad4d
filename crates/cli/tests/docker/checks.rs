//! The checks `main.rs` runs on docker/: reading the YAML and TOML, and
//! each rule as a function that returns what breaks it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use distlock::ErrorKind;
use lockbench_registry::{BuildParams, Descriptor, Settings, BACKENDS};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::task::Poll;
use std::time::Duration;
use yaml_rust2::{Yaml, YamlLoader};

/// The `--config` tables docker/ provides servers for.
pub const FAMILIES: &[&str] = &["etcd", "postgres", "redis", "redlock", "zookeeper"];

/// Host ports no service may publish: the servers' defaults (the list
/// crates/fleet keeps its own ports off).
pub const DEFAULT_PORTS: &[u16] = &[2181, 2379, 2380, 2888, 3888, 5432, 6379, 8080, 26379];

/// The fleet host's name in the Kubernetes ConfigMap.
pub const K8S_FLEET_HOST: &str = "lockbench-fleet";

/// `host`, `port`.
pub type Endpoint = (String, u16);

// ---------------------------------------------------------------- reading

pub fn docker_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docker")
}

pub fn read(name: &str) -> String {
    std::fs::read_to_string(docker_dir().join(name))
        .unwrap_or_else(|e| panic!("reading docker/{name}: {e}"))
}

pub fn yaml(text: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(text).unwrap_or_else(|e| panic!("not YAML: {e}"))
}

pub fn compose() -> Yaml {
    yaml(&read("compose.yml"))
        .into_iter()
        .next()
        .expect("docker/compose.yml is empty")
}

/// Every document of every docker/k8s/*.yaml.
pub fn k8s_docs() -> Vec<Yaml> {
    let dir = docker_dir().join("k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML file in docker/k8s/");
    files
        .iter()
        .flat_map(|f| yaml(&std::fs::read_to_string(f).unwrap()))
        .collect()
}

/// A scalar as text (`6379` and `"6379"` alike).
pub fn text(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A list of scalars (`[a, b]`), or one string split on whitespace.
pub fn words(y: &Yaml) -> Vec<String> {
    match y {
        Yaml::Array(a) => a.iter().filter_map(text).collect(),
        other => text(other)
            .map(|s| s.split_whitespace().map(String::from).collect())
            .unwrap_or_default(),
    }
}

pub fn services(compose: &Yaml) -> Vec<(String, &Yaml)> {
    compose["services"]
        .as_hash()
        .expect("compose file has no `services:` mapping")
        .iter()
        .map(|(k, v)| (text(k).expect("a service name"), v))
        .collect()
}

// ---------------------------------------------------------------- images

/// Every `image:` value anywhere in the documents.
pub fn images(docs: &[Yaml]) -> Vec<String> {
    fn walk(y: &Yaml, out: &mut Vec<String>) {
        match y {
            Yaml::Hash(h) => {
                for (k, v) in h {
                    if k.as_str() == Some("image") {
                        out.push(text(v).unwrap_or_else(|| format!("{v:?}")));
                    } else {
                        walk(v, out);
                    }
                }
            }
            Yaml::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    docs.iter().for_each(|d| walk(d, &mut out));
    out
}

/// A digest, or a tag that is neither `latest` nor left to a variable. The
/// tag is after the last `:` of the last path part (`localhost:5000/redis`
/// has none).
pub fn image_pinned(image: &str) -> bool {
    if let Some((_, digest)) = image.split_once('@') {
        return digest
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, tag)) => !tag.is_empty() && tag != "latest" && !tag.contains('$'),
        None => false,
    }
}

pub fn unpinned_images(docs: &[Yaml]) -> Vec<String> {
    images(docs)
        .into_iter()
        .filter(|i| !image_pinned(i))
        .collect()
}

// ---------------------------------------------------------------- health

/// Services with no health check (or one switched off), except those
/// built here (the worker: it has nothing to be ready for).
pub fn missing_healthchecks(compose: &Yaml) -> Vec<String> {
    services(compose)
        .into_iter()
        .filter(|(_, s)| s["build"].is_badvalue())
        .filter(|(_, s)| {
            let h = &s["healthcheck"];
            h.is_badvalue()
                || h["disable"].as_bool() == Some(true)
                || words(&h["test"]).first().map(String::as_str) == Some("NONE")
                || words(&h["test"]).is_empty()
        })
        .map(|(name, _)| name)
        .collect()
}

// ---------------------------------------------------------------- ports

/// A fixed host port a service publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub service: String,
    pub host_port: u16,
    pub target: u16,
}

/// `27390` or `27390-27394`.
pub fn port_range(s: &str) -> Vec<u16> {
    let s = s.trim();
    match s.split_once('-') {
        Some((a, b)) => {
            let (a, b): (u16, u16) = (a.parse().unwrap(), b.parse().unwrap());
            (a..=b).collect()
        }
        None => vec![s.parse().unwrap_or_else(|_| panic!("bad port {s:?}"))],
    }
}

/// Every fixed host port of every service: short syntax
/// (`[ip:]host:container[/proto]`, the ip possibly a `${VAR:-default}`)
/// or long (`target:` / `published:`); ranges expanded. A container port
/// alone publishes none.
pub fn published(compose: &Yaml) -> Vec<Published> {
    let mut out = Vec::new();
    for (service, s) in services(compose) {
        for p in s["ports"].as_vec().map(Vec::as_slice).unwrap_or_default() {
            let (host, target) = match p {
                Yaml::Hash(_) => match (text(&p["published"]), text(&p["target"])) {
                    (Some(h), Some(t)) => (h, t),
                    _ => continue,
                },
                other => {
                    let s = text(other).expect("a port mapping");
                    let s = s.split('/').next().unwrap_or_default().to_string();
                    let parts: Vec<&str> = s.rsplitn(3, ':').collect();
                    if parts.len() < 2 || parts[1].is_empty() {
                        continue;
                    }
                    (parts[1].to_string(), parts[0].to_string())
                }
            };
            let (hosts, targets) = (port_range(&host), port_range(&target));
            assert_eq!(
                hosts.len(),
                targets.len(),
                "{service}: {host} and {target} differ in length"
            );
            for (h, t) in hosts.into_iter().zip(targets) {
                out.push(Published {
                    service: service.clone(),
                    host_port: h,
                    target: t,
                });
            }
        }
    }
    out
}

/// A host port published twice, or a server's default port published.
pub fn port_problems(compose: &Yaml) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<u16, String> = BTreeMap::new();
    for p in published(compose) {
        if DEFAULT_PORTS.contains(&p.host_port) {
            problems.push(format!(
                "{} publishes {}, a server's default port",
                p.service, p.host_port
            ));
        }
        if let Some(first) = seen.insert(p.host_port, p.service.clone()) {
            problems.push(format!(
                "{} publishes {}, as {first} does",
                p.service, p.host_port
            ));
        }
    }
    problems
}

// ---------------------------------------------------------------- endpoints

/// The `host:port` pairs of an endpoint string: a URL
/// (`scheme://[user[:pw]@]h:p[,h:p...][/path]`) or a connect string
/// (`h:p,h:p[/chroot]`). Anything else (a key prefix, a node path) has none.
pub fn endpoints_in(s: &str) -> Vec<Endpoint> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or_default();
    let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    hosts
        .split(',')
        .filter_map(|h| {
            let (host, port) = h.trim().rsplit_once(':')?;
            Some((host.to_string(), port.parse().ok()?))
        })
        .filter(|(h, _)| !h.is_empty())
        .collect()
}

/// Every string in a settings value.
pub fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(o) => o.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

pub fn endpoints_of(v: &Value) -> Vec<Endpoint> {
    let mut all = Vec::new();
    strings(v, &mut all);
    all.iter().flat_map(|s| endpoints_in(s)).collect()
}

/// The settings each distributed backend gets from a config file, by family.
pub fn settings_by_family(
    s: &Settings,
) -> BTreeMap<&'static str, Vec<(&'static dyn Descriptor, Value)>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for b in BACKENDS.iter().copied().filter(|b| b.distributed()) {
        let v = s
            .for_backend(b, None)
            .unwrap_or_else(|e| panic!("{}: {e}", b.name()));
        out.entry(b.family()).or_default().push((b, v));
    }
    out
}

/// What lockbench reads as each family's endpoints from a config file.
pub fn parsed_endpoints(s: &Settings) -> BTreeMap<&'static str, Vec<Endpoint>> {
    settings_by_family(s)
        .into_iter()
        .map(|(f, bs)| (f, endpoints_of(&bs[0].1)))
        .collect()
}

/// The environment variables that would override a config file here (the
/// file's checks then see the environment, not the file).
pub fn env_overrides() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .flat_map(|b| b.env_vars().iter().copied())
        .filter(|v| std::env::var_os(v).is_some())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Every double-quoted string of a TOML file read as plain text (the
/// commented-out alternatives too), with the `[table]` it is under.
pub fn raw_strings(text: &str) -> Vec<(String, String)> {
    let mut table = String::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') && !t.starts_with("[[") {
            if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = name.trim().to_string();
                continue;
            }
        }
        // Odd pieces are inside quotes.
        for (i, piece) in line.split('"').enumerate() {
            if i % 2 == 1 {
                out.push((table.clone(), piece.to_string()));
            }
        }
    }
    out
}

/// [`raw_strings`]' endpoints, by table.
pub fn raw_endpoints(text: &str) -> BTreeMap<String, Vec<Endpoint>> {
    let mut out: BTreeMap<String, Vec<Endpoint>> = BTreeMap::new();
    for (table, s) in raw_strings(text) {
        let eps = endpoints_in(&s);
        if !eps.is_empty() {
            out.entry(table).or_default().extend(eps);
        }
    }
    out
}

/// `v` with every endpoint replaced by `map(endpoint)`.
pub fn rewrite(v: &Value, map: &dyn Fn(&Endpoint) -> Endpoint) -> Value {
    match v {
        Value::String(s) => {
            let mut s = s.clone();
            for (h, p) in endpoints_in(&s) {
                let (h2, p2) = map(&(h.clone(), p));
                s = s.replacen(&format!("{h}:{p}"), &format!("{h2}:{p2}"), 1);
            }
            Value::String(s)
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| rewrite(v, map)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| (k.clone(), rewrite(v, map)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The backend's own verdict on `settings`: its connect path polled once.
/// Every backend validates its config before its first network call, so a
/// bad value comes back at once as a config error; good settings go on to
/// connect, and that attempt is dropped before it gets anywhere. Only
/// loopback endpoints are ever polled.
pub fn config_error(b: &dyn Descriptor, settings: &Value) -> Option<String> {
    for (host, port) in endpoints_of(settings) {
        assert!(
            host == "127.0.0.1" || host == "localhost",
            "{}: refusing to poll a connect to {host}:{port}, not loopback",
            b.name()
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let params = BuildParams {
            hold: Duration::from_secs(1),
            probes: false,
            key: "lockbench:docker-config-check".into(),
        };
        let mut fut = b.connect(settings, params);
        let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
        drop(fut);
        match first {
            Poll::Ready(Err(e)) if e.kind() == ErrorKind::Config => Some(e.to_string()),
            _ => None,
        }
    })
}

/// Every backend's complaint about `settings` (parsed from some file),
/// after `map` has moved its endpoints onto loopback. A backend the file
/// names no server for (lockbench would start its own) is not asked.
pub fn config_errors(s: &Settings, map: &dyn Fn(&Endpoint) -> Endpoint) -> Vec<String> {
    let mut errors = Vec::new();
    for bs in settings_by_family(s).into_values() {
        for (b, v) in bs {
            if b.configured_endpoint(&v).is_none() {
                continue;
            }
            // A backend these servers cannot host (redis-cluster on the
            // fleet's plain Redis): `compare` leaves it out, saying why.
            if b.check_servers(&v).is_err() {
                continue;
            }
            if let Some(e) = config_error(b, &rewrite(&v, map)) {
                errors.push(format!("{}: {e}", b.name()));
            }
        }
    }
    errors
}

/// [`config_errors`] of a TOML text with loopback endpoints, its parse
/// error included.
pub fn toml_errors(text: &str) -> Vec<String> {
    let s = match Settings::from_toml(text) {
        Ok(s) => s,
        Err(e) => return vec![e.to_string()],
    };
    let mut errors = Vec::new();
    for b in BACKENDS.iter().copied().filter(|b| b.distributed()) {
        if let Err(e) = s.for_backend(b, None) {
            errors.push(format!("{}: {e}", b.name()));
        }
    }
    if errors.is_empty() {
        errors = config_errors(&s, &|e| e.clone());
    }
    errors
}

/// Which family's server an image runs: `redis`, `postgres`, ... (the
/// repository's last path part).
pub fn image_kind(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    last.split([':', '@']).next().unwrap_or(last).to_string()
}

pub fn family_image(family: &str) -> &'static str {
    match family {
        "redis" | "redlock" => "redis",
        "postgres" => "postgres",
        "zookeeper" => "zookeeper",
        "etcd" => "etcd",
        other => panic!("no image for family {other}"),
    }
}

/// The image a service runs.
pub fn service_image(compose: &Yaml, name: &str) -> String {
    let s = &compose["services"][name];
    text(&s["image"]).unwrap_or_else(|| panic!("service {name} has no image"))
}

// ---------------------------------------------------------------- k8s

/// What an Indexed worker Job must have; each problem named.
pub fn job_problems(docs: &[Yaml]) -> Vec<String> {
    let mut problems = Vec::new();
    let jobs: Vec<&Yaml> = docs
        .iter()
        .filter(|d| d["kind"].as_str() == Some("Job"))
        .collect();
    if jobs.len() != 1 {
        return vec![format!("{} Job documents, not 1", jobs.len())];
    }
    let job = jobs[0];
    let spec = &job["spec"];
    if spec["completionMode"].as_str() != Some("Indexed") {
        problems.push("spec.completionMode is not Indexed".to_string());
    }
    let completions = spec["completions"].as_i64();
    if completions != Some(4) || spec["parallelism"].as_i64() != completions {
        problems.push(format!(
            "completions {completions:?} and parallelism {:?}: want 4 and 4",
            spec["parallelism"].as_i64()
        ));
    }
    let pod = &spec["template"]["spec"];
    let containers = pod["containers"].as_vec().cloned().unwrap_or_default();
    if containers.len() != 1 {
        problems.push(format!("{} containers, not 1", containers.len()));
        return problems;
    }
    let c = &containers[0];
    let argv: Vec<String> = words(&c["command"])
        .into_iter()
        .chain(words(&c["args"]))
        .collect();
    let after = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    if !argv.iter().any(|a| a == "worker") {
        problems.push(format!("{argv:?} does not run `lockbench worker`"));
    }
    match after("--shard") {
        Some(s) if completions.is_some_and(|n| s == format!("$(JOB_COMPLETION_INDEX)/{n}")) => {}
        other => problems.push(format!(
            "--shard is {other:?}, not $(JOB_COMPLETION_INDEX)/<completions>"
        )),
    }
    if after("--run").is_none() {
        problems.push("no --run".to_string());
    }
    // $(VAR) expands only from the container's own env list.
    let env: BTreeSet<String> = c["env"]
        .as_vec()
        .map(|e| e.iter().filter_map(|v| text(&v["name"])).collect())
        .unwrap_or_default();
    for a in &argv {
        let mut rest = a.as_str();
        while let Some(i) = rest.find("$(") {
            let tail = &rest[i + 2..];
            let Some(end) = tail.find(')') else { break };
            if !env.contains(&tail[..end]) {
                problems.push(format!("$({}) is not in the container's env", &tail[..end]));
            }
            rest = &tail[end..];
        }
    }
    // The config file comes from a ConfigMap in these documents.
    match after("--config") {
        None => problems.push("no --config".to_string()),
        Some(path) => {
            let (dir, file) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
            let mount = c["volumeMounts"].as_vec().and_then(|m| {
                m.iter()
                    .find(|m| text(&m["mountPath"]).as_deref() == Some(dir))
            });
            let volume = mount.and_then(|m| {
                pod["volumes"].as_vec().and_then(|vs| {
                    vs.iter()
                        .find(|v| v["name"].as_str().is_some() && v["name"] == m["name"])
                })
            });
            let cm_name = volume.and_then(|v| text(&v["configMap"]["name"]));
            let cm = docs.iter().find(|d| {
                d["kind"].as_str() == Some("ConfigMap")
                    && cm_name.is_some()
                    && text(&d["metadata"]["name"]) == cm_name
            });
            match cm {
                Some(cm) if !cm["data"][file].is_badvalue() => {}
                _ => problems.push(format!(
                    "--config {path} is not a key of a ConfigMap in these documents mounted at {dir}"
                )),
            }
        }
    }
    problems
}
