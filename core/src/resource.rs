//! Resources as admins write them: YAML files with one or more documents, each `kind:`-tagged.
//! Every document is parsed with its own line numbers intact, so an error names the file, line,
//! column and field.

use serde::{Deserialize, Serialize};

use crate::oidc::OidcConnector;
use crate::role::Role;
use crate::yaml::{Place, Places, Problem, parse_problem};

/// One resource document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)] // parsed once per file, never stored in bulk
pub enum Resource {
    Role(Role),
    Oidc(OidcConnector),
}

impl Resource {
    pub fn kind(&self) -> &'static str {
        match self {
            Resource::Role(_) => "role",
            Resource::Oidc(_) => "oidc",
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Resource::Role(r) => r.name(),
            Resource::Oidc(c) => c.name(),
        }
    }
}

#[derive(Deserialize)]
struct Header {
    kind: Option<String>,
}

/// The kinds `sallyctl create` accepts.
pub const KINDS: &[&str] = &["role", "oidc"];

/// Parses every document of `text`. `source` names the file in errors.
pub fn parse_all(text: &str, source: &str) -> Result<Vec<Resource>, String> {
    let mut out = Vec::new();
    for (first_line, doc) in documents(text) {
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        }
        // Blank lines in front keep the document's line numbers those of the file.
        let padded = format!("{}{doc}", "\n".repeat(first_line));
        let header: Header =
            serde_saphyr::from_str(&padded).map_err(|e| format!("{source}: {e}"))?;
        let kind = header.kind.ok_or_else(|| {
            format!(
                "{source}: line {}: a resource needs `kind:` (one of {})",
                first_line + 1,
                KINDS.join(", ")
            )
        })?;
        match kind.as_str() {
            "role" => {
                let role: Role =
                    serde_saphyr::from_str(&padded).map_err(|e| format!("{source}: {e}"))?;
                role.validate().map_err(|e| {
                    let at = Places::of(&padded).find(&e.path()).unwrap_or(Place {
                        line: first_line + 1,
                        column: 1,
                    });
                    format!("{source}: line {} column {}: {e}", at.line, at.column)
                })?;
                out.push(Resource::Role(role));
            }
            "oidc" => {
                let c: OidcConnector =
                    serde_saphyr::from_str(&padded).map_err(|e| format!("{source}: {e}"))?;
                c.validate()
                    .map_err(|e| format!("{source}: line {}: {e}", first_line + 1))?;
                out.push(Resource::Oidc(c));
            }
            other => {
                return Err(format!(
                    "{source}: line {}: unknown kind {other:?}: use one of {}",
                    first_line + 1,
                    KINDS.join(", ")
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{source}: no resources found"));
    }
    Ok(out)
}

/// One role as the web editor sends it (a single document): the role, or what is wrong with it
/// where it is — a value the parser refused where the parser says, a value `Role::validate`
/// refuses at that value (`version: v2` at `v2`, a login pattern at that login).
pub fn parse_role(text: &str) -> Result<Role, Problem> {
    let role: Role = serde_saphyr::from_str(text).map_err(|e| parse_problem(&e))?;
    role.validate().map_err(|e| {
        let at = Places::of(text)
            .find(&e.path())
            .unwrap_or(Place { line: 1, column: 1 });
        Problem {
            line: at.line,
            column: at.column,
            message: e.to_string(),
        }
    })?;
    Ok(role)
}

/// Splits a YAML stream at `---` lines; yields (index of the document's first line, text).
fn documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut start = 0;
    let mut current = String::new();
    for (i, line) in text.lines().enumerate() {
        if line == "---" || line.starts_with("--- ") || line == "..." {
            docs.push((start, std::mem::take(&mut current)));
            start = i + 1;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push((start, current));
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_documents_keep_their_line_numbers() {
        let text = "# roles\nkind: role\nversion: v1\nmetadata: {name: a}\n---\nkind: role\nversion: v1\nmetadata: {name: b}\nspec:\n  allow:\n    rules: [{resources: [role], verbs: [craete]}]\n";
        let e = parse_all(text, "roles.yaml").err().unwrap_or_default();
        assert!(
            e.starts_with("roles.yaml: ") && e.contains("line 11") && e.contains("craete"),
            "{e}"
        );
        let ok = parse_all(&text.replace("craete", "create"), "roles.yaml").unwrap_or_default();
        assert_eq!(
            ok.iter().map(|r| r.name().to_string()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
    }

    #[test]
    fn a_role_refused_after_parsing_is_refused_at_the_offending_value() {
        for (text, line, column, needle) in [
            (
                "kind: role\nversion: v2\nmetadata: {name: a}\n",
                2,
                10,
                "version",
            ),
            (
                "kind: role\nversion: v1\nmetadata:\n  name: ../a\n",
                4,
                9,
                "metadata.name",
            ),
            (
                "kind: role\nversion: v1\nmetadata: {name: a}\nspec:\n  allow:\n    logins: [root, 'ro*']\n",
                6,
                20,
                "ro*",
            ),
            (
                "kind: role\nversion: v1\nmetadata: {name: a}\nspec:\n  allow:\n    rules:\n      - resources: [role]\n        verbs: [craete]\n",
                8,
                17,
                "craete",
            ),
        ] {
            let p = parse_role(text)
                .err()
                .unwrap_or_else(|| panic!("{text} accepted"));
            assert_eq!((p.line, p.column), (line, column), "{text}: {p:?}");
            assert!(p.message.contains(needle), "{p:?}");
            // `sallyctl create` says the same place.
            let e = parse_all(text, "r.yaml").err().unwrap_or_default();
            assert!(e.contains(&format!("line {line}")), "{e}");
        }
        let second = "kind: role\nversion: v1\nmetadata: {name: a}\n---\nkind: role\nversion: v3\nmetadata: {name: b}\n";
        let e = parse_all(second, "r.yaml").err().unwrap_or_default();
        assert!(e.starts_with("r.yaml: line 6 column 10: "), "{e}");
    }

    #[test]
    fn unknown_kind_and_empty_files() {
        let e = parse_all("kind: widget\n", "x.yaml")
            .err()
            .unwrap_or_default();
        assert!(e.contains("unknown kind \"widget\""), "{e}");
        assert!(parse_all("# nothing\n", "x.yaml").is_err());
        let e = parse_all("kind: role\nversion: v2\nmetadata: {name: a}\n", "x.yaml")
            .err()
            .unwrap_or_default();
        assert!(e.contains("version"), "{e}");
    }
}
