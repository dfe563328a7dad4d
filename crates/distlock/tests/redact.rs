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
