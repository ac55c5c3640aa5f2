//! `tritium reload MODEL`'s answer: how the reload went, with each version's state from the
//! repository index afterwards.

use std::time::Duration;

use anyhow::{anyhow, Result};
use tritium_proto::inference::repository_index_response::ModelIndex;

/// The report of a reload of `model` that took `took`: the versions' states as the index lists
/// them after it, and `error` (the server's answer) when it failed, which the report then is.
/// A reload the server accepted whose versions are not all ready is a failure too.
pub(crate) fn report(
    model: &str,
    took: Duration,
    versions: &[ModelIndex],
    error: Option<anyhow::Error>,
) -> Result<String> {
    let states: Vec<String> = versions
        .iter()
        .map(|v| {
            let version = if v.version.is_empty() { "-" } else { v.version.as_str() };
            match v.reason.lines().next().filter(|r| !r.is_empty()) {
                Some(reason) => format!("  version {version}: {} ({reason})", v.state),
                None => format!("  version {version}: {}", v.state),
            }
        })
        .collect();
    if let Some(error) = error {
        let serving = versions.iter().filter(|v| v.state == "READY").count();
        let after = if serving > 0 {
            format!("\nthe previous version keeps serving:\n{}", states.join("\n"))
        } else {
            String::new()
        };
        return Err(anyhow!("{error:#}{after}"));
    }
    let ready = !versions.is_empty() && versions.iter().all(|v| v.state == "READY");
    if !ready {
        return Err(anyhow!("reload of {model} finished, but not every version is ready:\n{}", states.join("\n")));
    }
    Ok(format!("reloaded {model} in {:.2} s\n{}\n", took.as_secs_f64(), states.join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: &str, state: &str, reason: &str) -> ModelIndex {
        ModelIndex {
            name: "m".into(),
            version: version.into(),
            state: state.into(),
            reason: reason.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_reload_reports_each_version_or_the_servers_error() {
        let ok = report("m", Duration::from_millis(420), &[entry("1", "READY", "")], None).expect("ok");
        assert_eq!(ok, "reloaded m in 0.42 s\n  version 1: READY\n");
        let failed = report(
            "m",
            Duration::from_millis(10),
            &[entry("1", "READY", "")],
            Some(anyhow!("reload of m failed: load failed for model 'm': boom")),
        )
        .expect_err("failed");
        assert_eq!(
            format!("{failed:#}"),
            "reload of m failed: load failed for model 'm': boom\nthe previous version keeps serving:\n  version 1: READY"
        );
        let down = report("m", Duration::ZERO, &[entry("1", "UNAVAILABLE", "crashed\nmore")], None).expect_err("down");
        assert!(format!("{down:#}").ends_with("version 1: UNAVAILABLE (crashed)"), "{down:#}");
    }
}
