//! Who is calling: whether a connection on loopback comes from a model (one of the server's
//! stubs, or a process a model started) rather than from the operator on the server's host.

use std::collections::HashSet;
use std::net::SocketAddr;

use crate::Server;

impl Server {
    /// Whether the local TCP peer `peer` is a process of a model: a stub of this server or one
    /// of its descendants. Reads `/proc` (the connection's socket, then its process's parents),
    /// so it is meant for rare calls such as a restart, not for every request.
    pub fn is_model_process(&self, peer: SocketAddr) -> bool {
        let stubs: HashSet<u32> = self.instances(None).iter().filter_map(|i| i.pid).collect();
        if stubs.is_empty() {
            return false;
        }
        tritium_host::peer::socket_owner(peer).is_some_and(|pid| tritium_host::peer::descends_from(pid, &stubs))
    }
}
