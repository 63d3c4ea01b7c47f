//! What people expect of the command-line programs besides their commands: shell completion
//! (`sally completion bash|zsh|fish`, `sallyctl completion ...`) that a real `bash` uses, and a
//! man page for each of the three binaries (`sally man`, `sallyctl man`, `sallyport man`, or
//! every page with `--dir`) that `groff` and `man` render and that names every subcommand.
//! The subcommands are read from each binary's own `--help`, so a new one is checked too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use sallyport_tests::*;

/// The visible subcommands `--help` lists (without clap's `help`).
fn subcommands(binary: &str) -> Vec<String> {
    let help = run(Command::new(bin(binary)).arg("--help"), "").ok().stdout;
    let list: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(
        list.len() >= 2,
        "no subcommands in {binary} --help:\n{help}"
    );
    list
}

/// What bash's programmable completion offers for `line` (the last word being completed), with
/// the script `binary completion bash` printed, sourced as a user's shell would.
fn bash_completes(binary: &str, line: &[&str]) -> Vec<String> {
    let script = run(Command::new(bin(binary)).args(["completion", "bash"]), "")
        .ok()
        .stdout;
    let dir = TempDir::new().unwrap();
    let file = dir.path().join(format!("{binary}.bash"));
    std::fs::write(&file, script).unwrap();
    // Complete as bash does: the function `complete -p` registered for the command, called with
    // the words so far, the one under the cursor and the one before it.
    let words = line.join(" ");
    let program = format!(
        r#"source "$1"
spec=$(complete -p {binary}) || exit 3
fn=$(sed -E 's/.* -F ([^ ]+) .*/\1/' <<<"$spec")
COMP_WORDS=({words}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
COMP_LINE="{words}"; COMP_POINT=${{#COMP_LINE}}
"$fn" {binary} "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
printf '%s\n' "${{COMPREPLY[@]}}""#
    );
    let out = run(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &program, "bash"])
            .arg(&file),
        "",
    )
    .ok();
    out.stdout.lines().map(str::to_string).collect()
}

#[test]
fn bash_completion_completes_subcommands_and_flags() {
    assert_eq!(
        bash_completes("sally", &["sally", "lo"]),
        ["login", "logout"]
    );
    assert_eq!(bash_completes("sally", &["sally", "sig"]), ["signup"]);
    assert_eq!(bash_completes("sally", &["sally", "proxy", "s"]), ["ssh"]);
    assert_eq!(
        bash_completes("sally", &["sally", "login", "--pr"]),
        ["--proxy"]
    );
    assert_eq!(
        bash_completes("sally", &["sally", "completion", "f"]),
        ["fish"]
    );
    assert_eq!(bash_completes("sallyctl", &["sallyctl", "us"]), ["users"]);
    assert_eq!(
        bash_completes("sallyctl", &["sallyctl", "users", "re"]),
        ["reset"]
    );
    assert_eq!(
        bash_completes("sallyctl", &["sallyctl", "audit", "search", "--li"]),
        ["--limit"]
    );
}

#[test]
fn zsh_and_fish_completion_name_every_subcommand() {
    for binary in ["sally", "sallyctl"] {
        for shell in ["zsh", "fish"] {
            let script = run(Command::new(bin(binary)).args(["completion", shell]), "")
                .ok()
                .stdout;
            assert!(
                script.contains(&format!("_{binary}"))
                    || script.contains(&format!("complete -c {binary}")),
                "{binary} completion {shell} does not complete {binary}:\n{script}"
            );
            for sub in subcommands(binary) {
                assert!(
                    script.contains(&sub),
                    "{binary} completion {shell} lacks {sub}"
                );
            }
        }
    }
}

#[test]
fn completion_refuses_an_unknown_shell() {
    run(Command::new(bin("sally")).args(["completion", "tcsh"]), "")
        .fails_with("invalid value 'tcsh'");
    // sallyctl prints completion without an identity (no data dir, no login).
    let home = TempDir::new().unwrap();
    run(
        Command::new(bin("sallyctl"))
            .env("SALLY_HOME", home.path())
            .args(["completion", "bash"]),
        "",
    )
    .ok();
}

/// `text` as `groff -man -Tutf8` renders it, plain (no SGR or overstrike) and unhyphenated.
fn groff(page: &str) -> String {
    let out = run(
        Command::new("groff").args(["-man", "-Tutf8", "-rHY=0", "-P-cbou"]),
        page,
    )
    .ok();
    assert!(
        !out.stdout.trim().is_empty(),
        "groff rendered nothing:\n{}",
        out.stderr
    );
    out.stdout
}

#[test]
fn man_pages_render_and_name_every_subcommand() {
    for binary in ["sally", "sallyctl", "sallyport"] {
        let page = run(Command::new(bin(binary)).arg("man"), "").ok().stdout;
        assert!(page.contains(".TH"), "{binary} man is not roff:\n{page}");
        let text = groff(&page);
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{text}");
        for sub in subcommands(binary) {
            assert!(
                text.contains(&format!("{binary}-{sub}(1)")),
                "{binary}(1) does not name {sub}:\n{text}"
            );
        }
        // Every page, as `scripts/man` writes them: one per subcommand, each readable by man.
        let dir = TempDir::new().unwrap();
        run(
            Command::new(bin(binary))
                .args(["man", "--dir"])
                .arg(dir.path()),
            "",
        )
        .ok();
        let mut pages: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        pages.sort();
        assert!(pages.contains(&format!("{binary}.1")), "{pages:?}");
        for sub in subcommands(binary) {
            let name = format!("{binary}-{sub}.1");
            assert!(pages.contains(&name), "no {name} in {pages:?}");
            let shown = run(
                Command::new("man")
                    .env("MANPAGER", "cat")
                    .env("MANWIDTH", "100")
                    .arg("-l")
                    .arg(dir.path().join(&name)),
                "",
            )
            .ok()
            .stdout;
            assert!(
                shown.contains(&format!("{binary}-{sub}")),
                "man -l {name} shows:\n{shown}"
            );
        }
        // Hidden commands (`man` itself, the daemon's internal `session-exec`) get no page.
        assert!(!pages.iter().any(|p| p.ends_with("-man.1")), "{pages:?}");
        assert!(
            !pages.iter().any(|p| p.contains("session-exec")),
            "{pages:?}"
        );
        assert!(!pages.iter().any(|p| p.contains("-help")), "{pages:?}");
    }
}

/// A name is one path segment: `sallyctl rm user/../roles/editor` once reached
/// `/v1/users/../roles/editor`, which the URL parser folds to `/v1/roles/editor`, and removed
/// the editor role. Every path now comes from `core::routes`, which percent-encodes the name.
#[test]
fn a_name_cannot_climb_out_of_its_path() {
    let c = Cluster::start();
    c.sallyctl(&["rm", "user/../roles/editor"])
        .fails_with("user ../roles/editor does not exist");
    c.sallyctl(&["rm", "role/../users/admin"])
        .fails_with("does not exist");
    let roles = c.sallyctl(&["get", "roles"]).ok().stdout;
    assert!(roles.contains("editor"), "{roles}");
    c.sallyctl(&["get", "user/../roles"])
        .fails_with("does not exist");
}
