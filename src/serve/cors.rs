//! Browsers: which web pages may call the API (CORS) and open the WebSocket.
//!
//! One list, `server.cors_origins`, decides both ([`Origins::allows`]): tower-http's
//! `CorsLayer` answers preflights and adds the headers to every answer for the HTTP routes, and
//! the WebSocket handler refuses an upgrade whose `Origin` is not allowed (browsers send `Origin`
//! on a WebSocket handshake but do not preflight it: without that check any page could open a
//! session). Not set, the list is the loopback origins when the server listens on a loopback
//! address (a page served from the same machine, e.g. a local web UI), none otherwise. The
//! server's own page (`GET /`) is same-origin: its fetches need no CORS, and its WebSocket is let
//! in by [`Origins::allows_socket`].

use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, CorsLayer, ExposeHeaders};

use cosy::config::RawValue;

/// The response headers a page may read: every `x-cosy-*` header (through `*`, which browsers
/// honour for requests without cookies, as these are) and, for older browsers, the ones by name.
const EXPOSED: &[&str] = &["*", "x-cosy-voice", "x-cosy-ignored-fields", "x-request-id", "retry-after", "content-type"];

/// What `server.cors_origins` allows, as its refusals say it.
pub const ALLOWED: &str = "a list of origins such as [\"https://app.example.com\", \"http://localhost:3000\"] \
     (array, or comma-separated text; [] or \"none\" = none; [\"*\"] = any; \"\" = not set: loopback pages on a loopback bind)";

/// `server.cors_origins`: `scheme://host[:port]` each (what a browser sends as `Origin`), or `*`
/// alone; lower-cased, without a trailing slash.
pub fn origins_of(v: &RawValue) -> std::result::Result<Vec<String>, String> {
    let items: Vec<String> = match v {
        RawValue::Toml(toml::Value::Array(items)) => {
            items.iter().map(|i| i.as_str().map(str::to_string)).collect::<Option<_>>().ok_or("every item must be a string")?
        }
        RawValue::Toml(toml::Value::String(s)) | RawValue::Text(s) => s.split(',').map(str::to_string).collect(),
        _ => return Err("not a list".into()),
    };
    let mut out: Vec<String> = Vec::new();
    for item in items {
        let o = item.trim().trim_end_matches('/').to_ascii_lowercase();
        if o.is_empty() {
            continue;
        }
        if o == "*" {
            out.push(o);
            continue;
        }
        let Some((scheme, rest)) = o.split_once("://") else {
            return Err(format!("{item:?} has no scheme; write it as a browser sends it, e.g. https://app.example.com"));
        };
        let host_ok = !rest.is_empty()
            && !rest.contains('/')
            && rest.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'));
        if !matches!(scheme, "http" | "https") || !host_ok {
            return Err(format!("{item:?} is not an origin (scheme://host[:port], no path)"));
        }
        if !out.contains(&o) {
            out.push(o);
        }
    }
    if out.len() > 1 && out.iter().any(|o| o == "*") {
        return Err("\"*\" (any origin) goes alone".into());
    }
    Ok(out)
}

/// The origins allowed (`server.cors_origins`, or the loopback default).
#[derive(Debug, Clone)]
pub struct Origins {
    /// `*`: any origin.
    any: bool,
    /// `scheme://host[:port]`, lower case.
    list: Vec<String>,
    /// The default on a loopback bind: `http(s)://localhost|127.0.0.1|[::1]` on any port.
    loopback: bool,
}

impl Origins {
    /// From `server.cors_origins` (`None`: not set) and whether the server listens on loopback.
    pub fn new(configured: Option<&[String]>, loopback_bind: bool) -> Origins {
        match configured {
            Some(list) => Origins { any: list.iter().any(|o| o == "*"), list: list.to_vec(), loopback: false },
            None => Origins { any: false, list: Vec::new(), loopback: loopback_bind },
        }
    }

    /// Whether a page from `origin` (the `Origin` header as sent) may use the API.
    pub fn allows(&self, origin: &str) -> bool {
        let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.any || self.list.contains(&origin) {
            return true;
        }
        self.loopback && is_loopback_origin(&origin)
    }

    /// Whether a page from `origin` may open the WebSocket on a server reached as `host` (the
    /// `Host` header): an allowed origin, or the server's own page (`GET /`, same origin: a
    /// browser sends that page's fetches without CORS, so its WebSocket is let in alike, whatever
    /// `server.cors_origins` says).
    pub fn allows_socket(&self, origin: &str, host: Option<&str>) -> bool {
        self.allows(origin) || host.is_some_and(|h| same_origin(origin, h))
    }

    /// What the log says at start.
    pub fn describe(&self) -> String {
        match (self.any, self.loopback, self.list.is_empty()) {
            (true, ..) => "any origin (server.cors_origins = [\"*\"])".into(),
            (_, true, _) => "pages from localhost, 127.0.0.1 and [::1] (the default on a loopback bind)".into(),
            (_, _, true) => "no web page (server.cors_origins is empty)".into(),
            _ => self.list.join(", "),
        }
    }

    /// tower-http's layer over this list: preflights answered (any method the API has, the
    /// request headers echoed: `Authorization`, `Content-Type`, `x-stainless-*` and the rest), the
    /// allowed origin echoed, the `x-cosy-*` headers exposed.
    pub fn layer(&self) -> CorsLayer {
        let origins = self.clone();
        let exposed: Vec<HeaderName> = EXPOSED.iter().map(|h| HeaderName::from_static(h)).collect();
        CorsLayer::new()
            .allow_origin(AllowOrigin::predicate(move |origin: &HeaderValue, _| origin.to_str().is_ok_and(|o| origins.allows(o))))
            .allow_methods(AllowMethods::list([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS]))
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers(ExposeHeaders::list(exposed))
            .max_age(Duration::from_secs(3600))
    }
}

/// `http(s)://localhost`, `127.x.x.x` or `[::1]`, any port.
fn is_loopback_origin(origin: &str) -> bool {
    let Some(rest) = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) else { return false };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, port)) if port.is_empty() || port.starts_with(':') => return h == "::1" && port_ok(port),
            _ => return false,
        }
    } else {
        match rest.split_once(':') {
            Some((h, port)) => {
                if !port_ok(&format!(":{port}")) {
                    return false;
                }
                h
            }
            None => rest,
        }
    };
    host == "localhost" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// `origin` is `http(s)://HOST` exactly, for the `Host` header `host` (case aside).
fn same_origin(origin: &str, host: &str) -> bool {
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    let host = host.trim().to_ascii_lowercase();
    !host.is_empty() && (origin.strip_prefix("http://") == Some(&host) || origin.strip_prefix("https://") == Some(&host))
}

fn port_ok(port: &str) -> bool {
    port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok())
}

/// Preflights are answered 204 No Content (tower-http answers 200 with the same headers).
pub async fn preflight_no_content(req: Request, next: Next) -> Response {
    let preflight = req.method() == Method::OPTIONS;
    let mut response = next.run(req).await;
    if preflight && response.status() == StatusCode::OK {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_default_allows_local_pages_only() {
        let o = Origins::new(None, true);
        for ok in ["http://localhost", "http://localhost:3000", "http://127.0.0.1:8080", "https://[::1]:5173", "HTTP://LOCALHOST:1/"] {
            assert!(o.allows(ok), "{ok}");
        }
        for no in ["https://evil.example", "http://localhost.evil.example", "http://127.0.0.1.nip.io", "null", "http://[::2]", "http://localhost:x"] {
            assert!(!o.allows(no), "{no}");
        }
        assert!(!Origins::new(None, false).allows("http://localhost:3000"), "no default beyond loopback");
    }

    #[test]
    fn a_configured_list_is_exact() {
        let list = vec!["https://app.example.com".to_string()];
        let o = Origins::new(Some(&list), true);
        assert!(o.allows("https://app.example.com"));
        assert!(!o.allows("https://app.example.com:8443"));
        assert!(!o.allows("http://localhost:3000"), "a list replaces the loopback default");
        assert!(Origins::new(Some(&["*".to_string()]), false).allows("https://anything.example"));
        assert!(!Origins::new(Some(&[]), true).allows("http://localhost"));
        let _ = o.layer();
    }

    #[test]
    fn the_servers_own_page_may_open_the_socket() {
        let none = Origins::new(Some(&[]), false);
        assert!(none.allows_socket("http://tts.lan:8080", Some("tts.lan:8080")));
        assert!(none.allows_socket("https://TTS.lan", Some("tts.lan")));
        for (origin, host) in [("http://evil.example", Some("tts.lan:8080")), ("http://tts.lan:8081", Some("tts.lan:8080")), ("http://tts.lan", None), ("null", Some(""))] {
            assert!(!none.allows_socket(origin, host), "{origin} on {host:?}");
        }
    }
}
