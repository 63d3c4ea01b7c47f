//! Files written whole: atomically, and with their mode from the first byte.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Replaces `path` with `data` atomically: written to `<path>.tmp`, created with `mode` (so a
/// key is never readable by others, not even for a moment), synced, then renamed over `path`.
/// A reader sees the old file or the new one, never a part; a failed write leaves the old one.
pub fn replace(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = tmp_path(path);
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// [`replace`] for a file only its owner may read (0600): keys, identities, state.
pub fn replace_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    replace(path, data, 0o600)
}

/// `<path>.tmp`, beside it (a rename never crosses file systems), and distinct for `x` and
/// `x.pub`.
fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_no_leftover() {
        let dir = std::env::temp_dir().join(format!("sallyport-files-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("key");
        assert!(replace_private(&path, b"one").is_ok());
        assert!(replace(&path, b"two", 0o644).is_ok());
        assert_eq!(std::fs::read(&path).ok().as_deref(), Some(&b"two"[..]));
        let mode = std::fs::metadata(&path).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o644));
        assert!(!tmp_path(&path).exists());
        // Into a directory that is not there: an error, nothing left behind.
        let missing = dir.join("no-such-dir").join("key");
        assert!(replace_private(&missing, b"x").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
