//! Passwords never leave a URL we print.

#[test]
fn passwords_are_hidden_and_nothing_else_changes() {
    use distlock::redact_url;
    assert_eq!(
        redact_url("redis://user:s3cret@127.0.0.2:7000"),
        "redis://user:***@127.0.0.2:7000"
    );
    assert_eq!(
        redact_url("postgres://postgres:pw@h/db?host=/s"),
        "postgres://postgres:***@h/db?host=/s"
    );
    assert_eq!(
        redact_url("redis://127.0.0.2:7000"),
        "redis://127.0.0.2:7000"
    );
    assert_eq!(
        redact_url("postgres://postgres@h/db"),
        "postgres://postgres@h/db"
    );
}

#[test]
fn tls_paths_in_a_url_are_hidden_too() {
    use distlock::redact_url;
    assert_eq!(
        redact_url("postgres://u:pw@h/db?sslmode=verify-full&sslrootcert=/etc/ca.pem&sslkey=/k"),
        "postgres://u:***@h/db?sslmode=verify-full&sslrootcert=***&sslkey=***"
    );
    assert_eq!(
        redact_url("postgres://u@h/db?sslmode=require"),
        "postgres://u@h/db?sslmode=require"
    );
}

#[test]
fn tls_file_settings_are_hidden_and_others_kept() {
    let v = serde_json::json!({
        "url": "rediss://:pw@h:1", "tls_ca_file": "/secret/ca.pem", "ca_file": "/x/ca.pem",
        "key_prefix": "lockbench", "op_timeout_ms": 5
    });
    let r = distlock::descriptor::redact_json(&v);
    assert_eq!(r["url"], "rediss://:***@h:1");
    assert_eq!(r["tls_ca_file"], "***");
    assert_eq!(r["ca_file"], "***");
    assert_eq!(r["key_prefix"], "lockbench");
    assert_eq!(r["op_timeout_ms"], 5);
}
