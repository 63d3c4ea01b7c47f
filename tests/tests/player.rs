//! Replaying a recording cannot attack the viewer: `sally play` drops terminal sequences that
//! act on the viewer's terminal (clipboard writes, titles, links, reports, C1 controls) even
//! when the node splits them across events, keeps colours and cursor motion, and
//! `sally recordings ls` shows a command's control bytes escaped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sallyport_tests::*;

#[test]
fn play_filters_sequences_split_across_events_and_ls_escapes_commands() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("mallory", "access", "root");
    let cfg = c.ssh_config(&home, "mallory");
    // The node writes ESC, waits (so the recorder writes it as its own event), then the rest of
    // an OSC 52 clipboard write; then C1 OSC and CSI, a title, and a coloured word. The command
    // itself carries a raw ESC for the listing.
    let script = "printf 'start\\033'; sleep 1.2; printf ']52;c;ZWNobyBwd25lZA==\\007'; \
                  printf '\\302\\2350;title\\007'; printf '\\302\\2336n'; \
                  printf '\\033]0;evil\\007\\033[31mred\\033[0m end\\n' # \x1b]0;listed\x07";
    c.ssh(&cfg, &["root@local1", script], "").ok();
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    let id = list[0]["session_id"].as_str().unwrap().to_string();
    // The raw recording holds the attack, split over two events.
    let cast = c
        .sally(&home, &["play", &id, "--format", "asciicast"], "")
        .ok()
        .stdout;
    let events: Vec<serde_json::Value> = cast
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events.iter().any(|e| e[2] == "start\u{1b}"),
        "ESC not in an event of its own: {cast}"
    );
    for format in [&["--format", "text"][..], &["--speed", "20"][..]] {
        let mut args = vec!["play", id.as_str()];
        args.extend_from_slice(format);
        let shown = c.sally(&home, &args, "").ok().stdout;
        assert_eq!(shown, "start\u{1b}[31mred\u{1b}[0m end\n", "{format:?}");
    }
    // The listing shows the command's ESC and BEL escaped, never raw.
    let table = c.sally(&home, &["recordings", "ls"], "").ok().stdout;
    assert!(!table.contains('\u{1b}'), "{table:?}");
    assert!(table.contains("\\u{1b}]0;listed\\u{7}"), "{table}");
}
