//! The accept loop: HTTP/1.1 connections (WebSocket upgrades included) served by hyper with the
//! limits `axum::serve` does not set.
//!
//! `axum::serve` gives hyper no timer, and hyper only enforces its header-read timeout with one: a
//! client that sends its request head a byte at a time (or opens a connection and says nothing)
//! held the connection for ever. Here every request head, the first and each one after a
//! keep-alive response, must arrive within `server.header_timeout_s`, and at most
//! `server.max_connections` connections are open at once (the next waits in the kernel's backlog
//! until one closes). A WebSocket session keeps its connection's slot until it ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// What the accept loop needs to know.
pub struct Limits {
    /// The longest a client may take to send one request head.
    pub header_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

/// Connections open now, upgraded WebSocket sessions included (for `/metrics`).
#[derive(Default)]
pub struct OpenConnections(AtomicUsize);

impl OpenConnections {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// One of the `server.max_connections` slots. Every request carries a clone in its extensions;
/// the WebSocket handler moves one into its session, so an upgraded connection stays counted (and
/// keeps its slot) until the session ends, not only until the upgrade.
#[derive(Clone)]
pub struct ConnectionSlot(#[allow(dead_code)] Arc<SlotInner>);

struct SlotInner {
    _permit: OwnedSemaphorePermit,
    open: Arc<OpenConnections>,
}

impl Drop for SlotInner {
    fn drop(&mut self) {
        self.open.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves `app` on `listener` until `stop` turns true; then stops accepting, asks every open
/// connection to finish its exchange in progress and close, and returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    open: Arc<OpenConnections>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    // Every connection task holds a receiver; `closed()` on the sender resolves once all are gone.
    let (alive_tx, alive_rx) = watch::channel(());
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(e) => {
                // Out of file descriptors and the like: these pass; back off instead of spinning.
                tracing::warn!("accepting a connection failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Audio chunks are small writes that must leave at once (no Nagle delay behind an ACK).
        let _ = tcp.set_nodelay(true);
        open.0.fetch_add(1, Ordering::Relaxed);
        let slot = ConnectionSlot(Arc::new(SlotInner { _permit: permit, open: open.clone() }));
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let mut request: Request = request.map(axum::body::Body::new);
            request.extensions_mut().insert(slot.clone());
            app.clone().oneshot(request)
        });
        let mut stop_conn = stop.clone();
        let alive = alive_rx.clone();
        let header_timeout = limits.header_timeout;
        tokio::spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
            let conn = builder.serve_connection(TokioIo::new(tcp), service).with_upgrades();
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
