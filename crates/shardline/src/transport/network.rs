//! Where a node's connections come from: TCP by default, or a network of the caller's.
//!
//! The transport needs only byte streams, a listener and a way to dial an address. A node built
//! with a [`Network`] of its own (see
//! [`ClusterBuilder::network`](crate::ClusterBuilder::network)) takes its connections
//! from it: a test can run whole nodes on a simulated network, in one thread, on a paused clock,
//! with the partitions, delays and broken connections it chooses, and replay a run from its seed.
//! TCP stays the concrete type on the usual path; a network of one's own costs one virtual call
//! per read and write.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

/// A boxed future, for object-safe networks and providers.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A byte stream between two nodes, in order and reliable while it lasts (what TCP gives): a
/// network that loses bytes must break the connection instead.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// Accepts connections at one address.
pub trait Listener: Send + 'static {
    /// Where it listens (told to the peers this node dials).
    fn local_addr(&self) -> io::Result<SocketAddr>;

    /// The next connection, and where it comes from.
    fn accept(&mut self) -> BoxFuture<'_, io::Result<(Box<dyn Connection>, SocketAddr)>>;
}

/// Binds listeners and dials addresses, for nodes that do not use TCP.
///
/// ```no_run
/// # use std::sync::Arc;
/// # async fn run(my_network: Arc<dyn shardline::transport::Network>) -> Result<(), shardline::ConfigError> {
/// let node = shardline::Cluster::builder().node_name("n1").bind("10.0.0.1:7000").network(my_network).build().await?;
/// # Ok(()) }
/// ```
pub trait Network: Send + Sync + 'static {
    /// A listener at `addr`.
    fn bind(&self, addr: &str) -> BoxFuture<'static, io::Result<Box<dyn Listener>>>;

    /// A connection to `addr`.
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Box<dyn Connection>>>;
}

/// What a transport accepts connections from.
pub(crate) enum Bound {
    Tcp(tokio::net::TcpListener),
    Other(Box<dyn Listener>),
}

/// An accepted connection.
pub(crate) enum Accepted {
    Tcp(tokio::net::TcpStream),
    Other(Box<dyn Connection>),
}

impl Bound {
    pub async fn accept(&mut self) -> io::Result<(Accepted, SocketAddr)> {
        match self {
            Bound::Tcp(l) => l.accept().await.map(|(s, a)| (Accepted::Tcp(s), a)),
            Bound::Other(l) => l.accept().await.map(|(s, a)| (Accepted::Other(s), a)),
        }
    }
}
