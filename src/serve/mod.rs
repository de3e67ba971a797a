//! `cosy serve`: one loaded model behind an OpenAI-compatible HTTP API (docs/server.md).
//!
//! This module belongs to the binary: the library (`cosy::engine`) knows nothing of HTTP. The
//! server listens at once (`/health` answers while the model loads), loads the engine on a
//! blocking thread, warms it up, and only then says yes on `/ready`. Every synthesis passes the
//! engine's one admission (`engine.max_in_flight` run, `engine.max_queue` wait): a refusal is
//! 429 with Retry-After. The routes translate HTTP into the application layer's calls
//! (`cosy::app`) and its typed errors into statuses; they decide nothing themselves. Audio
//! leaves as it is made; a client that goes away cancels its request (the engine stops at the
//! next token). SIGTERM or Ctrl-C: stop accepting, let the work
//! in flight finish within `server.shutdown_grace_s`, exit.

mod body;
mod cors;
mod encode;
mod error;
mod listen;
mod metrics;
pub mod settings;
mod socket;
mod speech;
mod synthesis;
mod voices;
mod web;
mod ws;
mod wyoming;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, MethodRouter};
use axum::Router;
use tokio::sync::Semaphore;
use tracing::Instrument;

use cosy::app::voices::Voices;
use cosy::config::Config;
use cosy::engine::Engine;
use cosy::profile::Profiler;

use error::ApiError;
use metrics::Metrics;
use settings::{ServerSettings, Settings, WyomingSettings};

/// The id `GET /v1/models` lists. Requests may name any model: one server serves one model.
pub const MODEL_ID: &str = "cosyvoice3";

/// Shared by every handler.
pub struct AppState {
    pub config: Config,
    /// `[server]`: the HTTP API's settings.
    pub server: ServerSettings,
    /// `[wyoming]`: the Wyoming server's settings.
    pub wyoming: WyomingSettings,
    engine: OnceLock<Arc<Engine>>,
    profiler: Profiler,
    ready: AtomicBool,
    draining: AtomicBool,
    pub metrics: Metrics,
    pub voices: Voices,
    next_id: AtomicU64,
    /// Syntheses and WebSocket sessions not yet finished (what a shutdown waits for).
    active: AtomicUsize,
    /// One permit per open connection (`server.max_connections`; a WebSocket session holds its
    /// connection's until it ends).
    connection_slots: Arc<Semaphore>,
    /// The web pages that may use the API (`server.cors_origins`): CORS and the WebSocket's Origin.
    pub origins: cors::Origins,
}

/// The id of one HTTP exchange: the client's `x-request-id` when it is sane, else our own.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

impl AppState {
    fn new(config: Config, settings: Settings, loopback_bind: bool) -> AppState {
        let Settings { server, wyoming, say: _ } = settings;
        AppState {
            origins: cors::Origins::new(server.cors_origins.as_deref(), loopback_bind),
            voices: Voices::new(&config),
            connection_slots: Arc::new(Semaphore::new(server.max_connections)),
            config,
            server,
            wyoming,
            engine: OnceLock::new(),
            profiler: Profiler::totals_only(),
            ready: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            metrics: Metrics::new(),
            next_id: AtomicU64::new(1),
            active: AtomicUsize::new(0),
        }
    }

    /// The engine, or 503 while it loads and while the server drains.
    pub fn engine(&self) -> Result<Arc<Engine>, ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("shutting_down", "the server is shutting down; retry on another replica")
                .retry_after(self.server.retry_after_s));
        }
        match (self.engine.get(), self.ready.load(Ordering::Relaxed)) {
            (Some(engine), true) => Ok(engine.clone()),
            _ => Err(ApiError::unavailable("loading", "the model is still loading; retry when /ready answers 200")
                .retry_after(self.server.retry_after_s.max(1))),
        }
    }

    /// Marks one unit of work as running until the guard drops.
    pub fn track(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveGuard(self.clone())
    }

    pub fn request_deadline(&self, started: Instant) -> tokio::time::Instant {
        tokio::time::Instant::from_std(started + Duration::from_secs(self.server.request_timeout_s))
    }

    fn new_request_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        format!("req-{n:x}-{:08x}", nanos ^ std::process::id().rotate_left(16))
    }

    /// Loads the model, then warms it up (one short synthesis with the default voice).
    fn load(&self) -> cosy::Result<()> {
        let started = Instant::now();
        let mut builder = Engine::builder(&self.config).profiler(self.profiler.clone());
        if self.server.warmup {
            match self.voices.resolve(cosy::app::voices::VoiceChoice::default(), None) {
                Ok(resolved) => {
                    let mut warm_up = cosy::request::Request::new("Hello.", resolved.voice);
                    warm_up.stream = true;
                    builder = builder.warm_up(warm_up);
                }
                Err(e) => tracing::info!("warm-up skipped (server.warmup needs a usable default voice): {e}"),
            }
        }
        let engine = Arc::new(builder.build()?);
        tracing::info!("model {} loaded (and warmed up) in {:.1} s", self.config.model_dir.display(), started.elapsed().as_secs_f64());
        let _ = self.engine.set(engine);
        self.ready.store(true, Ordering::SeqCst);
        tracing::info!("ready");
        Ok(())
    }

    /// The output sample rate of the loaded model (what pcm, wav and flac responses carry); read
    /// from the model, as `say` does (24 kHz for CosyVoice3; requests run only once it is loaded).
    pub fn sample_rate(&self) -> u32 {
        self.engine.get().map_or(24_000, |e| e.sample_rate())
    }

    /// An engine or library error as an API error, with Retry-After on 429 (counted as rejected).
    pub fn api_error(&self, e: cosy::Error) -> ApiError {
        let busy = matches!(e, cosy::Error::Busy(_));
        let err = ApiError::from_engine(e);
        if busy {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return err.retry_after(self.server.retry_after_s);
        }
        err
    }

    fn gauges(&self) -> metrics::Gauges {
        let (llm, dit) = match self.engine.get() {
            Some(e) => {
                let (l, d) = e.batch_stats();
                (Some(l), Some(d))
            }
            None => (None, None),
        };
        metrics::Gauges {
            ready: self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            in_flight: self.engine.get().map_or(0, |e| e.in_flight()),
            queued: self.engine.get().map_or(0, |e| e.queued()),
            max_in_flight: self.config.engine.max_in_flight,
            max_queue: self.config.engine.max_queue,
            connections: self.server.max_connections - self.connection_slots.available_permits(),
            stages: self.profiler.totals(),
            llm,
            dit,
            model_loaded: self.engine.get().is_some_and(|e| e.model_state() == cosy::engine::ModelState::Loaded),
            model_reloads: self.engine.get().map_or(0, |e| e.reloads()),
        }
    }
}

/// Work in progress, counted for the shutdown.
pub struct ActiveGuard(Arc<AppState>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `cosy serve`'s own flags (each sets its key, above the config file and the variables).
#[derive(Debug, Default)]
pub struct ServeFlags {
    /// `--bind` (`server.bind`).
    pub bind: Option<String>,
    /// `--wyoming` (`wyoming.bind`).
    pub wyoming: Option<String>,
    /// `--zeroconf [NAME]` (`wyoming.zeroconf`).
    pub zeroconf: Option<String>,
}

/// `cosy serve`: runs until SIGTERM or Ctrl-C and the drain that follows.
pub fn run(mut config: Config, mut settings: Settings, flags: ServeFlags) -> anyhow::Result<()> {
    let ServeFlags { bind, wyoming, zeroconf } = flags;
    for (key, flag, value) in [("server.bind", "--bind", bind), ("wyoming.bind", "--wyoming", wyoming), ("wyoming.zeroconf", "--zeroconf", zeroconf)] {
        if let Some(value) = value {
            let origin = cosy::config::Origin::Flag(flag.into());
            config.set_with(&mut [&mut settings.keys()], key, &cosy::config::RawValue::Text(value), &origin, None)?;
        }
    }
    if settings.wyoming.zeroconf.is_some() && settings.wyoming.bind.is_none() {
        return Err(cosy::Error::Config("wyoming.zeroconf announces the Wyoming server, which is off: set wyoming.bind (--wyoming ADDR) too".into()).into());
    }
    // What can be checked at once is, before the port opens (loading the graphs comes after).
    encode::AudioFormat::parse_setting(&settings.server.default_format).map_err(cosy::Error::Config)?;
    Voices::new(&config).store().check_dir()?;
    cosy::model::ModelDir::open(&config.model_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("serve")
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the server's runtime: {e}"))?;
    let result = runtime.block_on(serve(config, settings));
    // Requests still running after the grace period are abandoned with the process.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

/// The server's doors, bound before anything is said: a port or a socket taken is a config error,
/// not a log line.
struct Doors {
    http: tokio::net::TcpListener,
    wyoming: Option<tokio::net::TcpListener>,
    /// `server.socket`: a live server on a named path is a config error.
    local: Option<(tokio::net::UnixListener, socket::SocketFile)>,
}

impl Doors {
    async fn bind(settings: &Settings) -> anyhow::Result<Doors> {
        let bind = settings.server.bind.clone();
        let http = tokio::net::TcpListener::bind(&bind).await.map_err(|e| {
            cosy::Error::Config(format!("server.bind {bind}: cannot listen there ({e}); pick a free port or another address"))
        })?;
        let wyoming = match settings.wyoming.bind.clone() {
            Some(bind) => Some(tokio::net::TcpListener::bind(&bind).await.map_err(|e| {
                cosy::Error::Config(format!("wyoming.bind {bind}: cannot listen there ({e}); pick a free port or another address"))
            })?),
            None => None,
        };
        let local = socket::bind(&settings.server.socket)?;
        Ok(Doors { http, wyoming, local })
    }
}

async fn serve(config: Config, settings: Settings) -> anyhow::Result<()> {
    let Doors { http: listener, wyoming: wyoming_listener, local: local_socket } = Doors::bind(&settings).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(AppState::new(config, settings, addr.ip().is_loopback()));
    if state.server.api_key.is_none() && !addr.ip().is_loopback() {
        tracing::warn!("listening on {addr} without server.api_key: anyone who reaches this port can use the API");
    }
    tracing::info!("web pages allowed (CORS, WebSocket): {}", state.origins.describe());
    log_aliases(&state);
    // One line on stderr whatever the log level: scripts and tests read the port from it.
    eprintln!("cosy serve: listening on http://{addr}");
    let mut wyoming_server = None;
    if let Some(listener) = wyoming_listener {
        let wyoming_addr = listener.local_addr()?;
        if !wyoming_addr.ip().is_loopback() {
            tracing::warn!("Wyoming on {wyoming_addr}: the protocol has no authentication; anyone who reaches this port can use it");
        }
        eprintln!("cosy serve: wyoming on tcp://{wyoming_addr}");
        wyoming_server = Some((wyoming_addr, listener));
    }
    // Withdrawn (mDNS goodbye) when the server starts to shut down, below.
    let announcement = match (&state.wyoming.zeroconf, &wyoming_server) {
        (Some(name), Some((wyoming_addr, _))) => Some(wyoming::zeroconf::Announcement::start(name, *wyoming_addr)?),
        _ => None,
    };
    let (local_listener, socket_file) = local_socket.unzip();
    if let Some(file) = &socket_file {
        eprintln!("cosy serve: local socket {}", file.path.display());
    }

    let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel();
    let loader = state.clone();
    tokio::task::spawn_blocking(move || {
        let _ = loaded_tx.send(loader.load());
    });

    let app = router(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let limits = listen::Limits {
        header_timeout: Duration::from_secs(state.server.header_timeout_s),
        send_timeout: Duration::from_secs(state.server.send_timeout_s),
        send_timeouts: state.metrics.send_timeouts.clone(),
    };
    let wyoming_server = wyoming_server.map(|(_, listener)| tokio::spawn(wyoming::serve(listener, state.clone(), stop_rx.clone())));
    // The local socket serves the same routes, its connections counted with the others.
    let local_server =
        local_listener.map(|l| tokio::spawn(listen::serve(l, app.clone(), limits.clone(), state.connection_slots.clone(), stop_rx.clone())));
    let http_server = tokio::spawn(listen::serve(listener, app, limits, state.connection_slots.clone(), stop_rx));

    let mut loaded_rx = loaded_rx;
    let load_failed = tokio::select! {
        _ = shutdown_signal() => None,
        loaded = &mut loaded_rx => match loaded {
            Ok(Err(e)) => Some(e),
            _ => { shutdown_signal().await; None }
        },
    };
    if let Some(e) = load_failed {
        return Err(e.into());
    }
    drain(&state, Running { http_server, local_server, socket_file, wyoming_server, announcement, stop_tx }).await
}

/// What runs until the server drains.
struct Running {
    http_server: tokio::task::JoinHandle<()>,
    local_server: Option<tokio::task::JoinHandle<()>>,
    socket_file: Option<socket::SocketFile>,
    wyoming_server: Option<tokio::task::JoinHandle<()>>,
    announcement: Option<wyoming::zeroconf::Announcement>,
    stop_tx: tokio::sync::watch::Sender<bool>,
}

/// The drain after SIGTERM or Ctrl-C: no new connections, then the work in flight, for at most
/// `server.shutdown_grace_s`.
async fn drain(state: &AppState, running: Running) -> anyhow::Result<()> {
    let Running { http_server, local_server, socket_file, wyoming_server, mut announcement, stop_tx } = running;
    tracing::info!("shutting down: no new connections; waiting for the work in flight (at most {} s)", state.server.shutdown_grace_s);
    state.draining.store(true, Ordering::SeqCst);
    announcement.take();
    let _ = stop_tx.send(true);
    let deadline = tokio::time::Instant::from_std(Instant::now() + Duration::from_secs(state.server.shutdown_grace_s));
    // HTTP connections end first (axum waits for them), then WebSocket sessions and the engine
    // work they started.
    let _ = tokio::time::timeout_at(deadline, http_server).await;
    if let Some(local_server) = local_server {
        let _ = tokio::time::timeout_at(deadline, local_server).await;
    }
    // No new client finds this server from here on.
    drop(socket_file);
    if let Some(wyoming_server) = wyoming_server {
        let _ = tokio::time::timeout_at(deadline, wyoming_server).await;
    }
    while state.active.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = state.active.load(Ordering::SeqCst);
    if left > 0 {
        anyhow::bail!(
            "shutdown: {left} request(s) still running after server.shutdown_grace_s = {} s; stopped them",
            state.server.shutdown_grace_s
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// SIGTERM (what Kubernetes sends) or SIGINT (Ctrl-C).
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Anyone: the probes and the metrics.
    Public,
    /// The web page and its assets: anyone (they hold no data; the page asks for the key), when
    /// `server.web_ui` is on (the handlers answer 404 otherwise).
    Page,
    /// The API: the key, when `server.api_key` is set.
    Key,
    /// A listing: as the API, except that `GET` answers without the key when
    /// `server.public_listings` is set.
    Listing,
}

/// One route of the server.
struct Route {
    /// The path as the router matches it (`{name}`: one segment), also its metrics label.
    path: &'static str,
    /// How the 404 names it; `None`: not named there.
    described: Option<&'static str>,
    access: Access,
    /// Whether each exchange is logged (not the probes, which come every few seconds).
    logged: bool,
    handler: fn() -> MethodRouter<Arc<AppState>>,
}

/// Every route of the server, in the order the 404 names them: the router, the metrics labels,
/// the key rules and the 404 text all come from this table.
const ROUTES: &[Route] = &[
    Route { path: "/v1/audio/speech", described: Some("POST /v1/audio/speech"), access: Access::Key, logged: true, handler: || post(speech::handle) },
    Route {
        path: WS_ROUTE,
        described: Some("GET /v1/audio/speech/stream (WebSocket)"),
        access: Access::Key,
        logged: true,
        handler: || get(ws::handle),
    },
    Route {
        path: "/v1/audio/voices",
        described: Some("GET|POST /v1/audio/voices"),
        access: Access::Listing,
        logged: true,
        handler: || get(voices::list).post(voices::create),
    },
    Route {
        path: "/v1/audio/voices/{name}",
        described: Some("DELETE /v1/audio/voices/NAME"),
        access: Access::Key,
        logged: true,
        handler: || delete(voices::remove),
    },
    Route {
        path: "/v1/audio/voices/{name}/default",
        described: Some("POST /v1/audio/voices/NAME/default"),
        access: Access::Key,
        logged: true,
        handler: || post(voices::make_default),
    },
    Route { path: "/v1/models", described: Some("GET /v1/models"), access: Access::Listing, logged: true, handler: || get(models) },
    Route { path: "/v1/audio/models", described: Some("GET /v1/audio/models"), access: Access::Listing, logged: true, handler: || get(models) },
    Route { path: INFO_ROUTE, described: Some("GET /v1/audio/info"), access: Access::Key, logged: true, handler: || get(info) },
    Route { path: "/health", described: Some("/health"), access: Access::Public, logged: false, handler: || get(health) },
    Route { path: "/ready", described: Some("/ready"), access: Access::Public, logged: false, handler: || get(ready) },
    Route { path: "/metrics", described: Some("/metrics"), access: Access::Public, logged: false, handler: || get(metrics_page) },
    Route { path: "/", described: Some("the web page at GET /"), access: Access::Page, logged: true, handler: || get(web::index) },
    Route { path: "/web/{file}", described: None, access: Access::Page, logged: true, handler: || get(web::file) },
];

/// The route a path belongs to (`{name}` matches one segment), as the router matches it.
fn route_of(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|route| {
        let mut given = path.split('/');
        let mut pattern = route.path.split('/');
        loop {
            match (given.next(), pattern.next()) {
                (None, None) => return true,
                (Some(g), Some(p)) if p.starts_with('{') => {
                    if g.is_empty() {
                        return false;
                    }
                }
                (Some(g), Some(p)) if g == p => {}
                _ => return false,
            }
        }
    })
}

fn router(state: Arc<AppState>) -> Router {
    let (mut api, mut open) = (Router::new(), Router::new());
    for route in ROUTES {
        match route.access {
            Access::Key | Access::Listing => api = api.route(route.path, (route.handler)()),
            Access::Public | Access::Page => open = open.route(route.path, (route.handler)()),
        }
    }
    let api = api.route_layer(from_fn_with_state(state.clone(), authorize));
    open.merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read with server.max_body_bytes by the handlers themselves (a clear 413).
        .layer(DefaultBodyLimit::max(state.server.max_body_bytes))
        // Browsers: preflights answered (204) and the CORS headers on every answer, before any
        // route (a preflight carries no API key).
        .layer(state.origins.layer())
        .layer(axum::middleware::from_fn(cors::preflight_no_content))
        .layer(from_fn_with_state(state.clone(), request_context))
        .with_state(state)
}

/// Request id, access log and the per-route counters, around every exchange.
async fn request_context(State(state): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)))
        .map(str::to_string)
        .unwrap_or_else(|| state.new_request_id());
    req.extensions_mut().insert(RequestId(id.clone()));
    let route = route_of(req.uri().path());
    // Bounded label values for the metrics: a route's path, or `other`.
    let label = route.map_or("other", |r| r.path);
    let method = req.method().clone();
    let started = Instant::now();
    let span = tracing::info_span!("request", id = %id);
    let mut response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    state.metrics.count_request(label, status);
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    if route.is_none_or(|r| r.logged) {
        span.in_scope(|| {
            tracing::info!("{method} {label} {status} in {:.1} ms (headers)", started.elapsed().as_secs_f64() * 1e3)
        });
    }
    response
}

/// The WebSocket route, where the key may also come as a subprotocol or a query parameter (a
/// browser's WebSocket cannot send `Authorization`).
pub const WS_ROUTE: &str = "/v1/audio/speech/stream";

/// What the server tells its clients of itself ([`info`]); the web page reads it.
pub const INFO_ROUTE: &str = "/v1/audio/info";

/// The subprotocol a WebSocket client offers (`Sec-WebSocket-Protocol: cosy, cosy-key.KEY`); the
/// server answers `cosy`, never the key.
pub const WS_PROTOCOL: &str = "cosy";
const WS_KEY_PROTOCOL: &str = "cosy-key.";

/// The API key a request carries: `Authorization: Bearer KEY`; on the WebSocket route also the
/// subprotocol `cosy-key.KEY` or the query parameter `api_key=KEY`.
fn given_key(req: &Request) -> Option<String> {
    let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::trim).and_then(|v| {
        let (scheme, token) = v.split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim().to_string())
    });
    if bearer.is_some() || req.uri().path() != WS_ROUTE {
        return bearer;
    }
    let protocol = req
        .headers()
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_KEY_PROTOCOL).map(str::to_string));
    protocol.or_else(|| {
        req.uri().query()?.split('&').find_map(|pair| pair.strip_prefix("api_key=").map(percent_decode))
    })
}

/// `%XX` escapes and `+` (a space) of a query value.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| bytes.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
                continue;
            }
            (None, b'+') => out.push(b' '),
            (None, b) => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The API key when `server.api_key` is set (compared in constant time), except for the listings
/// when `server.public_listings` is set.
async fn authorize(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(key) = &state.server.api_key else {
        return next.run(req).await;
    };
    let listing = route_of(req.uri().path()).is_some_and(|r| r.access == Access::Listing);
    if state.server.public_listings && req.method() == axum::http::Method::GET && listing {
        return next.run(req).await;
    }
    let token = given_key(&req);
    match token.as_deref() {
        None => {
            let how = if req.uri().path() == WS_ROUTE {
                "send the header `Authorization: Bearer KEY`, or (from a browser) the subprotocols `cosy, cosy-key.KEY` or the query `?api_key=KEY`"
            } else {
                "send the header `Authorization: Bearer KEY`"
            };
            ApiError::new(StatusCode::UNAUTHORIZED, "missing_api_key", format!("this server needs an API key: {how} (server.api_key)"))
                .into_response()
        }
        Some(t) if !same_secret(t.as_bytes(), key.as_bytes()) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "the API key is not valid for this server").into_response()
        }
        Some(_) => next.run(req).await,
    }
}

/// Compares two secrets without leaking where they differ or how long the right one is: both
/// are hashed (fixed length), then every byte of the digests is compared.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    let a = Sha256::digest(given);
    let b = Sha256::digest(expected);
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

async fn health() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

async fn ready(State(state): State<Arc<AppState>>) -> Response {
    match state.engine() {
        // Ready while the model is unloaded too (`engine.idle_unload_s`): a request loads it.
        Ok(engine) => axum::Json(serde_json::json!({ "status": "ready", "model": engine.model_state().as_str() })).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_page(State(state): State<Arc<AppState>>) -> Response {
    let body = state.metrics.render(&state.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

/// `GET /v1/models` and `GET /v1/audio/models`: OpenAI's list (`object`, `data`) and, for Open
/// WebUI's `/audio/models`, `models` as `{"id", "name"}` objects; one answer both read.
async fn models() -> Response {
    axum::Json(serde_json::json!({
        "object": "list",
        "data": [{ "id": MODEL_ID, "object": "model", "created": 0, "owned_by": "cosy" }],
        "models": [{ "id": MODEL_ID, "name": MODEL_ID }],
    }))
    .into_response()
}

/// `GET /v1/audio/info`: what a client needs of this server before it speaks, so that it assumes
/// nothing: the output sample rate (of pcm, wav, flac and the WebSocket's audio), the longest
/// prompt recording the model takes, the longest text, and the API's speed range. 503 while the
/// model loads (the rate and the prompt limit are the loaded model's).
async fn info(State(state): State<Arc<AppState>>) -> Response {
    let engine = match state.engine() {
        Ok(engine) => engine,
        Err(e) => return e.into_response(),
    };
    let speed = &cosy::app::speech::API_SPEED_RANGE;
    axum::Json(serde_json::json!({
        "model": MODEL_ID,
        "sample_rate": engine.sample_rate(),
        "max_prompt_seconds": engine.max_prompt_seconds(),
        "max_text_chars": state.config.limits.max_text_chars,
        "speed": { "min": speed.start(), "max": speed.end() },
    }))
    .into_response()
}

/// Says at start which names mean which voice, and warns of an alias to a voice that is not
/// there (it may be saved later: a request for it fails until then, naming the alias).
fn log_aliases(state: &AppState) {
    let saved = state.voices.store().names().unwrap_or_default();
    for extra in state.voices.extra_names(&saved) {
        match (extra.via, &extra.target) {
            ("alias", Some(to)) if extra.available => tracing::info!("voice {} means {to} (voices.aliases)", extra.id),
            ("alias", Some(to)) => tracing::warn!(
                "voices.aliases.{} = {to:?}: there is no saved voice {to}; requests for {} fail until it is saved",
                extra.id,
                extra.id
            ),
            _ => {}
        }
    }
}

/// 404 naming the routes; the web page's only when `server.web_ui` is on.
async fn not_found(State(state): State<Arc<AppState>>, req: Request) -> Response {
    ApiError::not_found("unknown_route", format!("no such endpoint: {} {}; {}", req.method(), req.uri().path(), routes_named(state.server.web_ui)))
        .into_response()
}

/// What the 404 says of the routes: the API's, then (with `server.web_ui`) the page's.
fn routes_named(web_ui: bool) -> String {
    let named = |page: bool| -> Vec<&str> {
        ROUTES.iter().filter(|r| (r.access == Access::Page) == page).filter_map(|r| r.described).collect()
    };
    let mut text = format!("the API is {}", named(false).join(", "));
    if web_ui {
        text.push_str(&format!(", and {}", named(true).join(", ")));
    }
    text
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }

    #[test]
    fn query_keys_are_decoded() {
        assert_eq!(percent_decode("a%2Fb+c%"), "a/b c%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("s3cret"), "s3cret");
    }

    #[test]
    fn the_404_names_every_route_of_the_api() {
        let api = routes_named(false);
        assert_eq!(
            api,
            "the API is POST /v1/audio/speech, GET /v1/audio/speech/stream (WebSocket), GET|POST /v1/audio/voices, \
             DELETE /v1/audio/voices/NAME, POST /v1/audio/voices/NAME/default, GET /v1/models, GET /v1/audio/models, \
             GET /v1/audio/info, /health, /ready, /metrics"
        );
        assert_eq!(routes_named(true), format!("{api}, and the web page at GET /"));
    }

    #[test]
    fn routes_are_bounded_labels() {
        let route_label = |path: &str| route_of(path).map_or("other", |r| r.path);
        assert_eq!(route_label("/v1/audio/voices/x"), "/v1/audio/voices/{name}");
        assert_eq!(route_label("/v1/audio/voices/x/default"), "/v1/audio/voices/{name}/default");
        assert_eq!(route_label("/v1/audio/voices"), "/v1/audio/voices");
        assert_eq!(route_label("/web/app.js"), "/web/{file}");
        assert_eq!(route_label("/"), "/");
        assert_eq!(route_label("/v1/audio/voices/"), "other");
        assert_eq!(route_label("/etc/passwd"), "other");
    }
}
