//! The server's settings (`[server]`, `[wyoming]` of config.toml, `COSY_BIND`, `COSY_API_KEY`,
//! `COSY_WYOMING`), and where `cosy say` and `cosy file` find a running server (`[say]`,
//! `COSY_SERVER`), and their key table. The library knows nothing of them: `cosy` passes this
//! table to `Config::load_with` beside the library's own (`Settings::keys`), so one load reads
//! every key with one precedence, refuses unknown keys and records where each value came from.

use std::fmt;

use cosy::config::{Key, Section, TRUE_FALSE};

use super::cors;

/// What `cosy serve` reads from the configuration beside the library's [`cosy::config::Config`].
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub server: ServerSettings,
    pub wyoming: WyomingSettings,
    /// `[say]`: where `cosy say` and `cosy file` look for a running server.
    pub say: SaySettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            server: ServerSettings {
                bind: "127.0.0.1:8080".into(),
                api_key: None,
                retry_after_s: 1,
                max_body_bytes: 16 << 20,
                request_timeout_s: 300,
                header_timeout_s: 30,
                send_timeout_s: 30,
                max_connections: 1024,
                shutdown_grace_s: 30,
                warmup: true,
                default_format: "mp3".into(),
                cors_origins: None,
                public_listings: false,
                web_ui: true,
                socket: SocketSetting::Auto,
            },
            wyoming: WyomingSettings {
                bind: None,
                max_connections: 64,
                idle_timeout_s: 60,
                max_header_bytes: 64 << 10,
                max_payload_bytes: 1 << 20,
                normalize: true,
                zeroconf: None,
            },
            say: SaySettings { server: ServerChoice::Auto },
        }
    }
}

impl Settings {
    /// These settings with their key table, for `Config::load_with` and `Config::set_with`.
    pub fn keys(&mut self) -> Section<'_, Settings> {
        Section::new(KEYS, &[], self)
    }
}

/// `[server]`: `cosy serve` (the HTTP API).
#[derive(Clone, PartialEq)]
pub struct ServerSettings {
    /// Address and port to listen on (`127.0.0.1:8080`; `0.0.0.0:8080` in a container).
    pub bind: String,
    /// Bearer token clients must send (`Authorization: Bearer KEY`); `None` = no authentication.
    pub api_key: Option<String>,
    /// The Retry-After of a 429, in seconds.
    pub retry_after_s: u64,
    /// Largest request body (JSON with a base64 prompt, or a multipart upload), in bytes.
    pub max_body_bytes: usize,
    /// Longest a request may take, waiting included, in seconds.
    pub request_timeout_s: u64,
    /// The longest a client may take to send one request head (also how long an idle keep-alive
    /// connection stays open), in seconds.
    pub header_timeout_s: u64,
    /// The longest one write may wait for the client to take it, in seconds: a client that stops
    /// reading is disconnected and its request cancelled.
    pub send_timeout_s: u64,
    /// Connections served at once (a WebSocket session counts until it ends); more wait unanswered
    /// until one closes.
    pub max_connections: usize,
    /// After SIGTERM/SIGINT: how long in-flight requests may run before the server exits anyway.
    pub shutdown_grace_s: u64,
    /// Run one short synthesis before `/ready` says yes (with the default voice, if there is one).
    pub warmup: bool,
    /// The `response_format` of a speech request that names none (OpenAI's default: mp3). The
    /// server checks the name against the formats it writes before it listens.
    pub default_format: String,
    /// Origins (`https://app.example.com`) whose pages may call the API (CORS) and open the
    /// WebSocket; `["*"]` = any. `None` (not set): the loopback origins (`http://localhost`,
    /// `http://127.0.0.1`, `http://[::1]`, any port) when the server listens on a loopback
    /// address, none otherwise.
    pub cors_origins: Option<Vec<String>>,
    /// The listings (`GET /v1/models`, `/v1/audio/models`, `/v1/audio/voices`) answer without the
    /// API key (Open WebUI lists voices without sending it).
    pub public_listings: bool,
    /// `GET /` serves the web page (embedded in the binary; it uses the public API only).
    pub web_ui: bool,
    /// The per-user local socket the same routes are served on (for `cosy say` and `cosy file`).
    pub socket: SocketSetting,
}

/// `server.socket`: whether and where the server also listens on a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketSetting {
    /// The per-user default (`cosy::paths::local_socket`); when another live server holds it,
    /// this one says so and listens on TCP only.
    Auto,
    /// No socket.
    Off,
    /// This path (absolute); a live server there is an error naming it.
    Path(std::path::PathBuf),
}

/// `[say]`: `cosy say` and `cosy file` (one text) through a running server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaySettings {
    /// Where to look for the server.
    pub server: ServerChoice,
}

/// `say.server` / `COSY_SERVER`: which running server `cosy say` and `cosy file` use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerChoice {
    /// The default socket (`cosy::paths::local_socket`) when a server answers there; else the
    /// model is loaded here.
    Auto,
    /// Never a server: always load the model here (as `--local`).
    Off,
    /// The server on this Unix socket (absolute path); none there is an error.
    Socket(std::path::PathBuf),
    /// The server at `http://HOST:PORT` (the authority, `HOST:PORT`); none there is an error.
    Http(String),
}

impl fmt::Debug for ServerSettings {
    // By hand, so that a logged configuration never shows the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerSettings")
            .field("bind", &self.bind)
            .field("api_key", &self.api_key.as_ref().map(|_| "<set>"))
            .field("retry_after_s", &self.retry_after_s)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("request_timeout_s", &self.request_timeout_s)
            .field("header_timeout_s", &self.header_timeout_s)
            .field("send_timeout_s", &self.send_timeout_s)
            .field("max_connections", &self.max_connections)
            .field("shutdown_grace_s", &self.shutdown_grace_s)
            .field("warmup", &self.warmup)
            .field("default_format", &self.default_format)
            .field("cors_origins", &self.cors_origins)
            .field("public_listings", &self.public_listings)
            .field("web_ui", &self.web_ui)
            .field("socket", &self.socket)
            .finish()
    }
}

/// `[wyoming]`: the Wyoming protocol server of `cosy serve` (Home Assistant; docs/wyoming.md), on
/// the same engine as the HTTP API.
#[derive(Debug, Clone, PartialEq)]
pub struct WyomingSettings {
    /// Address and port to listen on; `None` (not set, or "") = no Wyoming server. A bare port
    /// (`10200`) means the loopback (`127.0.0.1:10200`).
    pub bind: Option<String>,
    /// Wyoming connections open at once; one more is answered with an `error` event and closed.
    pub max_connections: usize,
    /// The longest a connection may stay silent (no event, no audio being made), in seconds.
    pub idle_timeout_s: u64,
    /// Longest event header (one JSON line), in bytes.
    pub max_header_bytes: usize,
    /// Largest `data` and largest `payload` of one event, each, in bytes.
    pub max_payload_bytes: usize,
    /// Streamed text (`synthesize-chunk`): normalise each settled sentence (numbers, units,
    /// symbols) before the model reads it; false = the exact text.
    pub normalize: bool,
    /// The name the Wyoming server announces itself under over mDNS (`_wyoming._tcp.local.`,
    /// as wyoming-piper's `--zeroconf`), so that Home Assistant finds it; `None` = no
    /// announcement (the default).
    pub zeroconf: Option<String>,
}

/// The entries of [`KEYS`].
type K = Key<Settings>;

/// The server's keys, one [`Key`] each (what adding one takes: docs/architecture.md, "Adding a
/// config key").
pub static KEYS: &[Key<Settings>] = &[
    K::new("server.bind", "\"127.0.0.1:8080\"", "HOST:PORT, e.g. \"127.0.0.1:8080\" or \"0.0.0.0:8080\"", |s, v| {
        let bind = v.text_or_invalid()?;
        if !valid_bind(&bind) {
            return Err(v.invalid_as("HOST:PORT, e.g. \"127.0.0.1:8080\" or \"0.0.0.0:8080\" (port 0 = any free port)"));
        }
        s.server.bind = bind;
        Ok(())
    })
    .env("COSY_BIND")
    .doc("Address and port the HTTP API listens on."),
    K::new("server.api_key", "\"\"", "a string (\"\" = no key)", |s, v| {
        // Not echoed in the message: it is a secret.
        let key = v.text().ok_or_else(|| v.refuse(&format!("invalid value; allowed: {}", v.allowed)))?;
        if key.chars().any(|c| c.is_control() || c == ' ') {
            return Err(v.refuse("the key has spaces or control characters; use printable characters only"));
        }
        s.server.api_key = (!key.is_empty()).then_some(key);
        Ok(())
    })
    .env("COSY_API_KEY")
    .doc("Bearer token every API call must carry (\"\": no authentication)."),
    K::new("server.retry_after_s", "1", "an integer from 1 to 3600", |s, v| {
        s.server.retry_after_s = v.int_in(1..=3600)?;
        Ok(())
    })
    .doc("The Retry-After of a 429, in seconds."),
    K::new("server.max_body_bytes", "16777216", "an integer from 1024 to 1073741824", |s, v| {
        s.server.max_body_bytes = v.int_in(1024..=1 << 30)?;
        Ok(())
    })
    .doc("Largest request body, in bytes."),
    K::new("server.request_timeout_s", "300", "an integer from 1 to 86400", |s, v| {
        s.server.request_timeout_s = v.int_in(1..=86_400)?;
        Ok(())
    })
    .doc("Longest a request may take, waiting included, in seconds."),
    K::new("server.header_timeout_s", "30", "an integer from 1 to 3600", |s, v| {
        s.server.header_timeout_s = v.int_in(1..=3600)?;
        Ok(())
    })
    .doc("Longest a client may take to send a request head, in seconds."),
    K::new("server.send_timeout_s", "30", "an integer from 1 to 3600", |s, v| {
        s.server.send_timeout_s = v.int_in(1..=3600)?;
        Ok(())
    })
    .doc("Longest one write may wait for the client, in seconds."),
    K::new("server.max_connections", "1024", "an integer from 1 to 1000000", |s, v| {
        s.server.max_connections = v.int_in(1..=1_000_000)?;
        Ok(())
    })
    .doc("Connections served at once."),
    K::new("server.shutdown_grace_s", "30", "an integer from 0 to 3600", |s, v| {
        s.server.shutdown_grace_s = v.int_in(0..=3600)?;
        Ok(())
    })
    .doc("After SIGTERM/SIGINT: how long in-flight requests may run."),
    K::new("server.warmup", "true", TRUE_FALSE, |s, v| {
        s.server.warmup = v.boolean()?;
        Ok(())
    })
    .doc("One short synthesis before /ready says yes."),
    K::new("server.default_format", "\"mp3\"", "a response format's name, e.g. \"mp3\" (the server lists the others)", |s, v| {
        s.server.default_format = v.text().map(|f| f.to_ascii_lowercase()).filter(|f| !f.is_empty()).ok_or_else(|| v.invalid())?;
        Ok(())
    })
    .doc("The response_format of a speech request that names none."),
    K::new("server.cors_origins", "\"\"", cors::ALLOWED, |s, v| {
        // Blank text means "not set" (the loopback default), as for every other key: an empty
        // shell variable must not switch browsers off. None is said as [] or "none".
        s.server.cors_origins = match v.text() {
            Some(t) if t.is_empty() => None,
            Some(t) if t.eq_ignore_ascii_case("none") => Some(Vec::new()),
            _ => Some(cors::origins_of(v.value).map_err(|why| v.invalid_as(&format!("{} ({why})", v.allowed)))?),
        };
        Ok(())
    })
    .doc("Web pages that may call the API and open the WebSocket (\"\": loopback pages on a loopback bind)."),
    K::new("server.public_listings", "false", TRUE_FALSE, |s, v| {
        s.server.public_listings = v.boolean()?;
        Ok(())
    })
    .doc("The listings answer without the API key."),
    K::new("server.web_ui", "true", TRUE_FALSE, |s, v| {
        s.server.web_ui = v.boolean()?;
        Ok(())
    })
    .doc("GET / serves the web page."),
    K::new("server.socket", "\"auto\"", "\"auto\" (the per-user socket), \"off\", or an absolute path", |s, v| {
        let text = v.text_or_invalid()?;
        s.server.socket = match text.trim() {
            "" | "auto" => SocketSetting::Auto,
            "off" => SocketSetting::Off,
            path if path.starts_with('/') => SocketSetting::Path(path.into()),
            _ => return Err(v.invalid()),
        };
        Ok(())
    })
    .doc("The local socket the same routes are also served on (\"\": auto)."),
    K::new(
        "wyoming.bind",
        "\"\"",
        "HOST:PORT, e.g. \"127.0.0.1:10200\" or \"0.0.0.0:10200\" (a bare port = the loopback; port 0 = any free port), or \"\" for none",
        |s, v| {
            let bind = v.text_or_invalid()?;
            s.wyoming.bind = if bind.is_empty() {
                None
            } else if bind.parse::<u16>().is_ok() {
                Some(format!("127.0.0.1:{bind}"))
            } else if valid_bind(&bind) {
                Some(bind)
            } else {
                return Err(v.invalid());
            };
            Ok(())
        },
    )
    .env("COSY_WYOMING")
    .doc("Address and port of the Wyoming server (\"\": none)."),
    K::new("wyoming.max_connections", "64", "an integer from 1 to 1000000", |s, v| {
        s.wyoming.max_connections = v.int_in(1..=1_000_000)?;
        Ok(())
    })
    .doc("Wyoming connections open at once."),
    K::new("wyoming.idle_timeout_s", "60", "an integer from 1 to 86400", |s, v| {
        s.wyoming.idle_timeout_s = v.int_in(1..=86_400)?;
        Ok(())
    })
    .doc("Longest a Wyoming connection may stay silent, in seconds."),
    K::new("wyoming.max_header_bytes", "65536", "an integer from 1024 to 16777216", |s, v| {
        s.wyoming.max_header_bytes = v.int_in(1024..=1 << 24)?;
        Ok(())
    })
    .doc("Longest Wyoming event header, in bytes."),
    K::new("wyoming.max_payload_bytes", "1048576", "an integer from 1024 to 1073741824", |s, v| {
        s.wyoming.max_payload_bytes = v.int_in(1024..=1 << 30)?;
        Ok(())
    })
    .doc("Largest data and payload of one Wyoming event, each, in bytes."),
    K::new("wyoming.normalize", "true", TRUE_FALSE, |s, v| {
        s.wyoming.normalize = v.boolean()?;
        Ok(())
    })
    .doc("Normalise streamed text sentence by sentence."),
    K::new("wyoming.zeroconf", "false", ZEROCONF_ALLOWED, |s, v| {
        s.wyoming.zeroconf = match v.boolean() {
            Ok(true) => Some(ZEROCONF_NAME.to_string()),
            Ok(false) => None,
            Err(_) => {
                let name = v.text_or_invalid()?;
                // A DNS-SD instance name is one DNS label: at most 63 bytes, printable.
                if name.len() > 63 || name.chars().any(char::is_control) {
                    return Err(v.invalid());
                }
                (!name.is_empty()).then_some(name)
            }
        };
        Ok(())
    })
    .env("COSY_WYOMING_ZEROCONF")
    .doc("Announce the Wyoming server over mDNS/zeroconf (_wyoming._tcp), under this name."),
    K::new(
        "say.server",
        "\"\"",
        "\"\" (a server on the per-user socket, if one runs), \"off\", a socket's absolute path, or http://HOST:PORT",
        |s, v| {
            let text = v.text_or_invalid()?;
            s.say.server = server_choice(text.trim()).ok_or_else(|| v.invalid())?;
            Ok(())
        },
    )
    .env("COSY_SERVER")
    .doc("The running cosy server `cosy say` and `cosy file` use (\"\": the per-user socket's, if any)."),
];

/// The name `wyoming.zeroconf = true` (and a bare `--zeroconf`) announces.
pub const ZEROCONF_NAME: &str = "cosy";
const ZEROCONF_ALLOWED: &str = "true (announce as \"cosy\"), false, or the name to announce (at most 63 bytes)";

/// A `say.server` value: "" or "auto", "off", `/a/socket`, or `http://HOST:PORT` (a trailing `/`
/// allowed; no path, no https: cosy serve speaks plain HTTP).
fn server_choice(text: &str) -> Option<ServerChoice> {
    Some(match text {
        "" | "auto" => ServerChoice::Auto,
        "off" => ServerChoice::Off,
        path if path.starts_with('/') => ServerChoice::Socket(path.into()),
        url => {
            let authority = url.strip_prefix("http://")?;
            let authority = authority.strip_suffix('/').unwrap_or(authority);
            if !valid_bind(authority) {
                return None;
            }
            ServerChoice::Http(authority.to_string())
        }
    })
}

/// `HOST:PORT` with a numeric port: an IP address, `[v6]`, or a host name such as `localhost`.
fn valid_bind(s: &str) -> bool {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    port.parse::<u16>().is_ok()
        && !host.is_empty()
        && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use cosy::config::{About, Config, LoadOptions};

    use super::*;

    fn config_toml() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config.toml")
    }

    /// Loads with the server's keys beside the library's, as `cosy` does.
    fn load(opts: &LoadOptions) -> cosy::Result<(Config, Settings)> {
        let mut settings = Settings::default();
        let config = Config::load_with(opts, &mut [&mut settings.keys()])?;
        Ok((config, settings))
    }

    fn flag(key: &str, value: &str) -> cosy::Result<Settings> {
        load(&LoadOptions { flags: vec![(key.into(), value.into())], ..LoadOptions::default() }).map(|(_, s)| s)
    }

    /// Every key of every table, as a file or `--set` writes it (one stage group, one alias).
    fn every_key() -> Vec<(&'static About, String)> {
        let groups: Vec<&str> = cosy::vocab::StageGroup::ALL.iter().map(|g| g.as_str()).collect();
        let family = format!("<{}>", groups.join("|"));
        cosy::config::KEYS
            .iter()
            .map(|k| &k.about)
            .chain(KEYS.iter().map(|k| &k.about))
            .flat_map(|a| match a.name.contains(&family) {
                true => groups.iter().map(|g| (a, a.name.replace(&family, g))).collect::<Vec<_>>(),
                false => vec![(a, a.name.replace("<name>", "alloy"))],
            })
            .collect()
    }

    #[test]
    fn the_committed_config_toml_is_valid_and_equals_the_defaults() {
        let file = config_toml();
        let (c, settings) = load(&LoadOptions { config_file: Some(file.clone()), ..Default::default() }).unwrap();
        assert_eq!(settings, Settings::default(), "config.toml documents exactly the server's built-in defaults");
        // Paths in the file are relative to it.
        let mut d = Config { model_dir: file.parent().unwrap().join("models/cosyvoice3"), ..Default::default() };
        // The caches are in the user's cache folder, never relative to the current folder.
        assert!(d.runtime.engine_cache.is_absolute() && d.runtime.engine_cache.ends_with("cosy/engines"), "{d:?}");
        d.voices.dir = file.parent().unwrap().join("voices");
        d.source_file = Some(file.clone());
        // Where each value came from is not a value: `sources` differ, the configurations are equal.
        assert_eq!(c, d, "config.toml documents exactly the built-in defaults");
        assert_eq!(c.sources.config_file, "named by --config");
        let text = std::fs::read_to_string(&file).unwrap();
        let line = text.lines().position(|l| l.starts_with("dir = \"models/")).unwrap() + 1;
        assert_eq!(c.source_of("model.dir"), format!("set by {}:{line}", file.display()));
        let line = text.lines().position(|l| l.starts_with("bind = \"127.0.0.1:8080\"")).unwrap() + 1;
        assert_eq!(c.source_of("server.bind"), format!("set by {}:{line}", file.display()), "one record of sources");
    }

    /// config.toml is the documented list of keys ("every key is shown with its built-in
    /// default"): each key of each table is there, set to the table's default or shown commented
    /// out (`# key = example`), with its variable. A check rather than a generated file: the
    /// file's prose (why, when, measured costs) is more than a key table holds, and a missing key
    /// fails here by name.
    #[test]
    fn config_toml_documents_every_key_with_its_default_and_variable() {
        let text = std::fs::read_to_string(config_toml()).unwrap();
        let mut section = String::new();
        let mut documented: BTreeMap<String, (String, bool)> = BTreeMap::new();
        let mut tables = Vec::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_string();
                tables.push(section.clone());
            } else if let Some((key, value)) = line.split_once(" = ") {
                let (key, commented) = match key.strip_prefix('#') {
                    Some(k) => (k.trim(), true),
                    None => (key.trim(), false),
                };
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    documented.insert(format!("{section}.{key}"), (value.trim().to_string(), commented));
                }
            }
        }
        for (about, key) in every_key() {
            if let Some(table) = about.name.strip_suffix(".<name>") {
                assert!(tables.iter().any(|t| t == table), "config.toml has no [{table}] for {}", about.name);
                continue;
            }
            let Some((value, commented)) = documented.get(&key) else { panic!("config.toml does not document {key}") };
            if let (Some(default), false) = (about.default, commented) {
                assert_eq!(value, default, "config.toml shows {key} with another value than its built-in default");
            }
            if let Some(var) = about.env {
                assert!(text.contains(var), "config.toml does not name {var} ({key})");
            }
        }
    }

    /// No accepted empty value changes the mode (as the library's keys, tests/fuzz.rs): an empty
    /// or blank value, as `--set KEY=` or its variable, is refused naming the key, or it is the
    /// built-in default.
    #[test]
    fn no_accepted_empty_value_changes_the_mode() {
        for value in ["", "  "] {
            for about in KEYS.iter().map(|k| &k.about) {
                match flag(about.name, value) {
                    Ok(s) => assert_eq!(s, Settings::default(), "--set {}={value:?} changed the settings", about.name),
                    Err(e) => assert!(e.to_string().contains(about.name), "--set {}={value:?}: {e}", about.name),
                }
                let Some(var) = about.env else { continue };
                match load(&LoadOptions { env: vec![(var.into(), value.into())], ..LoadOptions::default() }) {
                    Ok((_, s)) => assert_eq!(s, Settings::default(), "{var}={value:?} changed the settings"),
                    Err(e) => assert!(e.to_string().contains(var), "{var}={value:?}: {e}"),
                }
            }
        }
    }

    /// `[wyoming]` is off unless set; a bare port is the loopback; `""` is off again.
    #[test]
    fn the_wyoming_address_is_off_unless_set_and_a_bare_port_is_the_loopback() {
        assert_eq!(Settings::default().wyoming.bind, None);
        let bind = |value: &str| flag("wyoming.bind", value).map(|s| s.wyoming.bind);
        assert_eq!(bind("10200").unwrap().as_deref(), Some("127.0.0.1:10200"));
        assert_eq!(bind("0.0.0.0:10200").unwrap().as_deref(), Some("0.0.0.0:10200"));
        assert_eq!(bind("").unwrap(), None);
        let (_, s) = load(&LoadOptions { env: vec![("COSY_WYOMING".into(), "[::1]:10200".into())], ..Default::default() }).unwrap();
        assert_eq!(s.wyoming.bind.as_deref(), Some("[::1]:10200"));
        assert!(bind("70000").is_err() && bind("host:").is_err());
    }

    /// `wyoming.zeroconf` is off unless set; `true` (and `--zeroconf` alone) is the name "cosy".
    #[test]
    fn the_zeroconf_announcement_is_off_unless_set() {
        assert_eq!(Settings::default().wyoming.zeroconf, None);
        let zeroconf = |value: &str| flag("wyoming.zeroconf", value).map(|s| s.wyoming.zeroconf);
        assert_eq!(zeroconf("true").unwrap().as_deref(), Some(ZEROCONF_NAME));
        assert_eq!(zeroconf("false").unwrap(), None);
        assert_eq!(zeroconf("").unwrap(), None);
        assert_eq!(zeroconf("kitchen cosy").unwrap().as_deref(), Some("kitchen cosy"));
        let m = zeroconf(&"x".repeat(64)).expect_err("too long").to_string();
        assert!(m.contains("at most 63 bytes"), "{m}");
        let (_, s) = load(&LoadOptions { env: vec![("COSY_WYOMING_ZEROCONF".into(), "piper-like".into())], ..Default::default() }).unwrap();
        assert_eq!(s.wyoming.zeroconf.as_deref(), Some("piper-like"));
    }

    #[test]
    fn bad_values_are_refused_with_key_value_and_allowed_set() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("cosy.toml");
        for (text, key_value, allowed) in [
            ("[wyoming]\nbind = \"home assistant\"\n", "wyoming.bind", "HOST:PORT"),
            ("[wyoming]\nmax_header_bytes = 10\n", "wyoming.max_header_bytes = 10", "1024 to"),
            ("[wyoming]\nmax_connections = 0\n", "wyoming.max_connections = 0", "from 1 to"),
            ("[server]\nbind = \"nowhere\"\n", "cosy.toml:2: server.bind = \"nowhere\"", "(port 0 = any free port)"),
            ("[server]\nretry_after_s = 0\n", "server.retry_after_s = 0", "an integer from 1 to 3600"),
            ("[server]\nwarmup = \"maybe\"\n", "server.warmup", "true, false"),
            ("[server]\nbinds = \"x\"\n", "server.binds", "unknown key; known keys: model.dir"),
        ] {
            std::fs::write(&file, text).unwrap();
            let m = load(&LoadOptions { config_file: Some(file.clone()), ..Default::default() }).expect_err(text).to_string();
            assert!(m.contains(key_value) && m.contains(allowed), "{text}: {m}");
            assert!(m.contains(&file.display().to_string()), "names the file: {m}");
        }
        let e = flag("server.api_key", "two words").expect_err("a space").to_string();
        assert!(e.ends_with("flag server.api_key: server.api_key: the key has spaces or control characters; use printable characters only"), "{e}");
        let m = load(&LoadOptions { env: vec![("COSY_BINDS".into(), "x".into())], ..Default::default() }).expect_err("unknown").to_string();
        assert!(m.contains("known: COSY_MODEL") && m.contains("COSY_BIND, COSY_API_KEY, COSY_WYOMING, COSY_WYOMING_ZEROCONF, COSY_SERVER, COSY_CONFIG, COSY_LOG"), "{m}");
    }

    #[test]
    fn cors_origins_are_checked() {
        for (value, needle) in
            [("app.example.com", "no scheme"), ("https://a.example/path", "not an origin"), ("*, https://a.example", "alone")]
        {
            let e = flag("server.cors_origins", value).expect_err(value).to_string();
            assert!(e.contains("server.cors_origins") && e.contains(needle), "{value}: {e}");
        }
        let s = flag("server.cors_origins", "HTTPS://App.Example.com/, http://localhost:3000").unwrap();
        assert_eq!(s.server.cors_origins, Some(vec!["https://app.example.com".to_string(), "http://localhost:3000".to_string()]));
        // "" is "not set" (an empty shell variable must not switch browsers off); none is "none" or [].
        assert_eq!(flag("server.cors_origins", "").unwrap().server.cors_origins, None);
        assert_eq!(flag("server.cors_origins", "none").unwrap().server.cors_origins, Some(vec![]));
        assert_eq!(Settings::default().server.cors_origins, None);
    }

    /// `cosy serve --bind`: a flag of its own, recorded as one.
    #[test]
    fn a_later_setting_of_a_server_key_is_recorded_with_the_others() {
        let (mut config, mut settings) = load(&LoadOptions::default()).unwrap();
        let origin = cosy::config::Origin::Flag("--bind".into());
        let value = cosy::config::RawValue::Text("0.0.0.0:9000".into());
        config.set_with(&mut [&mut settings.keys()], "server.bind", &value, &origin, None).unwrap();
        assert_eq!(settings.server.bind, "0.0.0.0:9000");
        assert_eq!(config.source_of("server.bind"), "set by flag --bind");
        let value = cosy::config::RawValue::Text("nonsense".into());
        let e = config.set_with(&mut [&mut settings.keys()], "server.bind", &value, &origin, None).unwrap_err().to_string();
        assert!(e.contains("flag --bind: server.bind = \"nonsense\": invalid value; allowed: HOST:PORT"), "{e}");
    }
}
