//! Binding the listeners: one address, one socket, or one per core
//! sharing the address (`SO_REUSEPORT`) under this process's claim.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub address: SocketAddr,
    /// Why (in use, not permitted, no such address).
    #[source]
    pub source: std::io::Error,
}

/// Binds a listener, with a clear error. What the process logged until
/// now is written out first ([`crate::log_sink::flush`]): once a client
/// can connect, the start-up's warnings are on stderr.
pub async fn bind(address: SocketAddr) -> Result<TcpListener, BindError> {
    crate::log_sink::flush();
    TcpListener::bind(address).await.map_err(|source| BindError { address, source })
}

/// Listeners sharing one address (`SO_REUSEPORT`), and the claim that
/// keeps another process from joining them: see [`bind_shared`].
pub struct SharedListeners {
    /// One per core; the kernel spreads new connections over them.
    pub listeners: Vec<TcpListener>,
    /// Keep it while the listeners serve: the address is this process's.
    pub claim: Claim,
}

/// A process's claim on an address it listens on with `SO_REUSEPORT`
/// ([`bind_shared`]); released when dropped.
#[derive(Debug)]
pub struct Claim {
    /// Held, never read: the claim lasts as long as the socket.
    _socket: Option<std::os::unix::net::UnixDatagram>,
}

impl SharedListeners {
    /// One listener bound without `SO_REUSEPORT`: the kernel keeps its
    /// address for it alone, no claim needed.
    pub fn one(listener: TcpListener) -> Self {
        Self { listeners: vec![listener], claim: Claim { _socket: None } }
    }

    /// The address they share.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self.listeners.first() {
            Some(listener) => listener.local_addr(),
            None => Err(std::io::ErrorKind::NotConnected.into()),
        }
    }
}

/// Binds `count` listeners on one address with `SO_REUSEPORT`, so that the
/// kernel spreads new connections over them (one per core: see
/// `crate::app::cores`). Port 0 is chosen once, by the first.
///
/// `SO_REUSEPORT` would also let a second process of the same user join
/// the group silently, and share a payment gateway's traffic with its own
/// memory store. So the port is claimed as soon as it is known, by an
/// abstract Unix socket named after it (its scope is the network
/// namespace's, as the port's is, and the kernel frees it when the
/// process ends, however it ends): a second idemgate on the port, however
/// it spells the address, gets "address in use", as it would from a
/// plain listener.
pub async fn bind_shared(address: SocketAddr, count: usize) -> Result<SharedListeners, BindError> {
    crate::log_sink::flush();
    let first = reuse_port(address).map_err(|source| BindError { address, source })?;
    let at = first.local_addr().map_err(|source| BindError { address, source })?;
    let claim = claim(at).map_err(|source| BindError { address: at, source })?;
    let mut listeners = vec![first];
    for _ in 1..count.max(1) {
        listeners.push(reuse_port(at).map_err(|source| BindError { address: at, source })?);
    }
    Ok(SharedListeners { listeners, claim: Claim { _socket: claim } })
}

/// Claims `address` for this process (see [`bind_shared`]); `None` where
/// there are no abstract sockets (not Linux).
fn claim(address: SocketAddr) -> std::io::Result<Option<std::os::unix::net::UnixDatagram>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::linux::net::SocketAddrExt;
        // By port alone: `127.0.0.1:P`, `[::ffff:127.0.0.1]:P` and
        // `0.0.0.0:P` are one port to a client, whatever the spelling.
        let name = format!("idemgate-listen-port-{}", address.port());
        let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        match std::os::unix::net::UnixDatagram::bind_addr(&at) {
            Ok(socket) => Ok(Some(socket)),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another idemgate process (runtime = \"per-core\") already listens on this port",
            )),
            Err(e) => Err(e),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = address;
        Ok(None)
    }
}

fn reuse_port(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.bind(address)?;
    // The same backlog as `TcpListener::bind`.
    socket.listen(1024)
}
