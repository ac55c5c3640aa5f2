//! Version directories selected by a version policy.

use std::{fs, path::Path};

use tritium_config::proto::{
    model_version_policy::{All, Latest, PolicyChoice, Specific},
    ModelVersionPolicy,
};
use tritium_config::{model_versions, ConfigError};

/// A model directory with versions 1, 2, 3 and 10, plus things that are not versions.
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["1", "2", "3", "10", "01", "abc", "-4", "7b"] {
        fs::create_dir(dir.path().join(name)).expect("mkdir");
    }
    fs::write(dir.path().join("5"), b"a file, not a version").expect("write");
    fs::write(dir.path().join("config.pbtxt"), b"").expect("write");
    dir
}

fn policy(choice: Option<PolicyChoice>) -> ModelVersionPolicy {
    ModelVersionPolicy { policy_choice: choice }
}

fn latest(n: u32) -> ModelVersionPolicy {
    policy(Some(PolicyChoice::Latest(Latest { num_versions: n })))
}

fn specific(versions: &[i64]) -> ModelVersionPolicy {
    policy(Some(PolicyChoice::Specific(Specific { versions: versions.to_vec() })))
}

#[test]
fn policies_select_versions() {
    let dir = model_dir();
    for (policy, expected) in [
        (latest(1), vec![10]),
        (latest(2), vec![3, 10]),
        (latest(100), vec![1, 2, 3, 10]),
        (policy(Some(PolicyChoice::All(All {}))), vec![1, 2, 3, 10]),
        (policy(None), vec![1, 2, 3, 10]),
        (specific(&[3, 1]), vec![1, 3]),
        (specific(&[10, 10]), vec![10]),
    ] {
        let got = model_versions(dir.path(), &policy).unwrap_or_else(|e| panic!("{policy:?}: {e}"));
        assert_eq!(got, expected, "{policy:?}");
    }
}

#[cfg(unix)]
#[test]
fn a_symlinked_version_directory_counts() {
    let dir = model_dir();
    std::os::unix::fs::symlink(dir.path().join("10"), dir.path().join("11")).expect("symlink");
    assert_eq!(model_versions(dir.path(), &latest(1)).expect("valid"), [11]);
}

#[test]
fn missing_specific_version_is_named() {
    let dir = model_dir();
    let name = dir.path().file_name().and_then(|n| n.to_str()).expect("utf-8 name").to_owned();
    for (versions, missing) in [(&[1, 4][..], 4), (&[5][..], 5), (&[1][..], -1)] {
        let result = model_versions(dir.path(), &specific(versions));
        if missing < 0 {
            assert_eq!(result.expect("present"), [1]);
            continue;
        }
        let err = result.expect_err("missing version");
        assert!(matches!(err, ConfigError::Version(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "version {missing} is specified for model '{name}', but the version directory \
                 is not present"
            )
        );
    }
}

#[test]
fn no_version_at_all_is_an_error() {
    let empty = tempfile::tempdir().expect("tempdir");
    let dir = model_dir();
    for (path, policy) in [(empty.path(), latest(1)), (dir.path(), latest(0)), (dir.path(), specific(&[]))] {
        let err = model_versions(path, &policy).expect_err("no versions");
        assert!(
            err.to_string().starts_with("at least one version must be available under the version policy of model"),
            "{err}"
        );
    }
}

#[test]
fn unreadable_model_directory_is_an_io_error() {
    let err = model_versions(Path::new("/nonexistent/model"), &latest(1)).expect_err("missing");
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    assert!(err.to_string().starts_with("/nonexistent/model: "), "{err}");
}
