//! The report in a real browser: Debian's headless Chromium loads a page
//! rendered from a results fixture (with faults and a violation, so every
//! section renders) and must find every section, make no network request
//! and log no console message. It saves screenshots into `target/`.
//!
//! The network check routes all of Chromium's traffic, loopback included,
//! through a proxy this test listens on: a page that fetched anything (a
//! font, a script, an image by URL) would reach it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::io::Read as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECTIONS: &[&str] = &[
    "verdict",
    "guide",
    "decide",
    "safety",
    "faults",
    "timelines",
    "latency",
    "throughput",
    "scaling",
    "costs",
    "benches",
    "sale",
];

fn chromium() -> PathBuf {
    for name in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("chromium is not installed: run scripts/setup.sh (Debian package `chromium`)");
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

/// Every request that reached the proxy: its first line.
struct Proxy {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start() -> Self {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                match l.accept() {
                    Ok((mut c, _)) => {
                        c.set_read_timeout(Some(Duration::from_secs(2))).ok();
                        let mut buf = [0u8; 512];
                        let n = c.read(&mut buf).unwrap_or(0);
                        let line = String::from_utf8_lossy(&buf[..n])
                            .lines()
                            .next()
                            .unwrap_or("(connection, nothing sent)")
                            .to_string();
                        s.lock().unwrap().push(line);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Self { port, seen, stop }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs Chromium with the flags plus `extra`, bounded in time;
/// returns (stdout, stderr).
fn run_chromium(profile: &Path, proxy: u16, extra: &[String], url: &str) -> (String, String) {
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg(format!("--proxy-server=http://127.0.0.1:{proxy}"))
    // "<-loopback>" removes the implicit bypass: even 127.0.0.1 would
    // go through the proxy.
    .arg("--proxy-bypass-list=<-loopback>")
    // Chromium's own services (time, component updates, sign-in) still
    // call out despite the flags; these quiet most of them and
    // `page_requests` sets aside the rest by host.
    .args([
        "--disable-sync",
        "--disable-default-apps",
        "--disable-domain-reliability",
        "--disable-client-side-phishing-detection",
        "--no-pings",
        "--disable-features=NetworkTimeServiceQuerying,OptimizationHints,MediaRouter,Translate,AutofillServerCommunication",
    ])
    .args(["--enable-logging=stderr", "--v=0"])
    .args(extra)
    .arg(url)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start chromium");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(90) {
            child.kill().ok();
            child.wait().ok();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (o.join().unwrap(), e.join().unwrap())
}

/// Hosts of Chromium's own background services. The report names none
/// of them (checked below), so a request to one is the browser's, not the
/// page's.
const BROWSER_HOSTS: &[&str] = &["google.com", "googleapis.com", "gvt1.com", "gstatic.com"];

fn host(request_line: &str) -> &str {
    let target = request_line.split_whitespace().nth(1).unwrap_or("");
    let rest = target.split_once("://").map_or(target, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    authority.rsplit_once(':').map_or(authority, |(h, _)| h)
}

/// The requests that did not come from Chromium's own services.
fn page_requests(seen: &[String]) -> Vec<String> {
    seen.iter()
        .filter(|l| {
            let h = host(l);
            !BROWSER_HOSTS
                .iter()
                .any(|b| h == *b || h.ends_with(&format!(".{b}")))
        })
        .cloned()
        .collect()
}

/// Console messages (a CSP violation, a script error) that
/// --enable-logging wrote.
fn console(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Refused to"))
        .collect()
}

/// The negative controls: a page that fetches and logs an error must be
/// caught, through the same proxy, filter and log reading.
#[test]
fn a_page_that_fetches_or_logs_an_error_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("fetches.html");
    std::fs::write(
        &page,
        "<!doctype html><title>x</title><img src=\"http://lockbench-probe.invalid/pixel.png\">\
         <script>console.error(\"lockbench-probe\")</script>",
    )
    .unwrap();
    let proxy = Proxy::start();
    let profile = tempfile::tempdir().unwrap();
    let (_, log) = run_chromium(
        profile.path(),
        proxy.port,
        &["--dump-dom".into()],
        &format!("file://{}", page.display()),
    );
    assert!(
        console(&log).iter().any(|l| l.contains("lockbench-probe")),
        "the console error went unseen:\n{log}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let seen = page_requests(&proxy.seen.lock().unwrap());
    assert!(
        seen.iter().any(|l| l.contains("lockbench-probe.invalid")),
        "the proxy missed the page's request: {seen:#?}"
    );
}

#[test]
fn the_report_renders_in_headless_chromium_offline_and_without_console_errors() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/comparison.json");
    let c = report::load(&fixture).unwrap();
    assert!(
        !c.faults.is_empty() && c.faults.iter().any(|f| f.summary.timeline.is_some()),
        "the fixture must have faults and a violation with its timeline"
    );
    let html = report::render(&c).unwrap();
    for b in BROWSER_HOSTS {
        assert!(!html.contains(b), "the report names {b}");
    }
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("index.html");
    std::fs::write(&page, &html).unwrap();
    let url = format!("file://{}", page.display());
    let proxy = Proxy::start();

    let profile = tempfile::tempdir().unwrap();
    let (dom, log) = run_chromium(profile.path(), proxy.port, &["--dump-dom".into()], &url);
    for id in SECTIONS {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "section #{id} missing from the DOM Chromium built"
        );
    }
    assert!(
        dom.matches("<svg").count() >= 6,
        "charts missing: {} svg",
        dom.matches("<svg").count()
    );
    assert!(dom.contains("acquires while worker"), "no timeline drawn");
    assert!(
        dom.contains("its raw floor") && !dom.contains("Not added: run"),
        "the fixture's cargo bench figures were not drawn"
    );
    let console = console(&log);
    assert!(console.is_empty(), "console messages: {console:#?}");

    let shots = target_dir();
    std::fs::create_dir_all(&shots).unwrap();
    for (name, size) in [
        ("report-laptop.png", "1366,800"),
        ("report-full.png", "1366,16000"),
    ] {
        let profile = tempfile::tempdir().unwrap();
        let shot = shots.join(name);
        let _ = std::fs::remove_file(&shot);
        let (_, log) = run_chromium(
            profile.path(),
            proxy.port,
            &[
                format!("--screenshot={}", shot.display()),
                format!("--window-size={size}"),
                "--hide-scrollbars".into(),
            ],
            &url,
        );
        let png =
            std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot {name}: {e}\n{log}"));
        assert!(png.starts_with(b"\x89PNG"), "{name} is not a PNG");
        assert!(png.len() > 10_000, "{name} is nearly empty");
    }
    // Give a late request time to arrive before judging.
    std::thread::sleep(Duration::from_millis(300));
    let seen = page_requests(&proxy.seen.lock().unwrap());
    assert!(seen.is_empty(), "network requests: {seen:#?}");
}
