//! Who may use the admin calls (restarts, live stacks) on either frontend: loopback peers that
//! are not a model's own processes, and any peer that sends the server's admin token as
//! `authorization: Bearer <token>` ([`authorize`], [`check_peer`]).

use std::net::{IpAddr, SocketAddr};

use tracing::warn;

use crate::Server;

/// Whether the caller at `peer`, who sent `authorization` (the header's value), may use the
/// admin call `what` on a server whose admin token is `token`; the refusal's text otherwise
/// (logged here). Loopback trust is for the operator on the server's host: a model's stub, or a
/// process it started, is on loopback too, and gets what a remote peer gets.
pub fn authorize(
    server: &Server,
    what: &str,
    peer: Option<SocketAddr>,
    authorization: Option<&[u8]>,
    token: Option<&str>,
) -> Result<(), String> {
    let token = token.filter(|t| !t.is_empty());
    let mut outcome = check_peer(peer.map(|a| a.ip()), authorization, token);
    if let (Ok(()), Some(addr)) = (outcome, peer) {
        let with_token = token.is_some() && check_peer(None, authorization, token).is_ok();
        if !with_token && server.is_model_process(addr) {
            outcome = Err(if token.is_some() { Refusal::FromModel } else { Refusal::FromModelWithoutToken });
        }
    }
    outcome.map_err(|refusal| {
        let peer = peer.map_or_else(|| "an unknown address".to_string(), |p| p.to_string());
        warn!(%peer, "refused {what}: {refusal:?}");
        refusal.message(what, &peer)
    })
}

/// Why [`check_peer`] refused a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The peer is not on loopback and the server has no admin token.
    RemoteWithoutToken,
    /// The server has an admin token and the peer sent none.
    TokenMissing,
    /// The peer sent a token that is not the server's.
    TokenWrong,
    /// The peer is a model's process (a stub or its child) and the server has no admin token.
    FromModelWithoutToken,
    /// The peer is a model's process and sent no valid admin token.
    FromModel,
}

impl Refusal {
    /// What the refused caller is told: what happened and what to do.
    pub fn message(self, what: &str, peer: &str) -> String {
        match self {
            Refusal::RemoteWithoutToken => format!(
                "{what} is allowed only from the server's own host (loopback), and this call came from {peer}: \
                 run the command on the server's host, or start the server with --admin-token \
                 (TRITIUM_ADMIN_TOKEN) and pass the same token with --admin-token"
            ),
            Refusal::TokenMissing => format!(
                "{what} from {peer} needs the server's admin token: pass it with --admin-token \
                 (TRITIUM_ADMIN_TOKEN), sent as `authorization: Bearer <token>`"
            ),
            Refusal::FromModelWithoutToken => format!(
                "{what} is not allowed from a model's process ({peer} belongs to one of the server's stubs or a process \
                 it started): loopback trust is for the operator; start the server with --admin-token \
                 (TRITIUM_ADMIN_TOKEN) to allow it with that token"
            ),
            Refusal::FromModel => format!(
                "{what} from a model's process ({peer}) needs the server's admin token, sent as `authorization: \
                 Bearer <token>`"
            ),
            Refusal::TokenWrong => format!(
                "{what} from {peer} sent an admin token that is not the server's: pass the token the \
                 server was started with (--admin-token, TRITIUM_ADMIN_TOKEN)"
            ),
        }
    }
}

/// Whether a caller may use a mutating admin call: always from loopback (127.0.0.0/8, `::1`,
/// and IPv4-mapped loopback), otherwise only with `authorization: Bearer <token>` matching the
/// server's `token`. An unknown peer address counts as remote.
pub fn check_peer(peer: Option<IpAddr>, authorization: Option<&[u8]>, token: Option<&str>) -> Result<(), Refusal> {
    if peer.is_some_and(|ip| ip.to_canonical().is_loopback()) {
        return Ok(());
    }
    let Some(token) = token else {
        return Err(Refusal::RemoteWithoutToken);
    };
    let Some(sent) = authorization.and_then(bearer_token) else {
        return Err(Refusal::TokenMissing);
    };
    if constant_time_eq(sent, token.as_bytes()) {
        Ok(())
    } else {
        Err(Refusal::TokenWrong)
    }
}

/// The token of an `authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| rest.trim_ascii())
}

/// Compares without stopping at the first difference, so timing does not reveal a prefix of the
/// token (only its length).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
