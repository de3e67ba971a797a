//! The accept loop: HTTP/1.1 connections (WebSocket upgrades included) served by hyper with the
//! limits `axum::serve` does not set, on the TCP address and on the local Unix socket alike
//! ([`Accept`]).
//!
//! `axum::serve` gives hyper no timer, and hyper only enforces its header-read timeout with one: a
//! client that sends its request head a byte at a time (or opens a connection and says nothing)
//! held the connection for ever. Here every request head, the first and each one after a
//! keep-alive response, must arrive within `server.header_timeout_s`, and at most
//! `server.max_connections` connections are served at once (one more waits accepted but unserved,
//! the rest in the kernel's backlog, until one closes). A WebSocket session keeps its connection's slot until it ends.
//!
//! A client that stops reading while audio streams to it would hold its synthesis slot for ever
//! too: hyper polls a response body only when the socket takes more, so nothing in the request
//! ever sees its deadline. Every write that waits longer than `server.send_timeout_s` for the
//! client fails instead ([`SendTimeout`]); the connection closes and its request is cancelled.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;

/// What the accept loop needs to know.
#[derive(Clone)]
pub struct Limits {
    /// The longest a client may take to send one request head.
    pub header_timeout: Duration,
    /// The longest one write may wait for the client to take it.
    pub send_timeout: Duration,
    /// Counts the connections cut off by `send_timeout` (`cosy_send_timeouts_total`).
    pub send_timeouts: Arc<AtomicU64>,
}

/// One of the `server.max_connections` slots. Every request carries a clone in its extensions;
/// the WebSocket handler moves one into its session, so an upgraded connection keeps its slot
/// (and stays counted in /metrics) until the session ends, not only until the upgrade.
#[derive(Clone)]
pub struct ConnectionSlot(#[allow(dead_code)] Arc<OwnedSemaphorePermit>);

/// A listener the accept loop takes connections from: the TCP address or the local socket.
pub trait Accept: Send + 'static {
    type Connection: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection, ready to be served.
    fn next_connection(&self) -> impl Future<Output = io::Result<Self::Connection>> + Send;
}

impl Accept for TcpListener {
    type Connection = tokio::net::TcpStream;
    async fn next_connection(&self) -> io::Result<Self::Connection> {
        let (tcp, _peer) = self.accept().await?;
        // Audio chunks are small writes that must leave at once (no Nagle delay behind an ACK).
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }
}

impl Accept for UnixListener {
    type Connection = tokio::net::UnixStream;
    async fn next_connection(&self) -> io::Result<Self::Connection> {
        let (stream, _peer) = self.accept().await?;
        Ok(stream)
    }
}

/// Serves `app` on `listener`, each connection holding one of `slots` (`server.max_connections`),
/// until `stop` turns true; then stops accepting, asks every open connection to finish its
/// exchange in progress and close, and returns once all have closed.
pub async fn serve<L: Accept>(
    listener: L,
    app: Router,
    limits: Limits,
    slots: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    // Every connection task holds a receiver; `closed()` on the sender resolves once all are gone.
    let (alive_tx, alive_rx) = watch::channel(());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    loop {
        let accepted = tokio::select! {
            accepted = listener.next_connection() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let connection = match accepted {
            Ok(connection) => connection,
            Err(e) => {
                // Out of file descriptors and the like: these pass; back off instead of spinning.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // At the limit, this connection waits unserved (and the next ones in the backlog) until
        // one closes. Taken after accepting, so that the permits held are the connections served.
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let slot = ConnectionSlot(Arc::new(permit));
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let mut request: Request = request.map(axum::body::Body::new);
            request.extensions_mut().insert(slot.clone());
            app.clone().oneshot(request)
        });
        let mut stop_conn = stop.clone();
        let alive = alive_rx.clone();
        let conn = http.serve_connection(TokioIo::new(SendTimeout::new(connection, limits.send_timeout).counted(limits.send_timeouts.clone())), service).with_upgrades();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!("connection ended: {e}");
                        }
                        break;
                    }
                    _ = stop_conn.wait_for(|stop| *stop), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(alive);
        });
    }
    drop(listener);
    drop(alive_rx);
    alive_tx.closed().await;
}

/// A connection whose writes fail with `TimedOut` once one has waited `limit` for the peer to
/// take more (its receive window stayed full). Reads pass through: how long a client may stay
/// silent is the header timeout's and the handlers' business.
pub struct SendTimeout<T> {
    inner: T,
    limit: Duration,
    /// Running while a write (or flush, or shutdown) waits; gone once one goes through.
    stalled: Option<Pin<Box<Sleep>>>,
    /// Counted up once when the limit cuts this connection off.
    cut_off: Option<Arc<AtomicU64>>,
}

impl<T> SendTimeout<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        SendTimeout { inner, limit, stalled: None, cut_off: None }
    }

    /// Counts this connection in `counter` if the limit cuts it off.
    pub fn counted(mut self, counter: Arc<AtomicU64>) -> Self {
        self.cut_off = Some(counter);
        self
    }

    /// What a write that returned `poll` becomes: pending until the limit, then an error.
    fn watch<R>(&mut self, cx: &mut Context<'_>, poll: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let timer = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                if let Some(counter) = self.cut_off.take() {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took nothing for {limit:?} (server.send_timeout_s)"),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.watch(cx, poll)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.watch(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_flush(cx);
        this.watch(cx, poll)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.watch(cx, poll)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Paused time: tokio's clock moves only when every task waits, straight to the next timer, so
    // a busy machine cannot make a steady reader look stalled (or a stall look short).
    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_takes_fails_after_the_limit() {
        let (ours, mut theirs) = tokio::io::duplex(1024);
        let mut conn = SendTimeout::new(ours, Duration::from_millis(200));
        let chunk = [7u8; 256];
        // The pipe takes 1 KiB; then writes wait for the peer, which reads nothing.
        let err = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Err(e) = conn.write_all(&chunk).await {
                    return e;
                }
            }
        })
        .await
        .expect("the stalled write ended by itself");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("server.send_timeout_s"), "{err}");
        // What went through is intact.
        let mut got = vec![0u8; 1024];
        theirs.read_exact(&mut got).await.unwrap();
        assert!(got.iter().all(|&b| b == 7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_reader_is_not_cut() {
        let (ours, mut theirs) = tokio::io::duplex(256);
        let mut conn = SendTimeout::new(ours, Duration::from_millis(300));
        let reader = tokio::spawn(async move {
            let mut total = 0usize;
            let mut buf = [0u8; 64];
            while total < 8192 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                total += theirs.read(&mut buf).await.unwrap();
            }
            total
        });
        // Every write waits for the reader, each time far less than the limit; in all far longer.
        for _ in 0..32 {
            conn.write_all(&[1u8; 256]).await.expect("a reader that keeps reading is served");
        }
        assert_eq!(reader.await.unwrap(), 8192);
    }
}
