//! Clock faults through libfaketime (Debian `faketime`).
//!
//! Trap: Debian's redis-server links jemalloc, whose initialisation calls
//! `clock_gettime`, which libfaketime intercepts and answers with `malloc`:
//! the process hangs ("Unexpected recursive calls to clock_gettime()",
//! libfaketime issue #130). Preloading a tiny library that routes the malloc
//! family to glibc, ahead of libfaketime, breaks the cycle. It is compiled
//! here with gcc, at run time, into the fleet's directory.

use std::path::{Path, PathBuf};

use crate::{find_binary, FleetError, Result};

const MALLOC_SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t a, size_t b) { return __libc_calloc(a, b); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
void *memalign(size_t a, size_t n) { return __libc_memalign(a, n); }
void *aligned_alloc(size_t a, size_t n) { return __libc_memalign(a, n); }
void *valloc(size_t n) { return __libc_valloc(n); }
void *pvalloc(size_t n) { return __libc_pvalloc(n); }
int posix_memalign(void **out, size_t a, size_t n) {
  void *p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
/* glibc exports no __libc_ alias for this one: ask libc itself. */
size_t malloc_usable_size(void *p) {
  static size_t (*real)(void *);
  if (!real) {
    void *h = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    real = h ? (size_t (*)(void *))dlsym(h, "malloc_usable_size") : 0;
  }
  return real ? real(p) : 0;
}
"#;

fn libfaketime() -> Result<PathBuf> {
    let candidates = std::fs::read_dir("/usr/lib")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().join("faketime/libfaketime.so.1"))
                .chain(std::iter::once(PathBuf::from(
                    "/usr/lib/faketime/libfaketime.so.1",
                )))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| FleetError::MissingBinary {
            binary: "libfaketime.so.1".into(),
            looked: "/usr/lib/*/faketime".into(),
            package: "faketime",
        })
}

/// Builds the malloc shim into `dir` (once per fleet).
fn malloc_shim(dir: &Path) -> Result<PathBuf> {
    let so = dir.join("malloc-shim.so");
    if so.is_file() {
        return Ok(so);
    }
    let gcc = find_binary("gcc", "gcc", &[])?;
    let src = dir.join("malloc-shim.c");
    std::fs::write(&src, MALLOC_SHIM_C).map_err(FleetError::io("writing malloc-shim.c"))?;
    let out = std::process::Command::new(gcc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&so)
        .arg(&src)
        .arg("-ldl")
        .output()
        .map_err(FleetError::io("running gcc"))?;
    if !out.status.success() {
        return Err(FleetError::Control {
            node: "fleet".into(),
            op: "compile malloc shim",
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(so)
}

/// The environment that runs a server under libfaketime, its fake clock
/// read from `clock_file` on every call (so a change takes effect at once).
pub(crate) fn env(shim_dir: &Path, clock_file: &Path) -> Result<Vec<(String, String)>> {
    let preload = format!(
        "{}:{}",
        malloc_shim(shim_dir)?.display(),
        libfaketime()?.display()
    );
    write_clock(clock_file, "+0")?;
    Ok(vec![
        ("LD_PRELOAD".into(), preload),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            clock_file.display().to_string(),
        ),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
    ])
}

/// Sets the fake clock: libfaketime syntax, e.g. `+30s` (jump ahead),
/// `-5s`, `+0 x10` (run ten times fast), `+0` (real time).
pub(crate) fn write_clock(clock_file: &Path, spec: &str) -> Result<()> {
    // Written whole then renamed: libfaketime must never read half a spec.
    let tmp = clock_file.with_extension("tmp");
    std::fs::write(&tmp, format!("{spec}\n")).map_err(FleetError::io("writing the fake clock"))?;
    std::fs::rename(&tmp, clock_file).map_err(FleetError::io("writing the fake clock"))
}
