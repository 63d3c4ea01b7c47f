//! What a recorded session may do to the terminal of the person replaying it.
//!
//! A recording is whatever a node sent, so it is hostile input to its viewer: an OSC 52 sequence
//! writes the viewer's clipboard, a device-status or window report request (`CSI 6n`, `CSI 21t`)
//! makes the viewer's terminal *type* an answer into whatever runs next, OSC 0/2 set titles, OSC 8
//! makes links, DCS/APC/PM/SOS strings reach terminal extensions, and C1 controls (`U+009B`,
//! `U+009D`) are CSI and OSC to terminals that honour them. [`Filter`] passes text, colours and
//! cursor motion (so a replay of `vim` or `top` still looks right) and drops every other control
//! sequence whole.
//!
//! It is a state machine over characters fed in pieces of any size: a sequence split across two
//! `o` events of a recording (or two reads of a stream) is recognised as one, which a per-event
//! filter cannot do. It never buffers more than [`MAX_PARAMS`] characters of one sequence.

/// Parameters kept for one CSI sequence; a longer one is dropped whole (nothing legitimate is).
pub const MAX_PARAMS: usize = 64;

/// `CSI` final characters that only draw: cursor motion, erasing, inserting and deleting,
/// scrolling, colours and attributes (`m`), margins, cursor save/restore.
const DRAWING_FINALS: &str = "@ABCDEFGHIJKLMPSTXZ`abdefmrsu";

/// DEC private modes (`CSI ? n h`/`l`) that only change what is drawn: cursor keys and mouse
/// reporting (which change what the viewer's keyboard and mouse send) are not among them.
const DRAWING_MODES: &[&str] = &["7", "12", "25", "47", "1047", "1048", "1049"];

/// Restores what a replay may have left changed: attributes, character set, a hidden cursor.
pub const RESET: &str = "\x1b[0m\x1b(B\x1b[?25h";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum State {
    #[default]
    Ground,
    /// After ESC.
    Escape,
    /// After ESC and an intermediate (`(`, `)`, `#`, ...): one more character ends it.
    EscapeIntermediate { keep: Option<char> },
    /// Inside `CSI`; `keep` is false once the sequence is known to be dropped.
    Csi { keep: bool },
    /// Inside an OSC, DCS, APC, PM or SOS string, all dropped; `esc` after an ESC (maybe ST).
    String { esc: bool },
}

/// Filters a stream of terminal output for replay; see the module documentation.
#[derive(Debug, Default)]
pub struct Filter {
    state: State,
    /// The parameters and intermediates of the CSI sequence being read.
    params: String,
}

impl Filter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends to `out` what of `text` may reach the viewer's terminal.
    pub fn feed(&mut self, text: &str, out: &mut String) {
        for c in text.chars() {
            self.step(c, out);
        }
    }

    /// Convenience for one piece: the filtered text.
    pub fn filter(&mut self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        self.feed(text, &mut out);
        out
    }

    fn step(&mut self, c: char, out: &mut String) {
        match self.state {
            State::Ground => self.ground(c, out),
            State::Escape => self.escape(c, out),
            State::EscapeIntermediate { keep } => {
                // `ESC ( B` and `ESC ( 0` (ASCII and line drawing, which ncurses uses) draw;
                // other designations and `ESC #` alignment tests are dropped.
                if let Some(i) = keep
                    && matches!(c, 'B' | '0')
                {
                    out.push('\x1b');
                    out.push(i);
                    out.push(c);
                }
                self.state = if c == '\x1b' {
                    State::Escape
                } else {
                    State::Ground
                };
            }
            State::Csi { keep } => self.csi(c, keep, out),
            State::String { esc } => {
                self.state = match c {
                    '\x07' | '\u{9c}' => State::Ground,
                    '\\' if esc => State::Ground,
                    '\x1b' => State::String { esc: true },
                    _ => State::String { esc: false },
                };
            }
        }
    }

    fn ground(&mut self, c: char, out: &mut String) {
        match c {
            '\x1b' => self.state = State::Escape,
            // C1 introducers: CSI, and the string controls DCS, SOS, OSC, PM, APC. Most UTF-8
            // terminals showed them as nothing, some obey them: drop the sequence whole.
            '\u{9b}' => {
                self.begin_csi();
                self.state = State::Csi { keep: false };
            }
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => {
                self.state = State::String { esc: false }
            }
            // Bell, backspace, tab, line feed, carriage return draw; other C0 and C1 controls
            // (ENQ asks for an answerback, SO/SI switch character sets) are dropped.
            '\x07' | '\x08' | '\t' | '\n' | '\r' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }

    fn escape(&mut self, c: char, out: &mut String) {
        self.state = State::Ground;
        match c {
            '[' => self.begin_csi(),
            ']' | 'P' | '_' | '^' | 'X' => self.state = State::String { esc: false },
            '(' | ')' => self.state = State::EscapeIntermediate { keep: Some(c) },
            ' '..='/' => self.state = State::EscapeIntermediate { keep: None },
            // Save and restore the cursor, index, next line, reverse index.
            '7' | '8' | 'D' | 'E' | 'M' => {
                out.push('\x1b');
                out.push(c);
            }
            '\x1b' => self.state = State::Escape,
            // Anything else after ESC (a full reset, keypad modes, ...) is dropped.
            _ => {}
        }
    }

    fn begin_csi(&mut self) {
        self.params.clear();
        self.state = State::Csi { keep: true };
    }

    fn csi(&mut self, c: char, keep: bool, out: &mut String) {
        match c {
            // Parameters and intermediates.
            '\u{20}'..='\u{3f}' => {
                if self.params.len() >= MAX_PARAMS {
                    self.state = State::Csi { keep: false };
                } else if keep {
                    self.params.push(c);
                }
            }
            // The final character.
            '\u{40}'..='\u{7e}' => {
                self.state = State::Ground;
                if keep && self.draws(c) {
                    out.push_str("\x1b[");
                    out.push_str(&self.params);
                    out.push(c);
                }
                self.params.clear();
            }
            // A control inside a sequence: ESC starts over (as terminals do); CAN and SUB
            // abort it; others are dropped.
            '\x1b' => self.state = State::Escape,
            '\x18' | '\x1a' => self.state = State::Ground,
            _ => {}
        }
    }

    /// Whether `CSI params final` only draws.
    fn draws(&self, last: char) -> bool {
        let p = self.params.as_str();
        let plain = p
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b';' || b == b':');
        match last {
            'h' | 'l' => p
                .strip_prefix('?')
                .is_some_and(|modes| modes.split(';').all(|m| DRAWING_MODES.contains(&m))),
            _ => plain && DRAWING_FINALS.contains(last),
        }
    }
}

/// `s` with every control character written as an escape (`\u{1b}`), for one-line listings of
/// things a user or a node chose, such as a session's command.
pub fn escape_controls(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Filters `input` whole and cut at every position into two pieces: the result must not
    /// depend on where an event boundary falls.
    fn filtered(input: &str) -> String {
        let whole = Filter::new().filter(input);
        for (i, _) in input.char_indices().skip(1) {
            let mut f = Filter::new();
            let mut out = String::new();
            f.feed(&input[..i], &mut out);
            f.feed(&input[i..], &mut out);
            assert_eq!(out, whole, "cut at {i} of {input:?}");
        }
        whole
    }

    #[test]
    fn drawing_passes_unchanged() {
        for keep in [
            "plain text, ünïcödé ✓\r\n",
            "\x1b[1;31mred\x1b[0m \x1b[38;2;255;0;0mtrue colour\x1b[m",
            "\x1b[38:5:208morange",
            "\x1b[H\x1b[2J\x1b[10;20H\x1b[K\x1b[3A\x1b[5C",
            "\x1b[?1049h\x1b[?25l vim \x1b[?25h\x1b[?1049l",
            "\x1b[1;24r\x1b7saved\x1b8\x1bM",
            "\x1b(0lqk\x1b(B",
            "tab\tbell\x07back\x08",
        ] {
            assert_eq!(filtered(keep), keep);
        }
    }

    #[test]
    fn sequences_that_act_on_the_viewer_are_dropped_whole() {
        let cases = [
            // OSC 52: write the viewer's clipboard (BEL- and ST-terminated).
            ("a\x1b]52;c;ZWNobyBwd25lZA==\x07b", "ab"),
            ("a\x1b]52;c;ZWNobyBwd25lZA==\x1b\\b", "ab"),
            // Titles and hyperlinks.
            ("\x1b]0;evil title\x07x", "x"),
            (
                "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
                "click",
            ),
            // C1 OSC and CSI, and a C1 string terminator.
            ("\u{9d}52;c;aGk=\u{9c}ok", "ok"),
            ("\u{9b}6nok", "ok"),
            ("\u{9b}31mred", "red"),
            // Reports the terminal would type back: device status, attributes, window ops.
            ("\x1b[6n\x1b[c\x1b[>c\x1b[21t\x1b[14tok", "ok"),
            // Modes that change what the viewer's keyboard and mouse send.
            ("\x1b[?1h\x1b[?1000h\x1b[?2004h\x1b[?25;1000hok", "ok"),
            // DCS (e.g. DECRQSS, tmux passthrough), APC, PM, SOS.
            (
                "\x1bP$qm\x1b\\\x1b_apc\x1b\\\x1b^pm\x1b\\\x1bXsos\x1b\\ok",
                "ok",
            ),
            // Full reset, keypad mode, other character sets, ENQ, shift out.
            ("\x1bc\x1b=\x1b(K\x05\x0eok", "ok"),
            // Intermediates in CSI (DECSCUSR, soft reset) and non-numeric parameters.
            ("\x1b[2 q\x1b[!p\x1b[>4;1mok", "ok"),
        ];
        for (input, want) in cases {
            assert_eq!(filtered(input), want, "{input:?}");
        }
    }

    #[test]
    fn a_sequence_split_across_events_is_still_one_sequence() {
        // The old per-event filter let this through: ESC at the end of one event, `]52;...` in
        // the next.
        let mut f = Filter::new();
        let mut out = String::new();
        f.feed("before\x1b", &mut out);
        f.feed("]52;c;ZXZpbA==", &mut out);
        f.feed("\x07after", &mut out);
        assert_eq!(out, "beforeafter");
    }

    #[test]
    fn memory_is_bounded_by_a_sequence_never_ending() {
        let mut f = Filter::new();
        let long = "1;".repeat(10_000);
        assert_eq!(f.filter(&format!("\x1b[{long}mafter")), "after");
        assert!(f.params.capacity() <= 4 * MAX_PARAMS);
        let mut f = Filter::new();
        assert_eq!(f.filter(&format!("\x1b]{}", "x".repeat(100_000))), "");
        assert!(f.params.is_empty());
    }

    #[test]
    fn listings_escape_controls() {
        assert_eq!(
            escape_controls("echo \x1b]52;c;x\x07; ls\n\u{9b}"),
            "echo \\u{1b}]52;c;x\\u{7}; ls\\u{a}\\u{9b}"
        );
        assert_eq!(escape_controls("plain ü"), "plain ü");
    }
}
