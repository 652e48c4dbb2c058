//! A checkpoint store written at most once per interval. Each write of the
//! checkpoint ConfigMap is an API-server write that wakes the DataFlow's
//! reconciler, so a processor committing many batches a second writes the
//! newest position once a second instead; the last one is written when the
//! interval is over (or at [`Debounced::flush`], at shutdown). A crash in
//! between reads a second of batches again, which at-least-once delivery
//! allows.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use sless_runtime::sync::Unpoisoned;
use tokio::time::Instant;

use super::{CheckpointError, CheckpointStore};

/// The seed's pace: one checkpoint write a second at most.
pub const INTERVAL: Duration = Duration::from_secs(1);

pub struct Debounced {
    inner: Arc<dyn CheckpointStore>,
    interval: Duration,
    state: Mutex<State>,
    /// Held across a write, so writes never overtake each other and a
    /// position never goes back.
    writing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    last_write: Option<Instant>,
    /// The newest position not written yet.
    pending: Option<String>,
    /// A delayed write is on its way.
    scheduled: bool,
}

impl Debounced {
    pub fn new(inner: Arc<dyn CheckpointStore>, interval: Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            interval,
            state: Mutex::new(State::default()),
            writing: tokio::sync::Mutex::new(()),
        })
    }

    /// Writes the newest pending position now, if there is one.
    pub async fn flush(&self) -> Result<(), CheckpointError> {
        let _writing = self.writing.lock().await;
        let Some(position) = self.state.lock_unpoisoned().pending.take() else {
            return Ok(());
        };
        let written = self.inner.save(&position).await;
        let mut state = self.state.lock_unpoisoned();
        state.last_write = Some(Instant::now());
        if written.is_err() && state.pending.is_none() {
            // Tried again with the next save or flush.
            state.pending = Some(position);
        }
        written
    }

    /// A delayed write at the end of the interval.
    fn schedule(self: &Arc<Self>, at: Instant) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            this.state.lock_unpoisoned().scheduled = false;
            if let Err(error) = this.flush().await {
                tracing::warn!(%error, "cannot write the checkpoint; the next one will");
            }
        });
    }
}

#[async_trait]
impl CheckpointStore for Arc<Debounced> {
    async fn load(&self) -> Result<Option<String>, CheckpointError> {
        self.inner.load().await
    }

    async fn save(&self, position: &str) -> Result<(), CheckpointError> {
        let now = Instant::now();
        let due = {
            let mut state = self.state.lock_unpoisoned();
            state.pending = Some(position.to_owned());
            match state.last_write.map(|at| at + self.interval) {
                Some(next) if next > now => {
                    if !state.scheduled {
                        state.scheduled = true;
                        self.schedule(next);
                    }
                    false
                }
                _ => true,
            }
        };
        if due { self.flush().await } else { Ok(()) }
    }

    async fn save_now(&self, position: &str) -> Result<(), CheckpointError> {
        self.state.lock_unpoisoned().pending = Some(position.to_owned());
        self.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the writes and keeps the last.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    #[async_trait]
    impl CheckpointStore for Recorded {
        async fn load(&self) -> Result<Option<String>, CheckpointError> {
            Ok(self.0.lock_unpoisoned().last().cloned())
        }

        async fn save(&self, position: &str) -> Result<(), CheckpointError> {
            self.0.lock_unpoisoned().push(position.to_owned());
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn many_commits_a_second_write_once_a_second_and_the_last_is_never_lost() {
        let recorded = Arc::new(Recorded::default());
        let store = Debounced::new(recorded.clone(), INTERVAL);
        // 100 commits over half a second: the first is written at once,
        // the others wait for the interval.
        for i in 0..100 {
            store.save(&i.to_string()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(*recorded.0.lock_unpoisoned(), ["0"]);
        // At the end of the interval the newest one is written, once.
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(*recorded.0.lock_unpoisoned(), ["0", "99"]);
        assert_eq!(store.load().await.unwrap().as_deref(), Some("99"));

        // A commit just before shutdown is written by the flush.
        store.save("100").await.unwrap();
        store.save("101").await.unwrap();
        store.flush().await.unwrap();
        assert_eq!(recorded.0.lock_unpoisoned().last().map(String::as_str), Some("101"));
        let writes = recorded.0.lock_unpoisoned().len();
        // Nothing is left for the delayed write to do.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(recorded.0.lock_unpoisoned().len(), writes);
    }

    #[tokio::test(start_paused = true)]
    async fn a_position_saved_now_is_written_within_the_interval() {
        let recorded = Arc::new(Recorded::default());
        let store = Debounced::new(recorded.clone(), INTERVAL);
        store.save("0").await.unwrap();
        store.save("1").await.unwrap();
        assert_eq!(*recorded.0.lock_unpoisoned(), ["0"], "within the interval: deferred");
        store.save_now("2").await.unwrap();
        assert_eq!(*recorded.0.lock_unpoisoned(), ["0", "2"], "written before it returns");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            *recorded.0.lock_unpoisoned(),
            ["0", "2"],
            "nothing older written after it"
        );
    }
}
