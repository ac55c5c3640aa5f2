//! Restricted APIs (`--http-restricted-api`, `--grpc-restricted-protocol`): Triton's API groups
//! (`src/restricted_features.h` in `triton-inference-server/server`), plus tritium's own `admin`
//! group (the `tritium.admin.Admin` service), each guarded by one header that a request must
//! carry with one value. This module holds the groups, the flag syntax with Triton's parse
//! errors, and the lookup; the frontends say which of their routes belongs to which group and
//! how a refusal looks on their wire.

use std::fmt;

/// An API group that can be restricted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApiGroup {
    /// Server and model liveness and readiness (`grpc.health.v1` too).
    Health,
    /// Server and model metadata.
    Metadata,
    /// Inference (`infer`, `generate`, `ModelInfer`, `ModelStreamInfer`).
    Inference,
    /// The shared-memory extensions.
    SharedMemory,
    /// Model configurations.
    ModelConfig,
    /// The model repository extension (index, load, unload).
    ModelRepository,
    /// Statistics.
    Statistics,
    /// The trace extension.
    Trace,
    /// The logging extension.
    Logging,
    /// tritium's own admin API (`tritium stubs`, `tritium restart`); not one of Triton's.
    Admin,
}

impl ApiGroup {
    /// Every group, Triton's in Triton's order, then tritium's.
    pub const ALL: [ApiGroup; 10] = [
        ApiGroup::Health,
        ApiGroup::Metadata,
        ApiGroup::Inference,
        ApiGroup::SharedMemory,
        ApiGroup::ModelConfig,
        ApiGroup::ModelRepository,
        ApiGroup::Statistics,
        ApiGroup::Trace,
        ApiGroup::Logging,
        ApiGroup::Admin,
    ];

    /// The group's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ApiGroup::Health => "health",
            ApiGroup::Metadata => "metadata",
            ApiGroup::Inference => "inference",
            ApiGroup::SharedMemory => "shared-memory",
            ApiGroup::ModelConfig => "model-config",
            ApiGroup::ModelRepository => "model-repository",
            ApiGroup::Statistics => "statistics",
            ApiGroup::Trace => "trace",
            ApiGroup::Logging => "logging",
            ApiGroup::Admin => "admin",
        }
    }

    /// The group named `name` (exact, as Triton compares).
    pub fn from_name(name: &str) -> Option<ApiGroup> {
        ApiGroup::ALL.into_iter().find(|g| g.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ApiGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The header a restricted group's requests must carry, and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restriction {
    /// The header's name, lowercase (HTTP and gRPC header names are case-insensitive); for
    /// gRPC it already has Triton's `triton-grpc-protocol-` prefix.
    pub header: String,
    /// The value the header must have, compared exactly.
    pub value: String,
}

/// Which groups are restricted, and how. Empty (nothing restricted) by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restrictions {
    groups: [Option<Restriction>; ApiGroup::ALL.len()],
}

/// A flag value [`Restrictions::add`] refused, with Triton's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RestrictionError(pub String);

/// The prefix Triton puts before the key of `--grpc-restricted-protocol`
/// (`kRestrictedProtocolHeaderTemplate`).
pub const GRPC_HEADER_PREFIX: &str = "triton-grpc-protocol-";

impl Restrictions {
    /// Adds one flag value, `<groups>:<key>=<value>` with `<groups>` comma-separated, as
    /// Triton's `ParseRestrictedFeatureOption`: `option` is the flag's name without dashes,
    /// `prefix` goes before the key (`triton-grpc-protocol-` for gRPC), `kind` names a group in
    /// errors (`api` or `protocol`).
    pub fn add(&mut self, arg: &str, option: &str, prefix: &str, kind: &str) -> Result<(), RestrictionError> {
        let format =
            || RestrictionError(format!("--{option} option format is '<config name>:<setting>=<value>'. Got {arg}"));
        let (groups, setting) = arg.split_once(':').ok_or_else(format)?;
        let (key, value) = setting.split_once('=').ok_or_else(format)?;
        if groups.is_empty() || key.is_empty() || value.is_empty() {
            return Err(format());
        }
        for name in groups.split(',') {
            let group = ApiGroup::from_name(name)
                .ok_or_else(|| RestrictionError(format!("unknown restricted {kind} '{name}'")))?;
            let slot = &mut self.groups[group.index()];
            if slot.is_some() {
                return Err(RestrictionError(format!(
                    "restricted {kind} '{name}' can not be specified in multiple config groups"
                )));
            }
            *slot =
                Some(Restriction { header: format!("{prefix}{key}").to_ascii_lowercase(), value: value.to_string() });
        }
        Ok(())
    }

    /// The restriction on `group`, if it is restricted.
    pub fn get(&self, group: ApiGroup) -> Option<&Restriction> {
        self.groups[group.index()].as_ref()
    }

    /// Whether no group is restricted.
    pub fn is_empty(&self) -> bool {
        self.groups.iter().all(Option::is_none)
    }

    /// Checks a request of `group` whose header `restriction.header` has `found` (None when
    /// absent): `Err` with the header's name when it must be refused.
    pub fn check<'a>(&'a self, group: ApiGroup, found: Option<&[u8]>) -> Result<(), &'a str> {
        match self.get(group) {
            Some(r) if found != Some(r.value.as_bytes()) => Err(&r.header),
            _ => Ok(()),
        }
    }

    /// [`check`](Self::check) for a request whose headers `header` looks up by (lowercase)
    /// name; it is asked only when `group` is restricted. Every HTTP frontend checks this way.
    pub fn check_headers<'a, 'h>(
        &'a self,
        group: ApiGroup,
        header: impl FnOnce(&str) -> Option<&'h [u8]>,
    ) -> Result<(), &'a str> {
        let found = self.get(group).and_then(|r| header(&r.header));
        self.check(group, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str], prefix: &str) -> Result<Restrictions, RestrictionError> {
        let mut r = Restrictions::default();
        for a in args {
            r.add(a, "grpc-restricted-protocol", prefix, "protocol")?;
        }
        Ok(r)
    }

    #[test]
    fn groups_keys_and_values() {
        let r = parse(&["inference,health:Admin-Key=s3:cr=t", "admin:k=v"], GRPC_HEADER_PREFIX).expect("parsed");
        let inference = r.get(ApiGroup::Inference).expect("restricted");
        assert_eq!(inference.header, "triton-grpc-protocol-admin-key");
        assert_eq!(inference.value, "s3:cr=t");
        assert_eq!(r.get(ApiGroup::Health), Some(inference));
        assert_eq!(r.get(ApiGroup::Admin).map(|a| a.header.as_str()), Some("triton-grpc-protocol-k"));
        assert_eq!(r.get(ApiGroup::Metadata), None);
        assert_eq!(r.check(ApiGroup::Inference, None), Err("triton-grpc-protocol-admin-key"));
        assert_eq!(r.check(ApiGroup::Inference, Some(b"wrong")), Err("triton-grpc-protocol-admin-key"));
        assert_eq!(r.check(ApiGroup::Inference, Some(b"s3:cr=t")), Ok(()));
        assert_eq!(r.check(ApiGroup::Metadata, None), Ok(()));
        let headers = |name: &str| (name == "triton-grpc-protocol-admin-key").then_some(&b"s3:cr=t"[..]);
        assert_eq!(r.check_headers(ApiGroup::Inference, headers), Ok(()));
        assert_eq!(r.check_headers(ApiGroup::Inference, |_| None), Err("triton-grpc-protocol-admin-key"));
        assert_eq!(r.check_headers(ApiGroup::Metadata, |_| unreachable!("not restricted")), Ok(()));
        assert!(Restrictions::default().is_empty() && !r.is_empty());
    }

    #[test]
    fn tritons_parse_errors() {
        let err = |args: &[&str]| parse(args, "").expect_err("refused").0;
        assert_eq!(
            err(&["inference"]),
            "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got inference"
        );
        assert_eq!(
            err(&["inference:key"]),
            "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got inference:key"
        );
        assert_eq!(
            err(&[":k=v"]),
            "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got :k=v"
        );
        assert_eq!(
            err(&["inference:k="]),
            "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got inference:k="
        );
        assert_eq!(err(&["inferense:k=v"]), "unknown restricted protocol 'inferense'");
        assert_eq!(
            err(&["inference:k=v", "health,inference:j=w"]),
            "restricted protocol 'inference' can not be specified in multiple config groups"
        );
        assert_eq!(
            err(&["inference,inference:k=v"]),
            "restricted protocol 'inference' can not be specified in multiple config groups"
        );
    }

    #[test]
    fn names_round_trip() {
        for g in ApiGroup::ALL {
            assert_eq!(ApiGroup::from_name(g.name()), Some(g));
        }
        assert_eq!(ApiGroup::from_name("Health"), None);
    }
}
