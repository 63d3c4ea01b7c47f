//! Where things are in a YAML document, so that an error about a value that read well but is
//! wrong (a role's `version: v2`, a login pattern) points at that value's line and column,
//! as the parser's own errors (`verbs: [craete]`) already do.
//!
//! [`Places::of`] walks the parser's events once and records, for every mapping value and
//! sequence item, where it starts, under its dotted path (`spec.allow.logins.1`). It reads only
//! what the deserializer already accepted; a document it cannot walk has no places, and errors
//! then fall back to the document's start.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};

/// A place in a document: 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Place {
    pub line: usize,
    pub column: usize,
}

/// One problem with a document, where it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Problem {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// The places of a document's values by dotted path.
#[derive(Debug, Default)]
pub struct Places {
    by_path: HashMap<String, Place>,
    /// The bytes of the paths recorded, bounded by [`MAX_PATH_BYTES`].
    bytes: usize,
}

/// A container being walked: a mapping (waiting for a key, or for the value of `key`) or a
/// sequence (the index of its next item).
enum Open {
    Map { key: Option<String> },
    Seq { next: usize },
}

/// Nesting beyond this is not walked (the places of deeper values fall back to a parent).
const MAX_DEPTH: usize = 64;
/// What the recorded paths may hold together, and how many there may be: each item's path
/// repeats its parents' keys, so a long key over many items would otherwise cost their
/// product (a 32 KiB key over 16,000 items: half a gigabyte from a 64 KiB document). Past
/// either, the walk stops and later values fall back to the document's start.
const MAX_PATH_BYTES: usize = 1 << 20;
const MAX_PATHS: usize = 16_384;

impl Places {
    /// The places of `text`'s first document.
    pub fn of(text: &str) -> Places {
        let mut places = Places::default();
        let mut path: Vec<String> = Vec::new();
        let mut stack: Vec<Open> = Vec::new();
        for item in Parser::new_from_str(text) {
            let Ok((event, span)) = item else {
                break;
            };
            if places.bytes >= MAX_PATH_BYTES || places.by_path.len() >= MAX_PATHS {
                break;
            }
            let here = Place {
                line: span.start.line(),
                column: span.start.col() + 1,
            };
            match event {
                Event::DocumentEnd => break,
                Event::Scalar(value, ..) => {
                    // A key of the mapping on top, or a value (a leaf).
                    if let Some(Open::Map { key }) = stack.last_mut()
                        && key.is_none()
                    {
                        *key = Some(value.into_owned());
                        continue;
                    }
                    places.enter(&mut stack, &mut path, here);
                    places.leave(&mut stack, &mut path);
                }
                Event::Alias(_) => {
                    places.enter(&mut stack, &mut path, here);
                    places.leave(&mut stack, &mut path);
                }
                Event::MappingStart(..) | Event::SequenceStart(..) => {
                    if let Some(Open::Map { key }) = stack.last()
                        && key.is_none()
                    {
                        // A complex key: not a path anyone names; its places are skipped.
                        break;
                    }
                    if stack.len() >= MAX_DEPTH {
                        break;
                    }
                    places.enter(&mut stack, &mut path, here);
                    stack.push(if matches!(event, Event::MappingStart(..)) {
                        Open::Map { key: None }
                    } else {
                        Open::Seq { next: 0 }
                    });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                    places.leave(&mut stack, &mut path);
                }
                _ => {}
            }
        }
        places
    }

    /// A value starts at `here`: its path is pushed and its place recorded.
    fn enter(&mut self, stack: &mut [Open], path: &mut Vec<String>, here: Place) {
        let segment = match stack.last_mut() {
            Some(Open::Map { key }) => key.clone().unwrap_or_default(),
            Some(Open::Seq { next }) => {
                *next += 1;
                (*next - 1).to_string()
            }
            None => {
                self.by_path.entry(String::new()).or_insert(here);
                path.push(String::new());
                return;
            }
        };
        path.push(segment);
        // Below the root's own (empty) segment.
        let dotted = path.get(1..).map(|p| p.join(".")).unwrap_or_default();
        if self.bytes.saturating_add(dotted.len()) > MAX_PATH_BYTES {
            self.bytes = MAX_PATH_BYTES;
            return;
        }
        self.bytes += dotted.len();
        self.by_path.entry(dotted).or_insert(here);
    }

    /// A value ended: its path is popped, and its mapping waits for the next key.
    fn leave(&mut self, stack: &mut [Open], path: &mut Vec<String>) {
        path.pop();
        if let Some(Open::Map { key }) = stack.last_mut() {
            *key = None;
        }
    }

    /// Where the value at `path` (dotted; sequence items by index) starts, or its nearest
    /// recorded parent's.
    pub fn find(&self, path: &str) -> Option<Place> {
        let mut p = path;
        loop {
            if let Some(place) = self.by_path.get(p) {
                return Some(*place);
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return self.by_path.get("").copied(),
            }
        }
    }
}

/// Where a parser error is, and its message without the location and source snippet the
/// error's `Display` adds.
pub fn parse_problem(e: &serde_saphyr::Error) -> Problem {
    let (line, column) = e
        .location()
        .map(|l| (l.line() as usize, l.column() as usize))
        .filter(|(l, _)| *l > 0)
        .unwrap_or((1, 1));
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or_default();
    let message = first
        .rsplit_once(" at line ")
        .map(|(m, _)| m)
        .unwrap_or(first)
        .trim()
        .to_string();
    Problem {
        line,
        column: column.max(1),
        message: if message.is_empty() { text } else { message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_items_are_found_by_path_and_unknown_ones_at_their_parent() {
        let text = "kind: role\nversion: v2\nmetadata: {name: a}\nspec:\n  allow:\n    logins: [root, 'ro*']\n    rules:\n      - resources: [role]\n        verbs: [create]\n";
        let p = Places::of(text);
        for (path, line, column) in [
            ("kind", 1, 7),
            ("version", 2, 10),
            ("metadata.name", 3, 18),
            ("spec.allow.logins", 6, 13),
            ("spec.allow.logins.1", 6, 20),
            ("spec.allow.rules.0.verbs.0", 9, 17),
            ("spec.allow.rules.0.nothing", 8, 9),
            // A block mapping starts at its first key.
            ("spec.deny.logins", 5, 3),
        ] {
            assert_eq!(p.find(path), Some(Place { line, column }), "{path}");
        }
    }

    #[test]
    fn odd_documents_have_few_places_and_never_panic() {
        for text in [
            "",
            "plain",
            "- a\n- [b, {c: d}]\n",
            "? [complex, key]\n: v\n",
            "a: &x {b: 1}\nc: *x\n",
            "a: [\n",
            "{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{{",
            "a: 1\n---\nb: 2\n",
        ] {
            let p = Places::of(text);
            let _ = p.find("a.b.c");
        }
        assert_eq!(
            Places::of("- a\n- b\n").find("1"),
            Some(Place { line: 2, column: 3 })
        );
        assert_eq!(
            Places::of("a: 1\n---\nb: 2\n").find("b"),
            Some(Place { line: 1, column: 1 })
        );
    }

    #[test]
    fn a_long_key_over_many_items_costs_a_bounded_amount() {
        // 64 KiB of document: a 32 KiB key over 16,000 items would be half a gigabyte of paths.
        let key = "k".repeat(32 * 1024);
        let items = vec!["a"; 16_000].join(",");
        let text = format!("spec:\n  {key}: [{items}]\n");
        let p = Places::of(&text);
        assert!(p.bytes <= MAX_PATH_BYTES, "{}", p.bytes);
        assert!(p.by_path.len() <= MAX_PATHS);
        // What came before the bound is still found.
        assert_eq!(p.find("spec"), Some(Place { line: 2, column: 3 }));
    }

    #[test]
    fn a_parse_error_is_where_the_parser_says_with_its_message_alone() {
        let text = "kind: role\nversion: v1\nmetadata: {name: a}\nspec:\n  allow:\n    rules: [{resources: [role], verbs: [craete]}]\n";
        let e = serde_saphyr::from_str::<crate::role::Role>(text)
            .err()
            .map(|e| parse_problem(&e));
        let Some(p) = e else {
            panic!("craete accepted");
        };
        assert_eq!((p.line, p.column), (6, 41), "{p:?}");
        assert!(p.message.contains("craete"), "{p:?}");
        assert!(!p.message.contains("line 6"), "{p:?}");
    }
}
