//! What each stage of the request path hands back to the one that called
//! it: a [`Reply`] (the response and what became of the request), and at
//! the top a [`Handled`] request, which adds the key its log line names.

use http::Response;

use super::Disposition;
use super::problem::Problem;
use crate::http::body::BoxedBody;

/// A response and what became of its request.
pub(in crate::gateway) struct Reply {
    /// The outcome the metrics and the log line name.
    pub(in crate::gateway) disposition: Disposition,
    /// What the client gets.
    pub(in crate::gateway) response: Response<BoxedBody>,
}

impl Reply {
    /// A reply with this outcome and response.
    pub(in crate::gateway) fn new(disposition: Disposition, response: Response<BoxedBody>) -> Self {
        Self { disposition, response }
    }

    /// A reply that is one of the gateway's own problems.
    pub(in crate::gateway) fn problem(disposition: Disposition, problem: Problem) -> Self {
        Self::new(disposition, problem.to_response())
    }
}

/// A request the gateway is done with.
pub(in crate::gateway) struct Handled {
    /// Its reply.
    pub(in crate::gateway) reply: Reply,
    /// The logged form of its scoped key (a hash, never the key), once the
    /// guard has scoped one.
    pub(in crate::gateway) logged_key: Option<String>,
}

impl From<Reply> for Handled {
    /// A request answered before any key was scoped.
    fn from(reply: Reply) -> Self {
        Self { reply, logged_key: None }
    }
}
