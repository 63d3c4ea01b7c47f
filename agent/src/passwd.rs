//! Looking up a login on this host (`/etc/passwd`).

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
}

pub fn lookup(name: &str) -> Option<Login> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    parse(&text, name)
}

fn parse(text: &str, name: &str) -> Option<Login> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        let shell = if f[6].is_empty() { "/bin/sh" } else { f[6] };
        Some(Login {
            name: f[0].into(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].into(),
            shell: shell.into(),
        })
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_entries() {
        let text = "root:x:0:0:root:/root:/bin/bash\nbob:x:1000:1000::/home/bob:\nbad:line\n";
        let bob = super::parse(text, "bob");
        assert_eq!(
            bob.as_ref().map(|l| (l.uid, l.shell.as_str())),
            Some((1000, "/bin/sh"))
        );
        assert!(super::parse(text, "bad").is_none());
        assert!(super::parse(text, "ro").is_none());
    }
}
