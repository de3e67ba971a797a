//! The Wyoming server's mDNS/DNS-SD announcement (`wyoming.zeroconf`): one `_wyoming._tcp.local.`
//! service, as wyoming-piper's `--zeroconf` registers (`NAME._wyoming._tcp.local.` on the server's
//! port, no TXT records), so that Home Assistant's zeroconf discovery offers it. The responder is
//! `mdns_sd`'s daemon thread; dropping the [`Announcement`] says goodbye and stops it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use mdns_sd::{IfKind, ServiceDaemon, ServiceInfo};

/// The DNS-SD service type Home Assistant browses for Wyoming services.
pub const SERVICE_TYPE: &str = "_wyoming._tcp.local.";

/// A registered announcement; dropped, it is withdrawn.
pub struct Announcement {
    daemon: ServiceDaemon,
    fullname: String,
}

fn zeroconf_error(e: impl std::fmt::Display) -> cosy::Error {
    cosy::Error::Runtime(format!("wyoming.zeroconf: cannot announce the Wyoming server over mDNS: {e}"))
}

/// This machine's host name as an mDNS host (`NAME.local.`).
fn mdns_host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let label: String = name.trim().split('.').next().unwrap_or_default().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    format!("{}.local.", if label.is_empty() { "cosy" } else { &label })
}

impl Announcement {
    /// Announces the Wyoming server listening on `addr` as `name`. Bound to every address
    /// (`0.0.0.0`, `::`) it announces each interface's own; bound to one, that one (a loopback
    /// address only on the loopback interfaces: only this machine can reach it).
    pub fn start(name: &str, addr: SocketAddr) -> Result<Announcement, cosy::Error> {
        let daemon = ServiceDaemon::new().map_err(zeroconf_error)?;
        let ip = addr.ip();
        let info = if ip.is_unspecified() {
            ServiceInfo::new(SERVICE_TYPE, name, &mdns_host_name(), "", addr.port(), &[] as &[(&str, &str)]).map(ServiceInfo::enable_addr_auto)
        } else {
            ServiceInfo::new(SERVICE_TYPE, name, &mdns_host_name(), ip, addr.port(), &[] as &[(&str, &str)])
        }
        .map_err(zeroconf_error)?;
        if ip.is_loopback() {
            let kind = match ip {
                IpAddr::V4(_) => IfKind::LoopbackV4,
                IpAddr::V6(_) => IfKind::LoopbackV6,
            };
            daemon.enable_interface(kind).map_err(zeroconf_error)?;
            tracing::warn!("wyoming.zeroconf: the Wyoming server listens on the loopback ({addr}); only this machine can find and reach it");
        }
        let fullname = info.get_fullname().to_string();
        daemon.register(info).map_err(zeroconf_error)?;
        tracing::info!("wyoming: announced over mDNS as {fullname} (port {})", addr.port());
        Ok(Announcement { daemon, fullname })
    }
}

impl Drop for Announcement {
    fn drop(&mut self) {
        // The goodbye packets go out before the daemon stops (bounded: shutting down never waits
        // long for the network).
        if let Ok(done) = self.daemon.unregister(&self.fullname) {
            let _ = done.recv_timeout(Duration::from_secs(1));
        }
        if let Ok(done) = self.daemon.shutdown() {
            let _ = done.recv_timeout(Duration::from_secs(1));
        }
    }
}
