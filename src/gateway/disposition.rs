//! What became of a request: the outcome its log line and metrics name.

/// What happened to a request; logged once per request (and counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Not guarded: forwarded as is.
    Passthrough,
    /// Guarded, first attempt: forwarded and its response stored.
    Forwarded,
    /// Guarded, forwarded, but the outcome released the key (5xx, 4xx on the release list).
    Released,
    /// A stored response was replayed.
    Replayed,
    /// Another attempt holds the key (`409`).
    Conflict,
    /// The key was used for another request (`422`).
    Mismatch,
    /// A required key is missing (`400`).
    MissingKey,
    /// The key is malformed (`400`).
    InvalidKey,
    /// The tenant header (or `Authorization`) came more than once (`400`).
    AmbiguousTenant,
    /// The tenant source names a principal and the request has no valid credential (`401`).
    Unauthenticated,
    /// The store failed and `fail_mode = "closed"` (`503`).
    StoreError,
    /// The store failed and the request was forwarded unguarded.
    FailOpen,
    /// The upstream failed (`502`, `504` unguarded); a guarded key was
    /// released, or completed without a body when the upstream's status
    /// said it acted.
    UpstreamError,
    /// The client's wait ran out (`504`); the attempt goes on in the background.
    TimedOut,
    /// The request was sent and its outcome lost (`502 outcome-unknown`).
    Unknown,
    /// A retry of a request whose outcome is unknown (`502`, nothing forwarded).
    Held,
    /// Completed before, but too large to replay (`410`).
    NotReplayable,
    /// The request body was over the limit or unreadable.
    BadBody,
    /// The request target or headers were over the limits (`414`, `431`).
    BadHead,
    /// The path or method has more than one reading (`400`).
    Ambiguous,
    /// The connection has as many guarded attempts running as it may (`503`).
    ConnectionBusy,
    /// A new key of a tenant over its `tenant_quota` (`429`).
    TenantQuota,
    /// A webhook delivery without a valid signature (`401`).
    WebhookSignature,
    /// A validly signed webhook delivery outside the timestamp tolerance (`401`).
    WebhookTimestamp,
    /// No route matched (`404`). Keep it last: [`Disposition::COUNT`] counts up to it.
    NoRoute,
}

impl Disposition {
    /// Every disposition, in declaration order: `ALL[d as usize] == d`.
    pub const ALL: [Disposition; 25] = [
        Self::Passthrough,
        Self::Forwarded,
        Self::Released,
        Self::Replayed,
        Self::Conflict,
        Self::Mismatch,
        Self::MissingKey,
        Self::InvalidKey,
        Self::AmbiguousTenant,
        Self::Unauthenticated,
        Self::StoreError,
        Self::FailOpen,
        Self::UpstreamError,
        Self::TimedOut,
        Self::Unknown,
        Self::Held,
        Self::NotReplayable,
        Self::BadBody,
        Self::BadHead,
        Self::Ambiguous,
        Self::ConnectionBusy,
        Self::TenantQuota,
        Self::WebhookSignature,
        Self::WebhookTimestamp,
        Self::NoRoute,
    ];

    /// How many dispositions there are.
    pub const COUNT: usize = Self::ALL.len();

    /// A dense index below [`Disposition::COUNT`] (metric series slots).
    pub fn index(self) -> usize {
        self as usize
    }

    /// A stable lower-case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Passthrough => "passthrough",
            Self::Forwarded => "forwarded",
            Self::Released => "released",
            Self::Replayed => "replayed",
            Self::Conflict => "conflict",
            Self::Mismatch => "mismatch",
            Self::MissingKey => "missing-key",
            Self::InvalidKey => "invalid-key",
            Self::AmbiguousTenant => "ambiguous-tenant",
            Self::Unauthenticated => "unauthenticated",
            Self::StoreError => "store-error",
            Self::FailOpen => "fail-open",
            Self::UpstreamError => "upstream-error",
            Self::TimedOut => "timed-out",
            Self::Unknown => "unknown",
            Self::Held => "held",
            Self::NotReplayable => "not-replayable",
            Self::BadBody => "bad-body",
            Self::BadHead => "bad-head",
            Self::Ambiguous => "ambiguous",
            Self::ConnectionBusy => "connection-busy",
            Self::TenantQuota => "tenant-quota",
            Self::WebhookSignature => "webhook-signature",
            Self::WebhookTimestamp => "webhook-timestamp",
            Self::NoRoute => "no-route",
        }
    }
}
