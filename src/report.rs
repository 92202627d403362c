//! The one way both binaries print an error: its text, then each cause whose text it does not
//! already contain. nvshim's errors name their cause in their own text (the path and what went
//! wrong, in one sentence) and also return it from `source()`, so printing the whole chain, as
//! anyhow's `{:#}` does, would say every cause twice (`...: No space left on device (os error
//! 28): No space left on device (os error 28)`); a foreign error that does not name its cause
//! still gets it appended.

use std::error::Error;

/// `err` and the causes its text does not already hold, joined with `: `.
pub fn error_text(err: &(dyn Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing /b/config.json: {0}")]
    struct Named(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("saving the bundle")]
    struct Silent(#[source] std::io::Error);

    #[test]
    fn each_cause_once() {
        let io = || std::io::Error::from_raw_os_error(28);
        let named = Named(io());
        assert_eq!(
            error_text(&named),
            format!("writing /b/config.json: {}", io())
        );
        let silent = Silent(io());
        assert_eq!(error_text(&silent), format!("saving the bundle: {}", io()));
    }
}
