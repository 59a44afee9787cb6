//! The operators' console: static files under `/admin/ui/`, compiled into
//! the binary.
//!
//! The page is plain HTML, CSS and JavaScript modules written by hand
//! (`src/admin/ui/`): no build step, no CDN, nothing fetched at run time
//! but the admin API of the listener that served it. The files hold no
//! data, so they need no token; the page asks for the admin token, keeps
//! it in `sessionStorage` (gone when the tab closes; never in a URL or a
//! cookie, so no other request carries it) and sends it as a bearer token
//! on every API call.
//!
//! Files are looked up by exact name in [`FILES`]: there is no file system
//! behind the path, so no traversal. Every answer here, a miss included,
//! carries [`CSP`] (no inline script or style, nothing from elsewhere, no
//! framing), `X-Content-Type-Options: nosniff` and `Cache-Control:
//! no-cache` (a browser revalidates, so an upgraded binary's page is the
//! one shown). `/admin/ui` redirects to `/admin/ui/`, so the page's
//! relative links resolve under it.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::gateway::problem::Problem;
use crate::http::body::{BoxedBody, full};

/// The Content-Security-Policy of every console response.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every console file: (name after `/admin/ui/`, Content-Type, bytes).
pub const FILES: &[(&str, &str, &str)] = &[
    ("", HTML, include_str!("ui/index.html")),
    ("console.css", CSS, include_str!("ui/console.css")),
    ("console.js", JS, include_str!("ui/console.js")),
    ("api.js", JS, include_str!("ui/api.js")),
    ("view.js", JS, include_str!("ui/view.js")),
    ("gateway.js", JS, include_str!("ui/gateway.js")),
    ("outbox.js", JS, include_str!("ui/outbox.js")),
];

/// Answers `GET /admin/ui/{name}` (`Some`) or `GET /admin/ui` (`None`).
pub(super) fn answer(name: Option<&str>) -> Response<BoxedBody> {
    let mut response = match name {
        None => {
            let mut response = Response::new(full(Bytes::new()));
            *response.status_mut() = StatusCode::PERMANENT_REDIRECT;
            response.headers_mut().insert(header::LOCATION, HeaderValue::from_static("/admin/ui/"));
            response
        }
        Some(name) => match FILES.iter().find(|(file, _, _)| *file == name) {
            Some(&(_, content_type, text)) => {
                let mut response = Response::new(full(Bytes::from_static(text.as_bytes())));
                response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
                response
            }
            None => Problem::NotFound.to_response(),
        },
    };
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_served_with_its_type_and_the_security_headers() {
        for &(name, content_type, text) in FILES {
            let response = answer(Some(name));
            assert_eq!(response.status(), StatusCode::OK, "{name}");
            assert_eq!(response.headers()[header::CONTENT_TYPE], *content_type, "{name}");
            assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], CSP, "{name}");
            assert_eq!(response.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{name}");
            assert!(!text.is_empty(), "{name}");
        }
    }

    #[test]
    fn an_unknown_or_traversing_name_is_not_found_and_still_carries_the_policy() {
        for name in ["index.html", "../Cargo.toml", "%2e%2e%2fCargo.toml", "console.js.map", "CONSOLE.JS"] {
            let response = answer(Some(name));
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{name}");
            assert_eq!(response.headers()[header::CONTENT_SECURITY_POLICY], CSP, "{name}");
        }
    }

    #[test]
    fn the_bare_path_redirects_to_the_page() {
        let response = answer(None);
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(response.headers()[header::LOCATION], "/admin/ui/");
    }

    /// The page must work under the CSP: no inline script, style or handler.
    #[test]
    fn no_file_holds_inline_script_or_style() {
        let (_, _, page) = FILES[0];
        assert!(!page.contains("<script>") && !page.contains("style="), "inline code in index.html");
        for &(name, _, text) in FILES {
            assert!(!text.contains(" onclick=") && !text.contains("javascript:"), "{name}");
            assert!(!text.contains("innerHTML") && !text.contains("outerHTML"), "{name}: use textContent");
            assert!(!text.contains("http://") && !text.contains("https://"), "{name}: nothing from elsewhere");
        }
    }
}
