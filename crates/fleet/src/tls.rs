//! Throwaway TLS certificates for servers started here: a CA made for one
//! fleet and a server certificate for one loopback address, signed by it,
//! made with the `openssl` command (Debian's `openssl` package), so a test
//! can point a client at the CA and have it verify the server for real.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::process::{self, SpawnSpec};
use crate::{find_binary, FleetError, Result};

/// A CA and one server's certificate and key, as PEM files.
#[derive(Debug, Clone)]
pub struct TestCerts {
    /// The CA's certificate: what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate (subjectAltName = its IP address).
    pub cert: PathBuf,
    /// The server's private key (unencrypted).
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    process::run_to_completion(
        SpawnSpec {
            program: find_binary("openssl", "openssl", &[])?,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            cwd: dir.to_path_buf(),
            log: dir.join("openssl.log"),
            run_as: None,
        },
        Duration::from_secs(30),
    )
}

/// Makes a CA and a certificate for a server at `addr` in `dir` (P-256
/// keys, valid two days).
///
/// # Errors
/// A missing `openssl` (naming its package) or a failing command (with
/// its output).
pub fn make_certs(dir: &Path, addr: Ipv4Addr) -> Result<TestCerts> {
    std::fs::create_dir_all(dir).map_err(FleetError::io(format!("creating {}", dir.display())))?;
    let ext = dir.join("server.ext");
    std::fs::write(
        &ext,
        format!(
            "subjectAltName=IP:{addr}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .map_err(FleetError::io(format!("writing {}", ext.display())))?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-subj",
        "/CN=lockbench test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &ca)?;
    let cn = format!("/CN={addr}");
    let mut csr = vec!["req", "-nodes"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr", "-subj", &cn]);
    openssl(dir, &csr)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            "server.pem",
            "-extfile",
            "server.ext",
        ],
    )?;
    Ok(TestCerts {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    })
}
