//! What a user, role or node name may look like. Names appear in certificates, file paths and
//! audit records, so they are restricted to characters that are safe in all three.

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {what} name {name:?}: use 1-{max} characters among a-z A-Z 0-9 . _ - @ +, starting with a letter or digit", max = MAX_NAME)]
pub struct NameError {
    pub what: &'static str,
    pub name: String,
}

pub const MAX_NAME: usize = 128;

/// Checks a user, role, login or node name.
pub fn validate(what: &'static str, name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'));
    if ok {
        Ok(())
    } else {
        Err(NameError {
            what,
            name: name.to_string(),
        })
    }
}

/// Parses `k=v,k2=v2` label lists (`--labels`, `--kube-labels`).
pub fn parse_labels(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("label {pair:?} is not key=value"))?;
        if k.is_empty() {
            return Err(format!("label {pair:?} has an empty key"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["alice", "bob.smith", "a@example.com", "ubuntu", "x1"] {
            assert!(validate("user", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "@admin",
            "-x",
            "a b",
            "a/b",
            "a\nb",
            "ä",
            &"a".repeat(129),
        ] {
            assert!(validate("user", bad).is_err(), "{bad:?}");
        }
    }
}
