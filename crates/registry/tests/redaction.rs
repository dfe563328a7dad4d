//! No password and no TLS path survives a backend's redaction, in every
//! URL form lockbench accepts, given by `--endpoint` or by the config file:
//! what results.json, the report and the logs show of the settings goes
//! through it. (End to end, with real servers: the CLI tests
//! `no_password_reaches_the_results` and
//! `no_password_of_the_data_store_reaches_the_results`.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use lockbench_registry::{find, Settings};

const SECRETS: &[&str] = &["pw1SECRET", "pw2SECRET", "/etc/SECRET-ca.pem"];

fn assert_hidden(what: &str, shown: &str) {
    for s in SECRETS {
        assert!(!shown.contains(s), "{what}: {s} shown in {shown}");
    }
}

#[test]
fn every_url_form_is_redacted_from_the_endpoint_and_from_the_file() {
    let endpoints: &[(&str, &str)] = &[
        ("redis", "redis://default:pw1SECRET@127.0.0.2:7000"),
        ("redis", "rediss://:pw1SECRET@127.0.0.2:7000"),
        (
            "redis",
            "redis+sentinel://:pw1SECRET@127.0.0.2:1,127.0.0.3:2/lockbench",
        ),
        ("redis", "redis+cluster://u:pw1SECRET@127.0.0.2:1,127.0.0.3:2"),
        ("redis-wait", "redis+sentinel://:pw1SECRET@127.0.0.2:1/lockbench"),
        ("redis-cluster", "redis+cluster://:pw1SECRET@127.0.0.2:1"),
        (
            "redlock",
            "redis://:pw1SECRET@127.0.0.2:1,redis://:pw2SECRET@127.0.0.3:2",
        ),
        (
            "pg-advisory",
            "postgres://u:pw1SECRET@127.0.0.2:5/db?sslmode=verify-full&sslrootcert=/etc/SECRET-ca.pem&sslpassword=pw2SECRET",
        ),
        ("pg-row", "postgresql://u:pw1SECRET@127.0.0.2:5/db"),
        ("pg-optimistic", "postgres://u:pw1SECRET@127.0.0.2:5/db"),
        ("etcd", "https://root:pw1SECRET@127.0.0.2:1,https://root:pw2SECRET@127.0.0.3:2"),
    ];
    for (backend, ep) in endpoints {
        let b = find(backend).unwrap();
        let v = Settings::default().for_backend(b, Some(ep)).unwrap();
        let raw = serde_json::to_string(&v).unwrap();
        assert!(
            raw.contains("pw1SECRET"),
            "the settings carry the secret: {raw}"
        );
        let shown = serde_json::to_string(&b.redacted(&v)).unwrap();
        assert_hidden(&format!("{backend} --endpoint {ep}"), &shown);
        // The redacted form still says where: the hosts stay.
        assert!(shown.contains("127.0.0.2"), "{backend}: {shown}");
    }
    let files: &[(&str, &str)] = &[
        (
            "redis",
            "[redis]\nurl = \"rediss://:pw1SECRET@127.0.0.2:1\"\ntls_ca_file = \"/etc/SECRET-ca.pem\"\n",
        ),
        (
            "redis",
            "[redis]\nsentinels = [\"127.0.0.2:1\"]\nmaster_name = \"m\"\nurl = \"redis://:pw1SECRET@127.0.0.2:9\"\n",
        ),
        (
            "redlock",
            "[redlock]\nurls = [\"redis://:pw1SECRET@127.0.0.2:1\", \"redis://:pw2SECRET@127.0.0.3:1\"]\n",
        ),
        (
            "etcd",
            "[etcd]\nendpoints = [\"https://u:pw1SECRET@127.0.0.2:1\"]\nca_file = \"/etc/SECRET-ca.pem\"\n",
        ),
        (
            "pg-row",
            "[postgres]\nurl = \"postgres://u:pw1SECRET@127.0.0.2:5/db?sslrootcert=/etc/SECRET-ca.pem\"\n",
        ),
    ];
    for (backend, text) in files {
        let b = find(backend).unwrap();
        let s = Settings::from_toml(text).unwrap();
        // Some of these combinations are refused later by validation (a
        // URL and a sentinel list at once); what is shown must be hidden
        // all the same.
        let v = s.for_backend(b, None).unwrap();
        let raw = serde_json::to_string(&v).unwrap();
        assert!(
            raw.contains("SECRET"),
            "the settings carry the secret: {raw}"
        );
        let shown = serde_json::to_string(&b.redacted(&v)).unwrap();
        assert_hidden(&format!("{backend} file {text}"), &shown);
    }
}
