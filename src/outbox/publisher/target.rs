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
use crate::http::body::{BoxedBody, full};
use crate::idempotency::key::IDEMPOTENCY_KEY;

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
use crate::outbox::enqueue::reserved_header;

/// Why a destination's URL, method or headers are refused; names the
/// field, and prints the URL with its password redacted.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Not a URI.
    #[error("url {shown:?} is not a URL: {source}")]
    NotAUrl {
        /// The URL, redacted.
        shown: String,
        /// Why.
        #[source]
        source: http::uri::InvalidUri,
    },
    /// Not `http://` or `https://` with a host.
    #[error("url {0:?} must be an http:// or https:// URL with a host")]
    Scheme(String),
    /// Its user info cannot be a `Basic` credential.
    #[error("url {shown:?}: {source}")]
    Credentials {
        /// The URL, redacted.
        shown: String,
        /// Why.
        #[source]
        source: CredentialsError,
    },
    /// The method is not one.
    #[error("{0:?} is not an HTTP method")]
    Method(String),
    /// A header name that is not one.
    #[error("{0:?} is not a valid header name")]
    HeaderName(String),
    /// A header the relay sets or that frames the body.
    #[error("headers must not set {name}: {why}")]
    Reserved {
        /// The header.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A header given twice in different cases.
    #[error("headers set {0} twice (names are not case-sensitive)")]
    Twice(HeaderName),
    /// A header value that is not one.
    #[error("header {0:?} has an invalid value")]
    HeaderValue(String),
    /// Credentials in the URL and an `Authorization` header.
    #[error("url {0:?} carries credentials and headers set Authorization too: keep one of them")]
    TwoCredentials(String),
}

/// Why the user info of a URL cannot become an `Authorization: Basic` header.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// Not UTF-8 once percent-decoded.
    #[error("its user info is not UTF-8 once percent-decoded")]
    NotUtf8,
    /// A `:` in the user name.
    #[error("the user name may not contain ':' (Basic authentication could not tell it from the password)")]
    Colon,
    /// The host part is not an authority.
    #[error(transparent)]
    Authority(#[from] http::uri::InvalidUri),
    /// The URL without user info is not a URL.
    #[error(transparent)]
    Uri(#[from] http::uri::InvalidUriParts),
    /// The credential is not a header value.
    #[error(transparent)]
    Header(#[from] http::header::InvalidHeaderValue),
}

/// Why one message cannot make a request (refused, not retried).
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A message header the relay sets or that frames the body.
    #[error("message header {name} is refused: {why}")]
    Reserved {
        /// The name, quoted, at most 64 characters.
        name: String,
        /// Why.
        why: &'static str,
    },
    /// A message header name that is not one.
    #[error("message header {0} is not a valid header name")]
    HeaderName(String),
    /// A message header value that is not one.
    #[error("message header {0} has an invalid value")]
    HeaderValue(HeaderName),
    /// The row's trace context.
    #[error("traceparent is not a header value")]
    Traceparent,
    /// The row's trace state.
    #[error("tracestate is not a header value")]
    Tracestate,
    /// The derived key.
    #[error("derived key is not a header value")]
    DerivedKey,
    /// The request builder refused.
    #[error(transparent)]
    Build(#[from] http::Error),
}

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
    pub fn from_config(config: &DestinationConfig) -> Result<Self, TargetError> {
        let shown = || ServiceUrl::new(config.url.as_str()).redacted();
        let uri: Uri = config.url.parse().map_err(|source| TargetError::NotAUrl { shown: shown(), source })?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
            return Err(TargetError::Scheme(shown()));
        }
        let (uri, credentials) =
            split_credentials(uri).map_err(|source| TargetError::Credentials { shown: shown(), source })?;
        let method = config.method.as_deref().unwrap_or("POST");
        let method = Method::from_bytes(method.as_bytes()).map_err(|_| TargetError::Method(method.to_owned()))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| TargetError::HeaderName(name.clone()))?;
            if let Some(why) = reserved_header(name).filter(|_| header != HOST) {
                return Err(TargetError::Reserved { name: name.clone(), why });
            }
            if headers.contains_key(&header) {
                return Err(TargetError::Twice(header));
            }
            let mut value = HeaderValue::from_str(value).map_err(|_| TargetError::HeaderValue(name.clone()))?;
            value.set_sensitive(true);
            headers.insert(header, value);
        }
        if let Some(credentials) = credentials {
            if headers.contains_key(AUTHORIZATION) {
                return Err(TargetError::TwoCredentials(shown()));
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
    pub fn request(&self, message: &Claimed) -> Result<Request<BoxedBody>, RequestError> {
        let mut headers = self.headers.clone();
        for (name, value) in &message.headers {
            if let Some(why) = reserved_header(name) {
                return Err(RequestError::Reserved { name: quoted(name), why });
            }
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| RequestError::HeaderName(quoted(name)))?;
            let Ok(value) = HeaderValue::from_str(value) else { return Err(RequestError::HeaderValue(header)) };
            headers.insert(header, value);
        }
        if let Some(trace) = &message.trace {
            // A new span of the row's trace for each attempt; a tracestate
            // among the message's headers belongs to another context.
            let traceparent = HeaderValue::from_str(&trace.child()).map_err(|_| RequestError::Traceparent)?;
            headers.insert(TRACEPARENT, traceparent);
            headers.remove(TRACESTATE);
            if let Some(state) = trace.tracestate() {
                let state = HeaderValue::from_str(state).map_err(|_| RequestError::Tracestate)?;
                headers.insert(TRACESTATE, state);
            }
        }
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        let key = HeaderValue::from_str(&message.derived_key).map_err(|_| RequestError::DerivedKey)?;
        headers.insert(&IDEMPOTENCY_KEY, key);
        let mut request = Request::builder()
            .method(self.method.clone())
            .uri(self.uri.clone())
            .body(full(Bytes::from(message.payload.clone())))?;
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
fn split_credentials(uri: Uri) -> Result<(Uri, Option<HeaderValue>), CredentialsError> {
    let Some((userinfo, host)) = uri.authority().and_then(|a| a.as_str().rsplit_once('@')) else {
        return Ok((uri, None));
    };
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|decoded| decoded.into_owned())
            .map_err(|_| CredentialsError::NotUtf8)
    };
    let (user, password) = (decode(user)?, decode(password)?);
    if user.contains(':') {
        return Err(CredentialsError::Colon);
    }
    let authority = Authority::try_from(host)?;
    let mut parts = uri.into_parts();
    parts.authority = Some(authority);
    parts.path_and_query = Some(parts.path_and_query.unwrap_or_else(|| PathAndQuery::from_static("/")));
    let uri = Uri::from_parts(parts)?;
    if user.is_empty() && password.is_empty() {
        return Ok((uri, None));
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut value = HeaderValue::from_str(&format!("Basic {encoded}"))?;
    value.set_sensitive(true);
    Ok((uri, Some(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> Result<Target, TargetError> {
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
        let error = Target::from_config(&config).unwrap_err().to_string();
        assert!(error.contains("Authorization") && error.contains("alice:[redacted]@h"), "{error}");
        assert!(!error.contains("s3cret"), "{error}");
    }

    #[test]
    fn url_errors_never_print_the_password() {
        for url in ["ftp://alice:s3cret@h/", "https://alice:s3cret@h/a b"] {
            let error = target(url).unwrap_err().to_string();
            assert!(!error.contains("s3cret") && error.contains("[redacted]"), "{error}");
        }
        assert!(target("http://a%3Ab:pw@h/").unwrap_err().to_string().contains("':'"));
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
        assert!(Target::from_config(&config).unwrap_err().to_string().contains("twice"));
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
            let error = target.request(&message(&[(name, "5")])).unwrap_err().to_string();
            assert!(error.contains(&format!("{name:?}")) && error.contains("refused"), "{error}");
        }
    }

    #[test]
    fn a_message_header_name_is_escaped_in_the_refusal() {
        let error = target("http://h/").unwrap().request(&message(&[("x\nforged: 1", "v")])).unwrap_err().to_string();
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
