//! Names made from a message: a NATS subject such as
//! `orders.{operation}.{business_key}` is a [`Template`] over the
//! message's `{destination}`, `{operation}`, `{business_key}` and
//! `{ordering_key}`.
//!
//! A template is parsed once, when its destination is built (an unknown
//! placeholder or a stray brace is a config error), and rendered for each
//! message, where each value is checked by the destination's own rule (a
//! subject token may not hold a `.`, a wildcard or a space): a message
//! whose names cannot make a valid name is refused, never published under
//! a name it did not ask for.

use super::super::claim::Claimed;

/// A parsed template.
#[derive(Debug, Clone)]
pub(super) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Field(Field),
}

/// A name of the message that a template can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Destination,
    Operation,
    BusinessKey,
    OrderingKey,
}

impl Field {
    const ALL: [(&'static str, Field); 4] = [
        ("destination", Field::Destination),
        ("operation", Field::Operation),
        ("business_key", Field::BusinessKey),
        ("ordering_key", Field::OrderingKey),
    ];

    fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, field)| *field == self).map_or("", |(name, _)| name)
    }

    fn of(self, message: &Claimed) -> Option<&str> {
        match self {
            Self::Destination => Some(&message.destination),
            Self::Operation => Some(&message.operation),
            Self::BusinessKey => Some(&message.business_key),
            Self::OrderingKey => message.ordering_key.as_deref(),
        }
    }
}

/// Why a template does not parse; quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `}` that closes nothing.
    #[error("{0:?} has a '}}' without its '{{'")]
    Close(String),
    /// A `{` never closed.
    #[error("{0:?} has a '{{' without its '}}'")]
    Open(String),
    /// A placeholder that names no field of a message.
    #[error(
        "{text:?} names {{{name}}}: a template may use {{destination}}, {{operation}}, {{business_key}} and {{ordering_key}}"
    )]
    Unknown {
        /// The template.
        text: String,
        /// The name in braces.
        name: String,
    },
    /// Nothing at all.
    #[error("the template is empty")]
    Empty,
}

/// Why a message cannot fill a template; `E` is the destination's reason
/// a value cannot stand in its name.
#[derive(Debug, thiserror::Error)]
pub enum RenderError<E> {
    /// The message has no value for a placeholder (an ordering key).
    #[error("the message has no {0} for {{{0}}} in the template")]
    Missing(&'static str),
    /// A value the destination's rule refuses.
    #[error("its {field} {shown:?} cannot fill {{{field}}}: {why}")]
    Value {
        /// The placeholder.
        field: &'static str,
        /// The value, its first 64 characters.
        shown: String,
        /// Why not.
        #[source]
        why: E,
    },
}

impl Template {
    /// Parses `text`; the error says what is wrong and where.
    pub(super) fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Text(rest.to_owned()));
                    break;
                }
                Some(at) if rest.as_bytes()[at] == b'}' => {
                    return Err(TemplateError::Close(text.to_owned()));
                }
                Some(at) => {
                    if at > 0 {
                        parts.push(Part::Text(rest[..at].to_owned()));
                    }
                    let close = rest[at..].find('}').ok_or_else(|| TemplateError::Open(text.to_owned()))?;
                    let name = &rest[at + 1..at + close];
                    let field = Field::ALL.iter().find(|(known, _)| *known == name).map(|(_, field)| *field);
                    let field =
                        field.ok_or_else(|| TemplateError::Unknown { text: text.to_owned(), name: name.to_owned() })?;
                    parts.push(Part::Field(field));
                    rest = &rest[at + close + 1..];
                }
            }
        }
        if parts.is_empty() {
            return Err(TemplateError::Empty);
        }
        Ok(Self { parts })
    }

    /// The text with `sample` in place of every placeholder: what the
    /// fixed parts look like, for checking them at start.
    pub(super) fn sample(&self, sample: &str) -> String {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Text(text) => text.as_str(),
                Part::Field(_) => sample,
            })
            .collect()
    }

    /// The name for `message`; each value must pass `allowed` (which says
    /// why not). A message without an ordering key cannot fill
    /// `{ordering_key}`.
    pub(super) fn render<E>(
        &self,
        message: &Claimed,
        allowed: impl Fn(&str) -> Result<(), E>,
    ) -> Result<String, RenderError<E>> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(field) => {
                    let value = field.of(message).ok_or(RenderError::Missing(field.name()))?;
                    allowed(value).map_err(|why| RenderError::Value {
                        field: field.name(),
                        shown: value.chars().take(64).collect(),
                        why,
                    })?;
                    out.push_str(value);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_and_text_are_parsed_and_mistakes_are_named() {
        let template = Template::parse("orders.{operation}.{business_key}").unwrap();
        assert_eq!(template.sample("x"), "orders.x.x");
        assert_eq!(Template::parse("plain").unwrap().sample("x"), "plain");
        for (text, says) in [
            ("orders.{operaton}", "{operaton}"),
            ("orders.{operation", "without its '}'"),
            ("orders.}", "without its '{'"),
            ("", "empty"),
            ("{}", "names {}"),
        ] {
            let error = Template::parse(text).unwrap_err().to_string();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }
}
