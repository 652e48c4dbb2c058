//! A checkpoint in a local file, for `sless processor` outside Kubernetes:
//! replaced atomically (write, fsync, rename, fsync the directory), so a
//! crash leaves the old position or the new one, never a torn one.

use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::{CheckpointError, CheckpointStore};

pub struct FileCheckpoint {
    path: PathBuf,
}

impl FileCheckpoint {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    fn error(&self, source: std::io::Error) -> CheckpointError {
        CheckpointError::File {
            path: self.path.display().to_string(),
            source,
        }
    }

    /// Runs blocking file work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(PathBuf) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T, CheckpointError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || work(path))
            .await
            .map_err(|e| self.error(std::io::Error::other(e)))?
            .map_err(|e| self.error(e))
    }
}

fn replace(path: &Path, position: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(position.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[async_trait]
impl CheckpointStore for FileCheckpoint {
    async fn load(&self) -> Result<Option<String>, CheckpointError> {
        self.blocking(|path| match std::fs::read_to_string(path) {
            Ok(position) => Ok(Some(position)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
        .await
    }

    async fn save(&self, position: &str) -> Result<(), CheckpointError> {
        let position = position.to_owned();
        self.blocking(move |path| replace(&path, &position)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_saved_position_loads_back_and_a_missing_file_is_no_position() {
        let dir = std::env::temp_dir().join(format!("sless-cp-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let cp = FileCheckpoint::new(dir.join("flow.position"));
        assert_eq!(cp.load().await.unwrap(), None);
        cp.save("41").await.unwrap();
        cp.save("42").await.unwrap();
        assert_eq!(cp.load().await.unwrap().as_deref(), Some("42"));
        assert!(!dir.join("flow.tmp").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
