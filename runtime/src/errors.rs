//! Error text for people: an error with every cause in its chain, each said once.
//!
//! DAS's error types (thiserror) put their cause's text in their own message
//! (`list DeviceClasses: <kube error>`) so a log line or an event reads whole, and also keep
//! the cause as their `source()` so code can inspect it. Printing the chain as anyhow's `{:#}`
//! does would then repeat each cause; printing only the message would lose the causes that
//! library errors keep out of their own text (kube's `client error (Connect)` hides
//! `tcp connect error: Connection refused` in its source). [`chain`] prints each cause whose text
//! the line does not already hold.

use std::error::Error;

/// `err`'s message, then `: <cause>` for every cause in its `source()` chain whose text is not
/// already part of the line, e.g. `list DeviceClasses: client error (Connect): tcp connect
/// error: Connection refused (os error 111)`.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("read /etc/x: {0}")]
    struct Embeds(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Hides(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("list DeviceClasses: {0}")]
    struct Outer(#[source] Hides);

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let e = Embeds(std::io::Error::other("permission denied"));
        assert_eq!(chain(&e), "read /etc/x: permission denied");
    }

    #[test]
    fn a_cause_a_library_keeps_out_of_its_message_is_added() {
        let e = Outer(Hides(std::io::Error::other("tcp connect error: refused")));
        assert_eq!(
            chain(&e),
            "list DeviceClasses: client error (Connect): tcp connect error: refused"
        );
    }
}
