//! A config file in a directory of its own, for tests that run the binary.

use std::path::PathBuf;

/// A config file in a temporary directory, removed when dropped.
pub struct ConfigFile(PathBuf);

impl ConfigFile {
    pub fn new(text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("idemgate-test-config-{:016x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("idemgate.toml");
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
