//! What a request to a destination is made of, and which headers may not
//! be part of it. Pure: config validation and the publisher share it, so
//! what `check-config` accepts is what the relay sends.
//!
//! A [`Target`] is a destination's configured URL, method and headers,
//! checked once:
//!
//! - credentials in the URL (`https://user:password@host/…`, percent-decoded)
//!   become an `Authorization: Basic` header, and the URL the request is
//!   sent to carries no user info (it would otherwise reach the `Host`
//!   header). A destination that also configures its own `Authorization`
//!   is refused as ambiguous;
//! - a configured header that frames the body or describes one connection
//!   ([`reserved_header`]) is refused, and so is one given twice in
//!   different cases (`Authorization` and `authorization`).
//!
//! A message's own headers (given at enqueue) are checked again at every
//! publish ([`Target::request`]): a row enqueued before `enqueue` refused
//! such headers, or written by other means, must never reach the wire with
//! a `Content-Length` that truncates its body or a `Host` that re-targets
//! it. Such a row is refused, and the relay buries it with the reason.

use base64::Engine;
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

use super::super::claim::Claimed;
use crate::config::{DestinationConfig, ServiceUrl};
use crate::http::body::{ResponseBody, full};
use crate::idempotency::key::IDEMPOTENCY_KEY;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
use crate::outbox::enqueue::reserved_header;

/// A destination's request template: where, how, and the headers every
/// request to it carries.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL, without user info.
    pub uri: Uri,
    /// The method.
    pub method: Method,
    /// The configured headers, and `Authorization` from the URL's credentials.
    pub headers: HeaderMap,
}

impl Target {
    /// Checks a destination's URL, method and headers. Errors name the
    /// field and print the URL with its password redacted.
    pub fn from_config(config: &DestinationConfig) -> Result<Self, String> {
        let shown = || ServiceUrl::new(config.url.as_str()).redacted();
        let uri: Uri = config.url.parse().map_err(|e| format!("url {:?} is not a URL: {e}", shown()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
            return Err(format!("url {:?} must be an http:// or https:// URL with a host", shown()));
        }
        let (uri, credentials) = split_credentials(uri).map_err(|e| format!("url {:?}: {e}", shown()))?;
        let method = config.method.as_deref().unwrap_or("POST");
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| format!("{method:?} is not an HTTP method"))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a valid header name"))?;
            if let Some(why) = reserved_header(name).filter(|_| header != HOST) {
                return Err(format!("headers must not set {name}: {why}"));
            }
            if headers.contains_key(&header) {
                return Err(format!("headers set {header} twice (names are not case-sensitive)"));
            }
            let mut value =
                HeaderValue::from_str(value).map_err(|_| format!("header {name:?} has an invalid value"))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        if let Some(credentials) = credentials {
            if headers.contains_key(AUTHORIZATION) {
                return Err(format!(
                    "url {:?} carries credentials and headers set Authorization too: keep one of them",
                    shown()
                ));
            }
            headers.insert(AUTHORIZATION, credentials);
        }
        Ok(Self { uri, method, headers })
    }

    /// The request for one message: the configured headers, then the
    /// message's own (which may override them), the row's trace context as
    /// a new span (`traceparent`, `tracestate`: they override both),
    /// `Content-Type: application/json` unless set, and the derived
    /// `Idempotency-Key`.
    /// A message header that [`reserved_header`] names, or that is not a
    /// valid header, refuses the whole message.
    pub fn request(&self, message: &Claimed) -> Result<Request<ResponseBody>, String> {
        let mut headers = self.headers.clone();
        for (name, value) in &message.headers {
            if let Some(why) = reserved_header(name) {
                return Err(format!("message header {} is refused: {why}", quoted(name)));
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("message header {} is not a valid header name", quoted(name)))?;
            let value =
                HeaderValue::from_str(value).map_err(|_| format!("message header {header} has an invalid value"))?;
            headers.insert(header, value);
        }
        if let Some(trace) = &message.trace {
            // A new span of the row's trace for each attempt; a tracestate
            // among the message's headers belongs to another context.
            let traceparent = HeaderValue::from_str(&trace.child()).map_err(|_| "traceparent is not a header value")?;
            headers.insert(TRACEPARENT, traceparent);
            headers.remove(TRACESTATE);
            if let Some(state) = trace.tracestate() {
                let state = HeaderValue::from_str(state).map_err(|_| "tracestate is not a header value")?;
                headers.insert(TRACESTATE, state);
            }
        }
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let key = HeaderValue::from_str(&message.derived_key).map_err(|_| "derived key is not a header value")?;
        headers.insert(&IDEMPOTENCY_KEY, key);
        let mut request = Request::builder()
            .method(self.method.clone())
            .uri(self.uri.clone())
            .body(full(Bytes::from(message.payload.clone())))
            .map_err(|e| e.to_string())?;
        *request.headers_mut() = headers;
        Ok(request)
    }
}

/// A name from a message, quoted and escaped as Rust does, at most 64 characters of it.
fn quoted(name: &str) -> String {
    format!("{:?}", name.chars().take(64).collect::<String>())
}

/// `uri` without its user info, and the `Authorization: Basic` value the
/// user info stands for (none when it is absent or empty).
fn split_credentials(uri: Uri) -> Result<(Uri, Option<HeaderValue>), String> {
    let Some((userinfo, host)) = uri.authority().and_then(|a| a.as_str().rsplit_once('@')) else {
        return Ok((uri, None));
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|decoded| decoded.into_owned())
            .map_err(|_| "its user info is not UTF-8 once percent-decoded".to_string())
    };
    let (user, password) = (decode(user)?, decode(password)?);
    if user.contains(':') {
        return Err(
            "the user name may not contain ':' (Basic authentication could not tell it from the password)".into()
        );
    }
    let authority = Authority::try_from(host).map_err(|e| e.to_string())?;
    let mut parts = uri.into_parts();
    parts.authority = Some(authority);
    parts.path_and_query = Some(parts.path_and_query.unwrap_or_else(|| PathAndQuery::from_static("/")));
    let uri = Uri::from_parts(parts).map_err(|e| e.to_string())?;
    if user.is_empty() && password.is_empty() {
        return Ok((uri, None));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).map_err(|e| e.to_string())?;
    value.set_sensitive(true);
    Ok((uri, Some(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target, String> {
        Target::from_config(&DestinationConfig::new(url))
    }

    fn message(headers: &[(&str, &str)]) -> Claimed {
        Claimed {
            fence: crate::outbox::claim::ClaimFence { id: 1, attempts: 1 },
            attempt: 1,
            derived_key: "k".repeat(64),
            destination: "email".into(),
            operation: "notify".into(),
            business_key: "order:1".into(),
            payload: String::from("{\"n\":1}").into(),
            headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
            ordering_key: None,
            trace: None,
        }
    }

    #[test]
    fn the_rows_trace_context_replaces_trace_headers_of_the_message_with_a_new_span() {
        use crate::http::trace_context::{TraceContext, trace_id};
        let stale = [("traceparent", "00-11111111111111111111111111111111-2222222222222222-01"), ("tracestate", "x=1")];
        let target = target("http://127.0.0.1:1/").unwrap();
        // Without a context of its own, a row's headers pass as given (rows enqueued before migration 7).
        let untraced = target.request(&message(&stale)).unwrap();
        assert_eq!(untraced.headers()[TRACEPARENT], stale[0].1);
        let mut traced = message(&stale);
        traced.trace = TraceContext::parse(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None);
        let request = target.request(&traced).unwrap();
        let sent = request.headers()[TRACEPARENT].to_str().unwrap();
        assert_eq!(trace_id(sent.as_bytes()), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        assert!(!sent.contains("00f067aa0ba902b7"), "{sent}");
        assert!(request.headers().get(TRACESTATE).is_none());
    }

    #[test]
    fn credentials_in_the_url_become_basic_auth_and_leave_the_uri() {
        let target = target("https://alice:s3cr%40t@api.example.com:8443/v1/send?x=1").unwrap();
        assert_eq!(target.uri, "https://api.example.com:8443/v1/send?x=1");
        // base64("alice:s3cr@t")
        assert_eq!(target.headers[AUTHORIZATION], "Basic YWxpY2U6czNjckB0");
        assert!(target.headers[AUTHORIZATION].is_sensitive());
    }

    #[test]
    fn a_user_without_a_password_is_sent_with_an_empty_one_and_empty_user_info_with_nothing() {
        assert_eq!(target("http://alice@h/").unwrap().headers[AUTHORIZATION], "Basic YWxpY2U6");
        let bare = target("http://@h").unwrap();
        assert_eq!((bare.uri.to_string().as_str(), bare.headers.get(AUTHORIZATION)), ("http://h/", None));
    }

    #[test]
    fn credentials_and_a_configured_authorization_are_ambiguous() {
        let mut config = DestinationConfig::new("https://alice:s3cret@h/send");
        config.headers.insert("Authorization".into(), "Bearer x".into());
        let error = Target::from_config(&config).unwrap_err();
        assert!(error.contains("Authorization") && error.contains("alice:[redacted]@h"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn url_errors_never_print_the_password() {
        for url in ["ftp://alice:s3cret@h/", "https://alice:s3cret@h/a b"] {
            let error = target(url).unwrap_err();
            assert!(!error.contains("s3cret") && error.contains("[redacted]"), "{error}");
        }
        assert!(target("http://a%3Ab:pw@h/").unwrap_err().contains("':'"));
    }

    #[test]
    fn configured_framing_and_hop_by_hop_headers_are_refused_but_host_is_the_operators_choice() {
        for name in ["Content-Length", "transfer-encoding", "connection", "upgrade", "proxy-authorization", "TE"] {
            let mut config = DestinationConfig::new("http://h/");
            config.headers.insert(name.into(), "1".into());
            assert!(Target::from_config(&config).is_err(), "{name}");
        }
        let mut config = DestinationConfig::new("http://10.0.0.1/");
        config.headers.insert("host".into(), "api.internal".into());
        assert_eq!(Target::from_config(&config).unwrap().headers[HOST], "api.internal");
    }

    #[test]
    fn a_header_configured_twice_in_two_cases_is_refused() {
        let mut config = DestinationConfig::new("http://h/");
        config.headers.insert("X-Tenant".into(), "a".into());
        config.headers.insert("x-tenant".into(), "b".into());
        assert!(Target::from_config(&config).unwrap_err().contains("twice"));
    }

    #[test]
    fn every_framing_hop_by_hop_or_key_header_of_a_message_refuses_it() {
        let target = target("http://h/send").unwrap();
        for name in [
            "content-length",
            "Transfer-Encoding",
            "host",
            "connection",
            "keep-alive",
            "te",
            "trailer",
            "upgrade",
            "proxy-connection",
            "Proxy-Authorization",
            "idempotency-key",
        ] {
            let error = target.request(&message(&[(name, "5")])).unwrap_err();
            assert!(error.contains(&format!("{name:?}")) && error.contains("refused"), "{error}");
        }
    }

    #[test]
    fn a_message_header_name_is_escaped_in_the_refusal() {
        let error = target("http://h/").unwrap().request(&message(&[("x\nforged: 1", "v")])).unwrap_err();
        assert!(!error.contains('\n'), "{error}");
    }

    #[test]
    fn a_request_carries_the_template_the_message_headers_and_the_derived_key_last() {
        let mut config = DestinationConfig::new("http://alice:pw@h:9/send");
        config.headers.insert("x-region".into(), "eu".into());
        let target = Target::from_config(&config).unwrap();
        let request = target.request(&message(&[("x-region", "us"), ("content-type", "text/plain")])).unwrap();
        assert_eq!(request.uri(), "http://h:9/send");
        let headers = request.headers();
        assert_eq!(headers["x-region"], "us", "a message header overrides the destination's");
        assert_eq!(headers[CONTENT_TYPE], "text/plain");
        assert_eq!(headers[&IDEMPOTENCY_KEY], "k".repeat(64).as_str());
        assert_eq!(headers[AUTHORIZATION], "Basic YWxpY2U6cHc=");
        assert!(!headers.contains_key(HOST), "the client sets Host from the clean URI");
    }
}
