//! `tritium.admin.Admin`, the API the `tritium` CLI talks to: the stubs of the loaded models
//! ([`Server::instances`]), restarts ([`Server::restart`]) and live Python stacks
//! ([`Server::stacks`]), with the rule that decides who may restart or read stacks ([`check_peer`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::info;
use tritium_proto::admin::admin_server::Admin;
use tritium_proto::admin::{self as proto, stub_exit};
use tritium_proto::admin::{
    InstanceStacks, RestartRequest, RestartResponse, StacksRequest, StacksResponse, StubInfo, StubsRequest,
    StubsResponse,
};
pub use tritium_server::admin_access::{check_peer, Refusal};
use tritium_server::{admin_access, InferError, InstanceInfo, Server, StubExit};

use crate::convert::to_status;

/// `tritium.admin.Admin` over a [`Server`].
///
/// `Stubs` only reads and is open to every peer, like the standard RPCs (statistics, index).
/// `Restart` interrupts service, so it is allowed only from loopback peers (the operator on the
/// server's host) or from peers that send the server's admin token (see [`check_peer`]).
#[derive(Clone)]
pub struct AdminService {
    server: Server,
    token: Option<Arc<str>>,
}

impl AdminService {
    /// An admin service over `server`; `token` lets non-loopback peers restart stubs when they
    /// send it as `authorization: Bearer <token>`. An empty token counts as none.
    pub fn new(server: Server, token: Option<String>) -> Self {
        Self { server, token: token.filter(|t| !t.is_empty()).map(Arc::from) }
    }

    fn authorize(&self, what: &str, peer: Option<SocketAddr>, metadata: &MetadataMap) -> Result<(), Status> {
        let bearer = metadata.get("authorization").map(|v| v.as_bytes());
        admin_access::authorize(&self.server, what, peer, bearer, self.token.as_deref())
            .map_err(Status::permission_denied)
    }
}

/// How a stub process ended, and when, on the wire.
pub fn exit_to_proto(exit: &StubExit, when: SystemTime) -> proto::StubExit {
    let status = match exit {
        StubExit::Code(code) => stub_exit::Status::Code(*code),
        StubExit::Signal { signal, name } => {
            stub_exit::Status::Signal(proto::Signal { number: *signal, name: (*name).to_string() })
        }
        StubExit::Other(what) => stub_exit::Status::Other(what.clone()),
    };
    let unix_ms = when.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    proto::StubExit { status: Some(status), unix_ms }
}

/// One instance on the wire.
pub fn stub_to_proto(i: InstanceInfo) -> StubInfo {
    StubInfo {
        model: i.model,
        version: i.version,
        instance: i.instance,
        pid: i.pid.unwrap_or(0),
        state: i.state.as_str().to_string(),
        uptime_secs: i.uptime.map_or(0.0, |d| d.as_secs_f64()),
        restarts: i.restarts,
        last_exit: i.last_exit.map(|(exit, when)| exit_to_proto(&exit, when)),
        reason: i.reason,
        rss_bytes: i.rss_bytes,
        shm_bytes: i.shm_bytes,
        inflight: i.inflight,
        executions: i.executions,
        impossible_transitions: i.impossible_transitions,
        pss_bytes: i.pss_bytes,
        uss_bytes: i.uss_bytes,
        rss_growth_bytes: i.rss_growth_bytes,
        requests_taken: i.requests_taken,
        recycled_rss: recycled(&i.recycled, "rss"),
        recycled_requests: recycled(&i.recycled, "requests"),
    }
}

/// The count of stubs recycled for `reason`.
fn recycled(counts: &[(&'static str, u64)], reason: &str) -> u64 {
    counts.iter().find(|(r, _)| *r == reason).map_or(0, |(_, n)| *n)
}

fn unknown_model(model: &str) -> Status {
    to_status(InferError::not_found(format!("Request for unknown model: '{model}' is not found")))
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn stubs(&self, req: Request<StubsRequest>) -> Result<Response<StubsResponse>, Status> {
        let model = req.into_inner().model;
        let filter = (!model.is_empty()).then_some(model.as_str());
        let mut stubs: Vec<StubInfo> = self.server.instances(filter).into_iter().map(stub_to_proto).collect();
        // A model in the repository that is not loaded has no stubs; a name nobody knows is an error.
        if stubs.is_empty() && filter.is_some() && !self.server.repository_index(false).iter().any(|e| e.name == model)
        {
            return Err(unknown_model(&model));
        }
        stubs.sort_by(|a, b| (&a.model, a.version, &a.instance).cmp(&(&b.model, b.version, &b.instance)));
        Ok(Response::new(StubsResponse { stubs }))
    }

    async fn restart(&self, req: Request<RestartRequest>) -> Result<Response<RestartResponse>, Status> {
        let peer = req.remote_addr();
        self.authorize("Restart", peer, req.metadata())?;
        let RestartRequest { model, instance } = req.into_inner();
        if model.is_empty() {
            return Err(Status::invalid_argument("Restart needs a model name"));
        }
        let instance = (!instance.is_empty()).then_some(instance.as_str());
        let peer = peer.map_or_else(|| "unknown".to_string(), |p| p.to_string());
        info!(model = ?model, instance = ?instance, %peer, "restart requested");
        self.server.restart(&model, instance).await.map_err(to_status)?;
        Ok(Response::new(RestartResponse {}))
    }

    async fn stacks(&self, req: Request<StacksRequest>) -> Result<Response<StacksResponse>, Status> {
        self.authorize("Stacks", req.remote_addr(), req.metadata())?;
        let StacksRequest { model, instance } = req.into_inner();
        if model.is_empty() {
            return Err(Status::invalid_argument("Stacks needs a model name"));
        }
        let instance = (!instance.is_empty()).then_some(instance.as_str());
        let stacks = self.server.stacks(&model, instance).await.map_err(to_status)?;
        let stacks = stacks
            .into_iter()
            .map(|s| {
                let (stacks, error) = match s.stacks {
                    Ok(text) => (text, String::new()),
                    Err(why) => (String::new(), why),
                };
                InstanceStacks {
                    model: s.model,
                    version: s.version,
                    instance: s.instance,
                    pid: s.pid.unwrap_or(0),
                    stacks,
                    error,
                }
            })
            .collect();
        Ok(Response::new(StacksResponse { stacks }))
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;

    const LOOPBACK: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::LOCALHOST));

    #[test]
    fn exits_round_trip_through_the_proto() {
        use prost::Message;

        let when = UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let cases = [
            (StubExit::Code(3), stub_exit::Status::Code(3)),
            (
                StubExit::Signal { signal: 9, name: "SIGKILL" },
                stub_exit::Status::Signal(proto::Signal { number: 9, name: "SIGKILL".into() }),
            ),
            (StubExit::Other("cannot start".into()), stub_exit::Status::Other("cannot start".into())),
        ];
        for (exit, want) in cases {
            let msg = exit_to_proto(&exit, when);
            let decoded = proto::StubExit::decode(msg.encode_to_vec().as_slice()).expect("decode");
            assert_eq!(decoded, proto::StubExit { status: Some(want), unix_ms: 1_700_000_000_123 }, "{exit}");
        }
        // Before the epoch is 0, not a panic.
        assert_eq!(exit_to_proto(&StubExit::Code(0), UNIX_EPOCH - std::time::Duration::from_secs(1)).unix_ms, 0);
    }

    #[test]
    fn an_instance_on_the_wire_has_every_field() {
        use prost::Message;

        let when = UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        let info = InstanceInfo {
            model: "m".into(),
            version: 2,
            instance: "m_0_0".into(),
            pid: Some(1234),
            state: tritium_server::InstanceState::Ready,
            uptime: Some(std::time::Duration::from_millis(1500)),
            restarts: 3,
            last_exit: Some((StubExit::Code(1), when)),
            reason: "exited with 1".into(),
            rss_bytes: 10,
            shm_bytes: 20,
            inflight: 1,
            executions: 7,
            transitions: vec![("ready".into(), 4)],
            impossible_transitions: 5,
            pss_bytes: 8,
            uss_bytes: 6,
            rss_growth_bytes: -2,
            requests_taken: 9,
            recycled: vec![("rss", 2), ("requests", 1)],
        };
        let want = StubInfo {
            model: "m".into(),
            version: 2,
            instance: "m_0_0".into(),
            pid: 1234,
            state: "ready".into(),
            uptime_secs: 1.5,
            restarts: 3,
            reason: "exited with 1".into(),
            rss_bytes: 10,
            shm_bytes: 20,
            inflight: 1,
            executions: 7,
            last_exit: Some(proto::StubExit { status: Some(stub_exit::Status::Code(1)), unix_ms: 1_700_000_000_123 }),
            impossible_transitions: 5,
            pss_bytes: 8,
            uss_bytes: 6,
            rss_growth_bytes: -2,
            requests_taken: 9,
            recycled_rss: 2,
            recycled_requests: 1,
        };
        let got = stub_to_proto(info.clone());
        assert_eq!(got, want);
        assert_eq!(StubInfo::decode(got.encode_to_vec().as_slice()).expect("decode"), want);
        // No process: pid and uptime are 0, and no impossible transition is 0 on the wire.
        let idle =
            stub_to_proto(InstanceInfo { pid: None, uptime: None, last_exit: None, impossible_transitions: 0, ..info });
        assert_eq!((idle.pid, idle.uptime_secs, idle.last_exit, idle.impossible_transitions), (0, 0.0, None, 0));
    }

    const REMOTE: Option<IpAddr> = Some(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));

    #[test]
    fn loopback_is_always_allowed() {
        for ip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()),
        ] {
            assert_eq!(check_peer(Some(ip), None, None), Ok(()), "{ip}");
            assert_eq!(check_peer(Some(ip), None, Some("s3cret")), Ok(()), "{ip}");
            assert_eq!(check_peer(Some(ip), Some(b"Bearer wrong"), Some("s3cret")), Ok(()), "{ip}");
        }
    }

    #[test]
    fn remote_peers_need_the_token() {
        let v6 = Some(IpAddr::V6("2001:db8::1".parse().expect("ipv6")));
        let mapped = Some(IpAddr::V6(Ipv4Addr::new(192, 168, 0, 7).to_ipv6_mapped()));
        for peer in [REMOTE, v6, mapped, None] {
            assert_eq!(check_peer(peer, None, None), Err(Refusal::RemoteWithoutToken), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Bearer s3cret"), None), Err(Refusal::RemoteWithoutToken), "{peer:?}");
            assert_eq!(check_peer(peer, None, Some("s3cret")), Err(Refusal::TokenMissing), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Basic s3cret"), Some("s3cret")), Err(Refusal::TokenMissing), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Bearer"), Some("s3cret")), Err(Refusal::TokenMissing), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Bearer s3cre"), Some("s3cret")), Err(Refusal::TokenWrong), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Bearer s3cret!"), Some("s3cret")), Err(Refusal::TokenWrong), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"Bearer s3cret"), Some("s3cret")), Ok(()), "{peer:?}");
            assert_eq!(check_peer(peer, Some(b"bearer  s3cret "), Some("s3cret")), Ok(()), "{peer:?}");
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let m = Refusal::RemoteWithoutToken.message("Restart", "10.1.2.3:5000");
        assert!(m.contains("10.1.2.3:5000") && m.contains("--admin-token"), "{m}");
        let m = Refusal::TokenMissing.message("Restart", "10.1.2.3:5000");
        assert!(m.contains("authorization: Bearer"), "{m}");
        assert!(Refusal::TokenWrong.message("Restart", "p").contains("not the server's"));
        assert!(!m.contains('\n'));
    }

    #[test]
    fn restart_from_a_remote_peer_is_denied_before_anything_happens() {
        use tonic::transport::server::TcpConnectInfo;
        let server = Server::new(tritium_server::ServerOptions {
            repository: std::env::temp_dir().join("tritium-admin-test-nonexistent"),
            stub: tritium_host::StubCommand {
                python: "python3".into(),
                python_path: ".".into(),
                env: Vec::new(),
                spin: 0,
            },
            instance_settings: Default::default(),
            auto_complete: false,
            strict_readiness: true,
            explicit_control: true,
            backend_directory: std::path::PathBuf::new(),
            envs: tritium_server::EnvOptions::default(),
            config_name: None,
            gpus: Vec::new(),
            paths: Default::default(),
            limits: Default::default(),
            rate_limiter: None,
            metrics: tritium_server::MetricsOptions::default(),
            max_queue_size: 0,
            server_id: "tritium".into(),
            load_threads: 4,
            load_retries: 0,
        });
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let call = |token: Option<&str>, peer: Option<IpAddr>, sent: Option<&str>| {
            let service = AdminService::new(server.clone(), token.map(String::from));
            let mut req = Request::new(RestartRequest { model: "nope".into(), instance: String::new() });
            req.extensions_mut()
                .insert(TcpConnectInfo { local_addr: None, remote_addr: peer.map(|ip| SocketAddr::new(ip, 40000)) });
            if let Some(sent) = sent {
                req.metadata_mut().insert("authorization", sent.parse().expect("metadata value"));
            }
            runtime.block_on(service.restart(req)).map(|_| ()).map_err(|s| (s.code(), s.message().to_string()))
        };
        let (code, message) = call(None, REMOTE, None).expect_err("remote without a token");
        assert_eq!(code, tonic::Code::PermissionDenied);
        assert!(message.contains("10.1.2.3:40000"), "{message}");
        let (code, _) = call(Some("s3cret"), REMOTE, Some("Bearer wrong")).expect_err("wrong token");
        assert_eq!(code, tonic::Code::PermissionDenied);
        // Allowed callers reach the server, which does not know the model.
        let (code, _) = call(Some("s3cret"), REMOTE, Some("Bearer s3cret")).expect_err("unknown model");
        assert_eq!(code, tonic::Code::NotFound);
        let (code, _) = call(None, LOOPBACK, None).expect_err("unknown model");
        assert_eq!(code, tonic::Code::NotFound);
    }
}
