//! Secrets from the environment, as cc-lib's `util.SecretFromEnv` resolves them: the
//! variable `NAME`, else the contents of the file named by `NAME_FILE` (trimmed), else the
//! configured value. A file that is named but unreadable or empty is an error, never a
//! silent fallback, so a broken secret mount is noticed at start.

use std::ffi::OsString;
use std::path::PathBuf;

/// A secret file named by `NAME_FILE` that cannot be used. The message names the variable
/// and the file, never the secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file cannot be read.
    #[error("reading the file {path:?} named by {variable}: {source}")]
    Unreadable {
        /// The `NAME_FILE` variable.
        variable: String,
        /// The file it names.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The file holds only whitespace.
    #[error("the file {path:?} named by {variable} is empty")]
    Empty {
        /// The `NAME_FILE` variable.
        variable: String,
        /// The file it names.
        path: PathBuf,
    },
}

/// Resolves the secret `name` from the process environment, falling back to `configured`.
pub fn from_env(name: &str, configured: &str) -> Result<String, SecretError> {
    from_env_with(name, configured, |var| std::env::var_os(var))
}

/// [`from_env`] with an injected environment, so tests need not touch the process's.
pub fn from_env_with(
    name: &str,
    configured: &str,
    env: impl Fn(&str) -> Option<OsString>,
) -> Result<String, SecretError> {
    if let Some(value) = env(name).filter(|v| !v.is_empty()) {
        return Ok(value.to_string_lossy().into_owned());
    }
    let file_variable = format!("{name}_FILE");
    if let Some(path) = env(&file_variable).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        let content = std::fs::read_to_string(&path).map_err(|source| SecretError::Unreadable {
            variable: file_variable.clone(),
            path: path.clone(),
            source,
        })?;
        let secret = content.trim();
        if secret.is_empty() {
            return Err(SecretError::Empty {
                variable: file_variable,
                path,
            });
        }
        return Ok(secret.to_owned());
    }
    Ok(configured.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn precedence_is_variable_then_file_then_config() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secret");
        std::fs::write(&file, "  from-file\n").unwrap();
        let file = file.to_str().unwrap();
        assert_eq!(
            from_env_with("S", "cfg", env(&[("S", "v"), ("S_FILE", file)])).unwrap(),
            "v"
        );
        assert_eq!(
            from_env_with("S", "cfg", env(&[("S", ""), ("S_FILE", file)])).unwrap(),
            "from-file"
        );
        assert_eq!(from_env_with("S", "cfg", env(&[])).unwrap(), "cfg");
        let blank = dir.path().join("blank");
        std::fs::write(&blank, " \n").unwrap();
        let err =
            from_env_with("S", "cfg", env(&[("S_FILE", blank.to_str().unwrap())])).unwrap_err();
        assert!(matches!(err, SecretError::Empty { .. }), "{err}");
        let err = from_env_with("S", "cfg", env(&[("S_FILE", "/nonexistent/secret")])).unwrap_err();
        assert!(err.to_string().contains("named by S_FILE"), "{err}");
    }
}
