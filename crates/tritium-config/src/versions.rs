//! Which version directories of a model a version policy serves.

use std::{collections::BTreeSet, path::Path};

use crate::{
    proto::{model_version_policy::PolicyChoice, ModelVersionPolicy},
    ConfigError,
};

/// The versions of the model in `model_dir` that `policy` serves, in ascending order.
///
/// Versions are the subdirectories named by a non-negative decimal number without leading
/// zeros (Triton ignores `01` and non-numeric names with a warning; so do we, silently).
/// `latest { num_versions: n }` takes the n highest, `all` (or a policy with no choice, as in
/// Triton) every one, `specific` exactly the listed ones. Unlike Triton, which logs a missing
/// specific version and loads the rest, a listed version without a directory is an error. No
/// version at all is an error, as in Triton.
pub fn model_versions(model_dir: &Path, policy: &ModelVersionPolicy) -> Result<Vec<i64>, ConfigError> {
    let io_error = |source| ConfigError::Io { path: model_dir.to_path_buf(), source };
    let mut present = BTreeSet::new();
    for entry in std::fs::read_dir(model_dir).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let Some(version) = entry.file_name().to_str().and_then(parse_version) else {
            continue;
        };
        // `Path::is_dir` follows symlinks, as Triton's directory listing does.
        if entry.path().is_dir() {
            present.insert(version);
        }
    }

    let model = model_dir
        .file_name()
        .map_or_else(|| model_dir.display().to_string(), |name| name.to_string_lossy().into_owned());
    let versions: Vec<i64> = match &policy.policy_choice {
        Some(PolicyChoice::Latest(latest)) => {
            let n = usize::try_from(latest.num_versions).unwrap_or(usize::MAX);
            let mut newest: Vec<i64> = present.iter().rev().take(n).copied().collect();
            newest.reverse();
            newest
        }
        Some(PolicyChoice::Specific(specific)) => {
            let wanted: BTreeSet<i64> = specific.versions.iter().copied().collect();
            if let Some(missing) = wanted.iter().find(|v| !present.contains(v)) {
                return Err(ConfigError::Version(format!(
                    "version {missing} is specified for model '{model}', but the version \
                     directory is not present"
                )));
            }
            wanted.into_iter().collect()
        }
        Some(PolicyChoice::All(_)) | None => present.into_iter().collect(),
    };
    if versions.is_empty() {
        return Err(ConfigError::Version(format!(
            "at least one version must be available under the version policy of model '{model}'"
        )));
    }
    Ok(versions)
}

/// A version directory name: decimal digits, no leading zero (but "0" itself), fits in i64.
fn parse_version(name: &str) -> Option<i64> {
    let digits = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
    if !digits || (name.len() > 1 && name.starts_with('0')) {
        return None;
    }
    name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn version_names() {
        for (name, expected) in [
            ("1", Some(1)),
            ("0", Some(0)),
            ("42", Some(42)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("01", None),
            ("-1", None),
            ("+1", None),
            ("1a", None),
            ("", None),
            ("v1", None),
            (" 1", None),
        ] {
            assert_eq!(parse_version(name), expected, "{name:?}");
        }
    }
}
