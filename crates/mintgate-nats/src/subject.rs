//! Topics -> NATS subjects.
//!
//! The publish queue's messages carry MQTT-style topics (`sensors/temp0`).
//! A subject template `PREFIX{topic}` maps one to `PREFIX` followed by the
//! topic's levels as subject tokens: `/` becomes `.`, and in each level the
//! characters a subject token may not hold (`.`, `*`, `>`, white space,
//! control characters) become `_`, an empty level `_`. So every topic gives
//! a valid subject under `PREFIX`, and the stream's subjects are
//! `PREFIX>`.

/// The placeholder in a template.
pub const PLACEHOLDER: &str = "{topic}";

/// Checks a template: `PREFIX{topic}` where `PREFIX` is empty or valid
/// subject tokens each followed by `.`.
pub fn check_template(t: &str) -> Result<(), String> {
    let Some(prefix) = t.strip_suffix(PLACEHOLDER) else {
        return Err(format!("{t:?} must end with {PLACEHOLDER}"));
    };
    if prefix.is_empty() {
        return Ok(());
    }
    let Some(tokens) = prefix.strip_suffix('.') else {
        return Err(format!(
            "{t:?}: what comes before {PLACEHOLDER} must end with `.`"
        ));
    };
    for tok in tokens.split('.') {
        if tok.is_empty() || tok.chars().any(bad_char) {
            return Err(format!(
                "{t:?}: {tok:?} is not a subject token (no empty token, no `*`, `>`, \
                 white space or `{{`)"
            ));
        }
    }
    Ok(())
}

fn bad_char(c: char) -> bool {
    c == '.' || c == '*' || c == '>' || c == '{' || c == '}' || c.is_whitespace() || c.is_control()
}

/// The subject of `topic` by the (checked) template `t`.
pub fn subject_for(t: &str, topic: &str) -> String {
    let prefix = t.strip_suffix(PLACEHOLDER).unwrap_or(t);
    let mut s = String::with_capacity(prefix.len() + topic.len());
    s.push_str(prefix);
    for (i, level) in topic.split('/').enumerate() {
        if i > 0 {
            s.push('.');
        }
        if level.is_empty() {
            s.push('_');
        }
        s.extend(level.chars().map(|c| if bad_char(c) { '_' } else { c }));
    }
    s
}

/// The stream subject that covers every subject of the template: `PREFIX>`.
pub fn wildcard(t: &str) -> String {
    format!("{}>", t.strip_suffix(PLACEHOLDER).unwrap_or(t))
}

/// Whether `s` is a valid subject to publish to (tokens non-empty, no
/// wildcard, no white space).
pub fn is_valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|tok| {
            !tok.is_empty()
                && !tok
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn maps_levels_to_tokens() {
        assert_eq!(
            subject_for("mintgate.{topic}", "sensors/temp0"),
            "mintgate.sensors.temp0"
        );
        assert_eq!(subject_for("{topic}", "a//b c/"), "a._.b_c._");
        assert_eq!(subject_for("x.{topic}", "v1.2/*/#"), "x.v1_2._.#");
        assert_eq!(wildcard("mintgate.{topic}"), "mintgate.>");
        assert_eq!(wildcard("{topic}"), ">");
    }

    #[test]
    fn templates_are_checked() {
        assert!(check_template("mintgate.{topic}").is_ok());
        assert!(check_template("a.b.{topic}").is_ok());
        assert!(check_template("{topic}").is_ok());
        for bad in [
            "mintgate",
            "mintgate{topic}",
            "a..{topic}",
            "a.*.{topic}",
            "{topic}.x",
            "a b.{topic}",
        ] {
            assert!(check_template(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        /// Any topic gives a valid subject under the template's wildcard.
        #[test]
        fn any_topic_gives_a_valid_subject(topic in "\\PC{0,40}", prefix in "([a-z0-9_-]{1,6}\\.){0,3}") {
            let t = format!("{prefix}{PLACEHOLDER}");
            prop_assert!(check_template(&t).is_ok());
            let s = subject_for(&t, &topic);
            prop_assert!(is_valid_subject(&s), "{s:?}");
            prop_assert!(s.starts_with(&prefix));
            // as many tokens after the prefix as the topic has levels
            let levels = topic.split('/').count();
            prop_assert_eq!(s[prefix.len()..].split('.').count(), levels);
        }
    }
}
