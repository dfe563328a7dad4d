//! One PostgreSQL server, initdb'd into a temp dir.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::node::{start_on_free_port, Node, NodeSpec};
use crate::process::{self, SpawnSpec};
use crate::{
    find_binary, fleet_dir, loopback_addr, Durability, DurabilitySettings, FleetError, Result,
    ServerKind,
};

/// The newest `/usr/lib/postgresql/<major>/bin`, where Debian keeps the
/// server binaries (they are not on PATH).
fn pg_bin_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                    Some((v, e.path().join("bin")))
                })
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.into_iter().rev().map(|(_, p)| p).collect()
}

fn pg_binary(name: &str) -> Result<PathBuf> {
    // Prefer Debian's versioned dir over PATH wrappers.
    for d in pg_bin_dirs() {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    find_binary(name, "postgresql", &[])
}

/// PostgreSQL refuses to run as root: as root we run it as `postgres`.
fn server_user() -> Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = c"postgres";
    // SAFETY: getpwnam returns a pointer into static storage or null; we
    // copy the two integers out before any other call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return Err(FleetError::MissingBinary {
            binary: "user `postgres`".into(),
            looked: "/etc/passwd".into(),
            package: "postgresql",
        });
    }
    // SAFETY: pw is non-null and points to a valid passwd struct.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some((uid, gid)))
}

fn chown_to(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    if let Some((uid, gid)) = user {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .map_err(FleetError::io(format!("chown {}", path.display())))?;
    }
    Ok(())
}

/// The `-c` settings of a profile. Volatile keeps `fsync` on: a commit may
/// be acknowledged before its WAL is flushed (the WAL writer flushes within
/// three `wal_writer_delay`s), so a crash loses the last commits but never
/// corrupts the cluster, which `fsync=off` could.
fn pg_durability(durability: Durability) -> DurabilitySettings {
    let (flags, note): (&[&str], _) = match durability {
        Durability::Durable => (
            &[],
            "fsync=on, synchronous_commit=on (the defaults): COMMIT returns once its WAL is flushed",
        ),
        Durability::Volatile => (
            &["-c", "synchronous_commit=off"],
            "COMMIT returns before its WAL is flushed; fsync stays on",
        ),
    };
    DurabilitySettings {
        kind: ServerKind::Postgresql,
        profile: durability,
        flags: flags.iter().map(|s| s.to_string()).collect(),
        note,
    }
}

fn pg_isready(node: &Node) -> std::result::Result<(), String> {
    let bin = pg_binary("pg_isready").map_err(|e| e.to_string())?;
    let out = std::process::Command::new(bin)
        .args([
            "-q",
            "-t",
            "1",
            "-h",
            &node.addr().to_string(),
            "-p",
            &node.port().to_string(),
        ])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("pg_isready: {}", out.status))
    }
}

/// One PostgreSQL server with trust authentication on its own loopback
/// address and a short unix-socket directory.
#[derive(Debug)]
pub struct PostgresFleet {
    /// The server.
    pub node: Node,
    socket_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl PostgresFleet {
    /// Runs `initdb` and starts the server, durable
    /// ([`Durability::Durable`]: as shipped).
    ///
    /// # Errors
    /// Missing `postgresql` package, initdb failure (with its output), or a
    /// server that `pg_isready` never reports ready.
    pub fn start() -> Result<Self> {
        Self::start_with(Durability::Durable)
    }

    /// [`PostgresFleet::start`] in the given durability profile.
    ///
    /// # Errors
    /// As for [`PostgresFleet::start`].
    pub fn start_with(durability: Durability) -> Result<Self> {
        let durability = pg_durability(durability);
        let dir = fleet_dir("pg")?;
        let user = server_user()?;
        let data = dir.path().join("data");
        let socket_dir = dir.path().join("s");
        for d in [&data, &socket_dir] {
            std::fs::create_dir_all(d)
                .map_err(FleetError::io(format!("creating {}", d.display())))?;
            chown_to(d, user)?;
        }
        let initdb = pg_binary("initdb")?;
        let postgres = pg_binary("postgres")?;
        process::run_to_completion(
            SpawnSpec {
                program: initdb,
                args: vec![
                    "-D".into(),
                    data.display().to_string(),
                    "-U".into(),
                    "postgres".into(),
                    "--auth=trust".into(),
                    "-E".into(),
                    "UTF8".into(),
                    "--no-sync".into(),
                    "--no-instructions".into(),
                ],
                env: vec![("LC_ALL".into(), "C".into())],
                cwd: dir.path().to_path_buf(),
                log: dir.path().join("initdb.log"),
                run_as: user,
            },
            Duration::from_secs(60),
        )?;
        let addr: Ipv4Addr = loopback_addr();
        let node = start_on_free_port(addr, |port| {
            let mut args: Vec<String> = vec![
                "-D".into(),
                data.display().to_string(),
                "-p".into(),
                port.to_string(),
                "-c".into(),
                format!("listen_addresses={addr}"),
                "-c".into(),
                format!("unix_socket_directories={}", socket_dir.display()),
                "-c".into(),
                "max_connections=300".into(),
            ];
            args.extend(durability.flags.iter().cloned());
            Ok(NodeSpec {
                name: "postgres".into(),
                program: postgres.clone(),
                args,
                env: vec![("LC_ALL".into(), "C".into())],
                dir: dir.path().to_path_buf(),
                addr,
                port,
                run_as: user,
                ready: pg_isready,
                ready_within: Duration::from_secs(30),
                clock_file: None,
                durability: Some(durability.clone()),
            })
        })?;
        Ok(Self {
            node,
            socket_dir,
            _dir: dir,
        })
    }

    /// `postgres://postgres@addr:port/postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@{}:{}/postgres",
            self.node.addr(),
            self.node.port()
        )
    }

    /// The unix-socket directory (for `host=` in libpq-style URLs).
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// Turns TLS on (the server keeps accepting plain connections too):
    /// a certificate for its address, signed by a CA made for it (see
    /// [`crate::make_certs`]), set with `ALTER SYSTEM` and a reload. A
    /// client then asks for it with `sslmode=verify-full&sslrootcert=CA`.
    ///
    /// # Errors
    /// A missing `openssl`, or the server refusing the settings.
    pub fn enable_tls(&self) -> Result<crate::TestCerts> {
        let certs = crate::make_certs(&self._dir.path().join("tls"), self.node.addr())?;
        // The server reads its key as its own user, and refuses a key that
        // others can read.
        let user = server_user()?;
        for f in [&certs.cert, &certs.key] {
            chown_to(f, user)?;
        }
        std::fs::set_permissions(
            &certs.key,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .map_err(FleetError::io(format!("chmod {}", certs.key.display())))?;
        // One statement per psql call: ALTER SYSTEM refuses a transaction.
        for sql in [
            format!(
                "ALTER SYSTEM SET ssl_cert_file = '{}'",
                certs.cert.display()
            ),
            format!("ALTER SYSTEM SET ssl_key_file = '{}'", certs.key.display()),
            "ALTER SYSTEM SET ssl = on".to_string(),
            "SELECT pg_reload_conf()".to_string(),
        ] {
            self.psql(&sql)?;
        }
        Ok(certs)
    }

    /// Runs one SQL statement with `psql` and returns its unaligned output.
    ///
    /// # Errors
    /// Missing `psql`, or the statement failing (with psql's stderr).
    pub fn psql(&self, sql: &str) -> Result<String> {
        let bin = find_binary("psql", "postgresql-client", &pg_bin_dirs())?;
        let out = std::process::Command::new(bin)
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                &self.node.addr().to_string(),
                "-p",
                &self.node.port().to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .output()
            .map_err(FleetError::io("running psql"))?;
        if !out.status.success() {
            return Err(FleetError::Control {
                node: "postgres".into(),
                op: "psql",
                message: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}
