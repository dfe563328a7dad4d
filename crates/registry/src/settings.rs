//! Settings of every backend: the `--config` TOML file (one table per
//! backend family), then each backend's environment variables, then
//! `--endpoint`.

use std::collections::BTreeMap;
use std::path::Path;

use distlock::{Error, Result};
use serde_json::Value;

use crate::{Descriptor, BACKENDS};

/// The config file's tables, by family (`redis`, `postgres`, ...).
#[derive(Debug, Clone, Default)]
pub struct Settings {
    tables: BTreeMap<String, Value>,
}

impl Settings {
    /// Reads a lockbench TOML file. A table no backend reads is an error
    /// naming it and the tables that exist, not a silent no-op.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file and what is wrong with it.
    pub fn from_file(path: &Path) -> Result<Self> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::config("--config", format!("reading {shown}: {e}")))?;
        Self::from_toml(&text).map_err(|e| match e {
            Error::Config { key, message } => Error::config(key, format!("{message} (in {shown})")),
            other => other,
        })
    }

    /// Parses TOML text (see [`Settings::from_file`]).
    ///
    /// # Errors
    /// [`Error::Config`] for bad TOML or an unknown table.
    pub fn from_toml(text: &str) -> Result<Self> {
        let doc: toml::Table =
            toml::from_str(text).map_err(|e| Error::config("--config", e.to_string()))?;
        let families: Vec<&str> = {
            let mut f: Vec<&str> = BACKENDS.iter().map(|b| b.family()).collect();
            f.sort_unstable();
            f.dedup();
            f
        };
        let mut tables = BTreeMap::new();
        for (name, value) in doc {
            if !families.contains(&name.as_str()) {
                return Err(Error::config(
                    name,
                    format!(
                        "no backend reads this table; known: {}",
                        families.join(", ")
                    ),
                ));
            }
            let v = serde_json::to_value(value)
                .map_err(|e| Error::config(name.clone(), e.to_string()))?;
            // Every table is checked, whichever backend runs: a typo in a
            // table the chosen backend does not read went unnoticed. The
            // environment is the running backend's business (its
            // `LOCKBENCH_*` errors come when it reads them).
            // One backend of the family taking it is enough.
            let mut first_error = None;
            for b in BACKENDS.iter().filter(|b| b.family() == name) {
                match b.settings(Some(v.clone())) {
                    Err(Error::Config { key, .. }) if key.starts_with("LOCKBENCH_") => {
                        first_error = None;
                        break;
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                    Ok(_) => {
                        first_error = None;
                        break;
                    }
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
            tables.insert(name, v);
        }
        Ok(Self { tables })
    }

    /// The settings of backend `b`: its family's table (or defaults), the
    /// environment over it, then `endpoint` if given.
    ///
    /// # Errors
    /// [`Error::Config`] naming the bad key or variable.
    pub fn for_backend(&self, b: &dyn Descriptor, endpoint: Option<&str>) -> Result<Value> {
        let mut v = b.settings(self.tables.get(b.family()).cloned())?;
        if let Some(ep) = endpoint {
            b.set_endpoint(&mut v, ep)?;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_table_is_named() {
        let e = Settings::from_toml("[reddis]\nurl = \"redis://x\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("reddis") && e.contains("redis"), "{e}");
    }

    #[test]
    fn an_unknown_key_is_named() {
        let s = Settings::from_toml("[redis]\nurll = \"redis://x\"\n");
        let e = s
            .and_then(|s| s.for_backend(&lockbench_redis::REDIS, None))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("urll"), "{e}");
    }

    /// A typo in a table the running backend does not read is named too
    /// (`[redis] urll` with `--backends pg-advisory` was ignored).
    #[test]
    fn an_unknown_key_in_any_table_is_named_at_once() {
        let e = Settings::from_toml("[postgres]\n[redis]\nurll = \"redis://x\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("urll"), "{e}");
    }

    #[test]
    fn the_endpoint_wins_over_the_file() {
        let s = Settings::from_toml("[redlock]\nurls = [\"redis://127.0.0.9:1\"]\n");
        let v = s
            .and_then(|s| {
                s.for_backend(
                    &lockbench_redlock::REDLOCK,
                    Some("redis://127.0.0.2:1, redis://127.0.0.3:1"),
                )
            })
            .ok();
        assert_eq!(
            v.and_then(|v| v.get("urls").cloned()),
            Some(serde_json::json!([
                "redis://127.0.0.2:1",
                "redis://127.0.0.3:1"
            ]))
        );
    }
}
