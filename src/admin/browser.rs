//! What keeps web pages out of an admin listener that has no token
//! (`admin.auth = "disabled"`, loopback only).
//!
//! Loopback is no defence against the operator's own browser: any page it
//! opens can send requests to `127.0.0.1:9090`. Two attacks follow, and
//! each has its check:
//! - **DNS rebinding**: a page on `attacker.example` re-points its name at
//!   127.0.0.1 and then reads and writes the listener as its own origin.
//!   The browser still sends `Host: attacker.example:9090`, so every
//!   request whose `Host` (or HTTP/2 `:authority`) is not the listener's
//!   own name — `localhost`, `127.0.0.1`, `[::1]` or the bound address,
//!   with its port — is refused.
//! - **Cross-site requests** (CSRF): a page posts a form or a `no-cors`
//!   fetch to the listener; it cannot read the answer, but a purge or a
//!   redrive would be done. A state-changing request (any method but
//!   `GET`/`HEAD`) that carries an `Origin` other than the listener's own,
//!   or `Sec-Fetch-Site: cross-site`/`same-site`, is refused.
//!
//! Tools (`curl`, scripts, Prometheus) send no `Origin` and the listener's
//! own `Host`, and pass. With a token nothing here applies: a browser never
//! adds the bearer token by itself.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::header::{HOST, ORIGIN};
use http::{HeaderMap, Method, Uri};

use crate::gateway::problem::Problem;

static SEC_FETCH_SITE: http::HeaderName = http::HeaderName::from_static("sec-fetch-site");

/// `Ok` when the request is addressed to the listener by its own name and,
/// when it changes state, comes from no other site.
pub(super) fn admit(method: &Method, uri: &Uri, headers: &HeaderMap, own: SocketAddr) -> Result<(), Problem> {
    let host = headers.get(HOST).map(|v| v.to_str().unwrap_or("\u{0}"));
    let authority = uri.authority().map(|a| a.as_str());
    if host.is_none() && authority.is_none() {
        return Err(Problem::ForeignRequest("it names no Host"));
    }
    if [host, authority].into_iter().flatten().any(|name| !is_own(name, own)) {
        return Err(Problem::ForeignRequest("its Host is not this listener's own address or name"));
    }
    if *method == Method::GET || *method == Method::HEAD {
        return Ok(());
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let own_origin =
            origin.to_str().ok().and_then(|o| o.strip_prefix("http://")).is_some_and(|name| is_own(name, own));
        if !own_origin {
            return Err(Problem::ForeignRequest("it changes state and its Origin is another site"));
        }
    }
    let fetch_site = headers.get(&SEC_FETCH_SITE).map(|v| v.as_bytes().to_ascii_lowercase());
    if matches!(fetch_site.as_deref(), Some(b"cross-site" | b"same-site")) {
        return Err(Problem::ForeignRequest("it changes state and was sent by another site (Sec-Fetch-Site)"));
    }
    Ok(())
}

/// Whether `name` (`host[:port]`) is the listener: a loopback name or the
/// bound address, with the bound port (or none, if that is 80).
fn is_own(name: &str, own: SocketAddr) -> bool {
    let (host, port) = match name.rsplit_once(':') {
        Some((host, port)) if !name.ends_with(']') => match port.parse::<u16>() {
            Ok(port) => (host, port),
            Err(_) => return false,
        },
        _ => (name, 80),
    };
    if port != own.port() {
        return false;
    }
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    };
    ip.is_some_and(|ip| {
        ip == own.ip() || ip == IpAddr::V4(Ipv4Addr::LOCALHOST) || ip == IpAddr::V6(Ipv6Addr::LOCALHOST)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWN: &str = "127.0.0.1:9090";

    fn request(method: Method, pairs: &[(&'static str, &str)]) -> Result<(), Problem> {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, value.parse().unwrap());
        }
        admit(&method, &Uri::from_static("/admin/outbox/redrive"), &headers, OWN.parse().unwrap())
    }

    #[test]
    fn the_listeners_own_names_with_its_port_are_its_own() {
        let own: SocketAddr = OWN.parse().unwrap();
        for name in ["127.0.0.1:9090", "localhost:9090", "LOCALHOST:9090", "[::1]:9090"] {
            assert!(is_own(name, own), "{name}");
        }
        for name in [
            "attacker.example:9090",
            "127.0.0.1:9091",
            "127.0.0.1",
            "localhost",
            "::1:9090",
            "[127.0.0.1]:9090",
            "127.0.0.2:9090",
            "",
        ] {
            assert!(!is_own(name, own), "{name}");
        }
        assert!(is_own("[::1]:9090", "[::1]:9090".parse().unwrap()));
        assert!(is_own("localhost", "127.0.0.1:80".parse().unwrap()), "port 80 may go unnamed");
        assert!(is_own("127.0.0.5:9090", "127.0.0.5:9090".parse().unwrap()), "the bound address");
    }

    #[test]
    fn a_foreign_host_is_refused_whatever_the_method() {
        for method in [Method::GET, Method::POST, Method::DELETE] {
            assert!(request(method.clone(), &[("host", "attacker.example:9090")]).is_err(), "{method}");
            assert!(request(method.clone(), &[("host", "127.0.0.1:9090")]).is_ok(), "{method}");
        }
        assert!(request(Method::GET, &[]).is_err(), "no Host at all");
    }

    #[test]
    fn a_state_change_from_another_site_is_refused_and_from_its_own_page_allowed() {
        let host = ("host", "127.0.0.1:9090");
        assert!(request(Method::POST, &[host, ("origin", "https://attacker.example")]).is_err());
        assert!(request(Method::POST, &[host, ("origin", "null")]).is_err());
        assert!(request(Method::DELETE, &[host, ("sec-fetch-site", "cross-site")]).is_err());
        assert!(request(Method::DELETE, &[host, ("sec-fetch-site", "same-site")]).is_err());
        assert!(
            request(Method::POST, &[host, ("origin", "http://127.0.0.1:9090"), ("sec-fetch-site", "same-origin")])
                .is_ok()
        );
        assert!(request(Method::POST, &[host, ("origin", "http://localhost:9090")]).is_ok());
        assert!(request(Method::POST, &[host]).is_ok(), "curl sends no Origin");
        assert!(
            request(Method::GET, &[host, ("origin", "https://attacker.example")]).is_ok(),
            "reads change nothing, and the page cannot read the answer"
        );
    }
}
