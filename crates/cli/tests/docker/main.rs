//! `docker/`: the compose fleet, the endpoint files that point lockbench at
//! it, the worker image and the Kubernetes Job, checked without a Docker
//! engine and without any server: the YAML is parsed and held to the rules
//! below, and every endpoint file is read by lockbench's own
//! `Settings::from_file` and validated by each backend's own connect path
//! (polled once: validation runs before the first network call, and the
//! attempt is dropped there). Each check is also run on an input it must
//! reject.
//!
//! When a `docker` binary with a working `compose` plugin is on the PATH,
//! `docker compose config -q` must accept the file too; otherwise that test
//! says it was skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod checks;

use lockbench_registry::Settings;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use yaml_rust2::YamlLoader;

use checks::*;

#[test]
fn endpoint_strings_are_split_into_host_and_port() {
    assert_eq!(
        endpoints_in("postgres://u:p@127.0.0.1:25432/db"),
        [("127.0.0.1".to_string(), 25432)]
    );
    assert_eq!(
        endpoints_in("redis+sentinel://a:1,b:2/lockbench"),
        [("a".to_string(), 1), ("b".to_string(), 2)]
    );
    assert_eq!(endpoints_in("zk-1:2181,zk-2:2181/chroot").len(), 2);
    assert!(endpoints_in("lockbench/lock").is_empty());
    assert!(endpoints_in("/lockbench/locks").is_empty());
    let raw = raw_endpoints(
        "[redis]\nurl = \"redis://h:1\"\n# url = \"redis://h:2\"\n[etcd]\nprefix = \"p\"\n",
    );
    assert_eq!(
        raw,
        BTreeMap::from([(
            "redis".to_string(),
            vec![("h".to_string(), 1), ("h".to_string(), 2)]
        )])
    );
}

#[test]
fn a_duplicated_key_is_an_error() {
    // As in docker compose: the second ZOO_TICK_TIME would silently win in
    // a lenient loader.
    let e = YamlLoader::load_from_str("environment:\n  ZOO_TICK_TIME: 1\n  ZOO_TICK_TIME: 2\n");
    assert!(e.is_err(), "{e:?}");
}

#[test]
fn every_image_is_pinned() {
    let mut docs = vec![compose()];
    docs.extend(k8s_docs());
    assert!(
        images(&docs).len() > 5,
        "found too few images: {:?}",
        images(&docs)
    );
    assert_eq!(unpinned_images(&docs), Vec::<String>::new());
    // Every family's servers are there, from an official image.
    let found: BTreeSet<String> = images(&docs).iter().map(|i| image_kind(i)).collect();
    for f in FAMILIES {
        assert!(found.contains(family_image(f)), "no {f} image in {found:?}");
    }
}

#[test]
fn an_unpinned_image_is_flagged() {
    let docs = yaml(
        "services:\n\
         \x20 a: {image: 'redis:latest'}\n\
         \x20 b: {image: redis}\n\
         \x20 c: {image: 'localhost:5000/redis'}\n\
         \x20 d: {image: 'postgres:${TAG}'}\n\
         \x20 e: {image: 'redis:7.0.15-bookworm'}\n\
         \x20 f: {image: 'gcr.io/etcd-development/etcd:v3.4.23'}\n\
         \x20 g: {image: 'localhost:5000/redis:7'}\n\
         \x20 h: {image: 'postgres@sha256:ae14f24c14727e0b2ded1c5553031666099bd1054db3ef44bfa6e2bd6d554a56'}\n\
         \x20 i: {image: 'postgres@sha256:short'}\n",
    );
    assert_eq!(
        unpinned_images(&docs),
        [
            "redis:latest",
            "redis",
            "localhost:5000/redis",
            "postgres:${TAG}",
            "postgres@sha256:short"
        ]
    );
}

#[test]
fn every_server_has_a_healthcheck() {
    let c = compose();
    assert_eq!(missing_healthchecks(&c), Vec::<String>::new());
    // The one exception is the built worker.
    let built: Vec<String> = services(&c)
        .into_iter()
        .filter(|(_, s)| !s["build"].is_badvalue())
        .map(|(n, _)| n)
        .collect();
    assert_eq!(built, ["worker"]);

    let bad = yaml(
        "services:\n\
         \x20 none: {image: 'redis:7'}\n\
         \x20 off: {image: 'redis:7', healthcheck: {disable: true}}\n\
         \x20 nop: {image: 'redis:7', healthcheck: {test: [NONE]}}\n\
         \x20 ok: {image: 'redis:7', healthcheck: {test: [CMD, redis-cli, ping]}}\n\
         \x20 built: {build: ., image: 'x:1'}\n",
    );
    assert_eq!(missing_healthchecks(&bad[0]), ["none", "off", "nop"]);
}

#[test]
fn published_ports_are_unique_and_never_a_default() {
    let c = compose();
    let ports = published(&c);
    assert!(ports.len() >= 17, "only {} published ports", ports.len());
    assert_eq!(port_problems(&c), Vec::<String>::new());

    let bad = yaml(
        "services:\n\
         \x20 a: {ports: ['6379:6379']}\n\
         \x20 b: {ports: ['${BIND:-127.0.0.1}:27379:6379', '7000']}\n\
         \x20 c: {ports: ['127.0.0.1:27378-27379:6379-6380/tcp']}\n\
         \x20 d: {ports: [{target: 5432, published: '26379'}]}\n",
    );
    assert_eq!(
        port_problems(&bad[0]),
        [
            "a publishes 6379, a server's default port",
            "c publishes 27379, as b does",
            "d publishes 26379, a server's default port",
        ]
    );
}

#[test]
fn host_endpoints_are_published_ports_of_the_right_servers() {
    let c = compose();
    let by_port: BTreeMap<u16, Published> = published(&c)
        .into_iter()
        .map(|p| (p.host_port, p))
        .collect();
    let path = docker_dir().join("endpoints.toml");
    let settings = Settings::from_file(&path).unwrap_or_else(|e| panic!("{e}"));

    // Read as text: every endpoint written, commented-out ones included.
    let raw = raw_endpoints(&read("endpoints.toml"));
    assert_eq!(
        raw.keys().map(String::as_str).collect::<Vec<_>>(),
        FAMILIES,
        "one table per family"
    );
    for (table, eps) in &raw {
        for (host, port) in eps {
            assert_eq!(host, "127.0.0.1", "[{table}] {host}:{port}");
            let p = by_port
                .get(port)
                .unwrap_or_else(|| panic!("[{table}] {host}:{port}: no service publishes {port}"));
            assert_eq!(
                image_kind(&service_image(&c, &p.service)),
                family_image(table),
                "[{table}] {host}:{port} is {}",
                p.service
            );
        }
    }

    let overridden = env_overrides();
    if !overridden.is_empty() {
        println!(
            "skipped the parsed checks: {overridden:?} set in the environment override the file"
        );
        return;
    }
    // As lockbench reads it: every backend is pointed at these servers (it
    // starts none of its own), each one's own validation accepts them, and
    // they are the endpoints the text shows.
    for (family, bs) in settings_by_family(&settings) {
        for (b, v) in &bs {
            assert!(
                b.configured_endpoint(v).is_some(),
                "{}: endpoints.toml names no server (family {family})",
                b.name()
            );
        }
    }
    assert_eq!(
        config_errors(&settings, &|e| e.clone()),
        Vec::<String>::new()
    );
    for (family, eps) in parsed_endpoints(&settings) {
        assert!(
            FAMILIES.contains(&family),
            "family {family} has no servers in docker/"
        );
        for ep in &eps {
            assert!(raw[family].contains(ep), "{family}: {ep:?} not in the text");
        }
    }
    // PostgreSQL's password is in the URL, and lockbench's redaction hides it.
    let pg = lockbench_registry::find("pg-advisory").unwrap();
    let v = settings.for_backend(pg, None).unwrap();
    assert!(v["url"].as_str().unwrap().contains(":lockbench@"));
    let shown = pg.redacted(&v).to_string();
    assert!(!shown.contains(":lockbench@"), "{shown}");
}

#[test]
fn compose_endpoints_are_the_same_servers_by_service_name() {
    let c = compose();
    let names: BTreeSet<String> = services(&c).into_iter().map(|(n, _)| n).collect();
    let ports = published(&c);
    let path = docker_dir().join("endpoints.compose.toml");
    let inside = Settings::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let outside = Settings::from_file(&docker_dir().join("endpoints.toml")).unwrap();
    for (_, eps) in raw_endpoints(&read("endpoints.compose.toml")) {
        for (host, port) in eps {
            assert!(names.contains(&host), "{host}:{port}: no service {host}");
            assert!(
                ports.iter().any(|p| p.service == host && p.target == port),
                "{host}:{port}: {host} has no container port {port}"
            );
        }
    }
    let overridden = env_overrides();
    if !overridden.is_empty() {
        println!(
            "skipped the parsed checks: {overridden:?} set in the environment override the file"
        );
        return;
    }
    // Service and container port -> the host port it is published on.
    let to_host = |(h, p): &Endpoint| -> Endpoint {
        let pub_ = ports
            .iter()
            .find(|x| &x.service == h && x.target == *p)
            .unwrap_or_else(|| panic!("{h}:{p} is not published"));
        ("127.0.0.1".to_string(), pub_.host_port)
    };
    let a = parsed_endpoints(&inside);
    let b = parsed_endpoints(&outside);
    for f in FAMILIES {
        let moved: Vec<Endpoint> = a[f].iter().map(to_host).collect();
        assert_eq!(moved, b[f], "[{f}] differs from docker/endpoints.toml");
    }
    assert_eq!(config_errors(&inside, &to_host), Vec::<String>::new());
}

#[test]
fn a_bad_config_is_caught_by_the_same_checks() {
    if !env_overrides().is_empty() {
        println!(
            "skipped: {:?} set in the environment override the files",
            env_overrides()
        );
        return;
    }
    let good = read("endpoints.toml");
    assert_eq!(toml_errors(&good), Vec::<String>::new());
    let cases = [
        (
            "an unknown table",
            "[reddis]\nurl = \"redis://127.0.0.1:27379\"\n",
        ),
        (
            "an unknown key",
            "[redis]\nurll = \"redis://127.0.0.1:27379\"\n",
        ),
        (
            "etcd members mixing http and https",
            "[etcd]\nendpoints = [\"https://127.0.0.1:22379\", \"http://127.0.0.1:22479\"]\n",
        ),
        (
            "a zookeeper host without a port",
            "[zookeeper]\nconnect = \"127.0.0.1\"\n",
        ),
        (
            "a redlock master that is not redis://",
            "[redlock]\nurls = [\"http://127.0.0.1:27381\"]\n",
        ),
        (
            "not a postgres URL",
            "[postgres]\nurl = \"mysql://127.0.0.1:25432/x\"\n",
        ),
        (
            "a sentinel URL without the master name",
            "[redis]\nurl = \"redis+sentinel://127.0.0.1:27392\"\n",
        ),
    ];
    for (what, text) in cases {
        assert!(
            !toml_errors(text).is_empty(),
            "{what} was accepted:\n{text}"
        );
    }
}

#[test]
fn the_worker_service_builds_the_image_and_mounts_its_config() {
    let c = compose();
    let w = &c["services"]["worker"];
    assert_eq!(
        words(&w["profiles"]),
        ["workers"],
        "docker compose up alone must not start workers"
    );
    assert_eq!(text(&w["build"]["context"]).as_deref(), Some(".."));
    let dockerfile = text(&w["build"]["dockerfile"]).unwrap();
    assert_eq!(dockerfile, "docker/Dockerfile");
    assert!(docker_dir().join("..").join(&dockerfile).is_file());
    assert!(
        w["container_name"].is_badvalue(),
        "a container_name cannot --scale"
    );
    let argv = words(&w["command"]);
    assert_eq!(argv.first().map(String::as_str), Some("worker"), "{argv:?}");
    let after = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .and_then(|i| argv.get(i + 1))
            .cloned()
            .unwrap_or_else(|| panic!("no {flag} in {argv:?}"))
    };
    assert!(after("--run").contains("LOCKBENCH_RUN_ID"));
    let config = after("--config");
    let mounts = words(&w["volumes"]);
    let mount = mounts
        .iter()
        .find(|m| m.split(':').nth(1) == Some(config.as_str()))
        .unwrap_or_else(|| panic!("nothing mounted at {config}: {mounts:?}"));
    assert_eq!(mount.split(':').next(), Some("./endpoints.compose.toml"));
    assert!(docker_dir().join("endpoints.compose.toml").is_file());

    // The image: the crate's own package and binary names, a Rust build
    // stage and a slim Debian runtime.
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let name_in = |section: &str| {
        manifest
            .split(section)
            .nth(1)
            .and_then(|s| s.lines().find_map(|l| l.trim().strip_prefix("name = ")))
            .map(|n| n.trim_matches('"').to_string())
            .unwrap()
    };
    let (package, binary) = (name_in("[package]"), name_in("[[bin]]"));
    let df = read("Dockerfile");
    let froms: Vec<&str> = df
        .lines()
        .filter_map(|l| l.trim().strip_prefix("FROM "))
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(froms, ["rust:1.95-bookworm", "debian:bookworm-slim"]);
    assert!(froms.iter().all(|i| image_pinned(i)));
    for needle in [
        "protobuf-compiler".to_string(),
        "ca-certificates".to_string(),
        format!("cargo build --release --locked -p {package}"),
        format!("target/release/{binary}"),
        format!("ENTRYPOINT [\"{binary}\"]"),
    ] {
        assert!(df.contains(&needle), "docker/Dockerfile lacks {needle:?}");
    }
    // The context is the repository root: keep the build dirs out of it.
    let ignore = read("Dockerfile.dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "**/target"), "{ignore}");
}

#[test]
fn the_k8s_job_is_indexed_and_passes_its_shard() {
    let docs = k8s_docs();
    assert_eq!(job_problems(&docs), Vec::<String>::new());

    // The ConfigMap's endpoints are docker/endpoints.toml's, at the fleet
    // host the pods resolve through hostAliases; lockbench accepts them.
    let cm = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("ConfigMap"))
        .unwrap();
    let toml = cm["data"]["endpoints.toml"].as_str().unwrap();
    let s = Settings::from_toml(toml).unwrap_or_else(|e| panic!("ConfigMap endpoints.toml: {e}"));
    let job = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Job"))
        .unwrap();
    let aliases = &job["spec"]["template"]["spec"]["hostAliases"];
    assert!(
        aliases
            .as_vec()
            .unwrap()
            .iter()
            .any(|a| words(&a["hostnames"]).iter().any(|h| h == K8S_FLEET_HOST)),
        "no hostAliases entry for {K8S_FLEET_HOST}"
    );
    let raw = raw_endpoints(toml);
    for (table, eps) in &raw {
        assert!(
            eps.iter().all(|(h, _)| h == K8S_FLEET_HOST),
            "[{table}] {eps:?}"
        );
    }
    if !env_overrides().is_empty() {
        println!("skipped the parsed checks: the environment overrides the file");
        return;
    }
    let to_loopback = |(h, p): &Endpoint| -> Endpoint {
        assert_eq!(h, K8S_FLEET_HOST);
        ("127.0.0.1".to_string(), *p)
    };
    let host = Settings::from_file(&docker_dir().join("endpoints.toml")).unwrap();
    let (k, d) = (parsed_endpoints(&s), parsed_endpoints(&host));
    for f in FAMILIES {
        let moved: Vec<Endpoint> = k[f].iter().map(to_loopback).collect();
        assert_eq!(
            moved, d[f],
            "ConfigMap [{f}] differs from docker/endpoints.toml"
        );
    }
    assert_eq!(config_errors(&s, &to_loopback), Vec::<String>::new());
}

#[test]
fn a_job_that_does_not_shard_is_flagged() {
    let docs = yaml(
        "apiVersion: batch/v1\n\
         kind: Job\n\
         spec:\n\
         \x20 completions: 4\n\
         \x20 parallelism: 2\n\
         \x20 template:\n\
         \x20   spec:\n\
         \x20     containers:\n\
         \x20       - name: w\n\
         \x20         image: 'lockbench:0.1.0'\n\
         \x20         args: [worker, --run, $(RUN_ID), --config, /etc/lockbench/endpoints.toml]\n",
    );
    let p = job_problems(&docs);
    for want in [
        "completionMode",
        "parallelism",
        "--shard",
        "$(RUN_ID) is not in the container's env",
        "not a key of a ConfigMap",
    ] {
        assert!(
            p.iter().any(|x| x.contains(want)),
            "{want:?} not flagged: {p:?}"
        );
    }
}

#[test]
fn docker_compose_accepts_the_file_where_it_exists() {
    let has_compose = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_compose {
        println!("skipped: no `docker compose` here (no docker binary, or no compose plugin)");
        return;
    }
    let file = docker_dir().join("compose.yml");
    for profile in [None, Some("workers")] {
        let mut cmd = Command::new("docker");
        cmd.arg("compose").arg("-f").arg(&file);
        if let Some(p) = profile {
            cmd.args(["--profile", p]);
        }
        let out = cmd.args(["config", "-q"]).output().unwrap();
        assert!(
            out.status.success(),
            "docker compose config -q (profile {profile:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
