use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::*;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn names_are_unique_and_former_names_name_nothing_today() {
    let mut seen = HashSet::new();
    for t in EventType::ALL {
        assert!(seen.insert(t.name()), "{} twice", t.name());
        if let Some(old) = t.former_name() {
            assert!(seen.insert(old), "{old} twice");
        }
    }
    for t in EventType::ALL {
        let mut fields = HashSet::new();
        for f in t.fields() {
            assert!(fields.insert(f.name), "{t}: field {} twice", f.name);
            assert!(
                !COMMON_FIELDS.iter().any(|c| c.name == f.name),
                "{t}: {} is a common field",
                f.name
            );
            assert!(!f.doc.is_empty(), "{t}: field {} has no doc", f.name);
        }
        assert!(!t.when().is_empty(), "{t} has no doc");
    }
}

/// One form for every name: `resource.verb` with the verb plain (`create`, not `created`).
#[test]
fn one_tense() {
    for t in EventType::ALL {
        let verb = t.name().rsplit(['.', '-']).next().unwrap_or("");
        assert!(
            !verb.ends_with("ed"),
            "{t}: name events with the plain verb (`{}`)",
            verb.trim_end_matches('d')
        );
    }
}

#[test]
fn current_and_former_names_find_the_event() {
    assert_eq!(EventType::find("role.created"), Some(EventType::RoleCreate));
    assert_eq!(EventType::find("role.create"), Some(EventType::RoleCreate));
    assert_eq!(EventType::find("auth.failed"), Some(EventType::AuthFail));
    assert_eq!(EventType::find("user.login"), Some(EventType::UserLogin));
    assert_eq!(EventType::find("user.logn"), None);
    // What is written and reported is today's name only.
    assert_eq!(EventType::from_name("role.created"), None);
    for t in EventType::ALL {
        assert_eq!(EventType::from_name(t.name()), Some(*t));
        assert_eq!(t.to_string(), t.name());
    }
}

#[test]
fn serde_uses_the_names_and_refuses_others() {
    for t in EventType::ALL {
        let json = serde_json::to_string(t).unwrap_or_default();
        assert_eq!(json, format!("\"{}\"", t.name()));
        let back: EventType = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert_eq!(back, *t);
    }
    let err = serde_json::from_str::<EventType>("\"role.created\"")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.starts_with(
            "\"role.created\" is not an audit event type; the types are: user.create, "
        ),
        "{err}"
    );
    let err = "nope".parse::<EventType>().err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("role.create")));
}

#[test]
fn failure_events_document_the_failure_fields() {
    for t in [
        EventType::AuthFail,
        EventType::UserLogin,
        EventType::NodeJoin,
    ] {
        for f in FAILURE_FIELDS {
            assert!(t.has_field(f), "{t} lacks {f}");
        }
    }
}

/// Table cells: no line breaks, and `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// The part of `docs/audit.md` the catalogue writes: the events table and the renames.
fn reference() -> String {
    let mut out = String::new();
    out.push_str("| Event | When | Fields |\n|---|---|---|\n");
    for t in EventType::ALL {
        let fields = t
            .fields()
            .iter()
            .map(|f| format!("`{}`: {}", f.name, cell(f.doc)))
            .collect::<Vec<_>>()
            .join("<br>");
        let by = match t.source() {
            Source::Auth => "",
            Source::Proxy => " *Reported by the proxy.*",
            Source::Agent => " *Reported by the node's agent, through the proxy.*",
        };
        out.push_str(&format!(
            "| `{}` | {}{by} | {fields} |\n",
            t.name(),
            cell(&t.when())
        ));
    }
    out.push_str("\nEvery record also has these fields:\n\n| Field | Meaning |\n|---|---|\n");
    for f in COMMON_FIELDS {
        out.push_str(&format!("| `{}` | {} |\n", f.name, cell(f.doc)));
    }
    out.push_str("\nRenamed events (records written before the rename keep the old name; a search for either name finds both):\n\n| Before | Now |\n|---|---|\n");
    for t in EventType::ALL {
        if let Some(old) = t.former_name() {
            out.push_str(&format!("| `{old}` | `{}` |\n", t.name()));
        }
    }
    out
}

const BEGIN: &str = "<!-- catalogue: generated from core/src/audit/catalogue.rs; edit there -->\n";
const END: &str = "<!-- catalogue: end -->";

/// `docs/audit.md` lists exactly the catalogue's events and fields, as the catalogue words
/// them. `SALLYPORT_BLESS=1 cargo test -p sallyport-core catalogue` rewrites the generated part.
#[test]
fn docs_audit_md_is_the_catalogue() {
    let path = root().join("docs/audit.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!(
            "{} lacks the generated markers {BEGIN:?} … {END:?}",
            path.display()
        );
    };
    let (head, rest) = text.split_at(b + BEGIN.len());
    let (current, tail) = rest.split_at(e - b - BEGIN.len());
    let want = reference();
    if current != want {
        if std::env::var_os("SALLYPORT_BLESS").is_some() {
            std::fs::write(&path, format!("{head}{want}{tail}"))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            return;
        }
        // Say which events differ, not just that something does.
        let listed: HashSet<&str> = current
            .lines()
            .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
            .collect();
        let missing: Vec<_> = EventType::ALL
            .iter()
            .map(|t| t.name())
            .filter(|n| !listed.contains(n))
            .collect();
        panic!(
            "docs/audit.md differs from the catalogue (events missing there: {missing:?}); run SALLYPORT_BLESS=1 cargo test -p sallyport-core catalogue, or fix core/src/audit/catalogue.rs"
        );
    }
    // And vice versa: every event row in the generated part is a catalogue event.
    for line in current.lines().filter(|l| l.starts_with("| `")) {
        let name = line
            .trim_start_matches("| `")
            .split('`')
            .next()
            .unwrap_or("");
        assert!(
            EventType::find(name).is_some() || COMMON_FIELDS.iter().any(|f| f.name == name),
            "docs/audit.md lists {name}, which the catalogue does not"
        );
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Emitters name events through [`EventType`] only: no event name (today's or a former one)
/// written out as a string in the code that writes or reports events. Names of one plain word
/// (`exec`, `scp`, `sftp`, `port`) are left out: they are also a subsystem, a tool and a
/// request's name, and `Event::new` takes an `EventType`, so the type checks those.
#[test]
fn no_event_name_is_spelled_outside_the_catalogue() {
    let mut files = vec![];
    for dir in [
        "core/src",
        "auth/src",
        "proxy/src",
        "agent/src",
        "cli/src",
        "daemon/src",
    ] {
        sources(&root().join(dir), &mut files);
    }
    let names: Vec<&str> = EventType::ALL
        .iter()
        .flat_map(|t| [Some(t.name()), t.former_name()])
        .flatten()
        .filter(|n| n.contains(['.', '-']))
        .collect();
    let mut found = vec![];
    for f in files {
        // The catalogue itself, and its tests.
        if f.ends_with("audit/catalogue.rs") || f.components().any(|c| c.as_os_str() == "catalogue")
        {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for n in &names {
            if text.contains(&format!("\"{n}\"")) {
                found.push(format!("{}: \"{n}\"", f.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "event names spelled out instead of EventType: {found:#?}"
    );
}

/// What auth takes from a proxy's report, and a proxy from an agent, is what the catalogue says
/// they report.
#[test]
fn reported_events_are_the_catalogues() {
    let by = |s: &[Source]| {
        EventType::ALL
            .iter()
            .filter(|t| s.contains(&t.source()))
            .map(|t| t.name())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        crate::api::SESSION_EVENTS,
        by(&[Source::Proxy, Source::Agent])
    );
    assert_eq!(crate::api::AGENT_EVENTS, by(&[Source::Agent]));
}
