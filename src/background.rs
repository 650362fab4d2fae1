//! A background task owned by whoever started it: dropping the [`Background`] aborts
//! the task, so a server's watchers, probes and streams end with the server (and a
//! test's with the test) instead of outliving it.

use std::future::Future;

use tokio::task::JoinHandle;

/// A spawned task that ends when this value is dropped.
#[derive(Debug)]
pub struct Background(JoinHandle<()>);

impl Background {
    /// Spawns `task` on the current Tokio runtime (so must be called inside one).
    pub fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(tokio::spawn(task))
    }

    /// Takes ownership of a task already spawned.
    pub fn own(handle: JoinHandle<()>) -> Self {
        Self(handle)
    }

    /// Waits for the task to end on its own (or to be aborted).
    pub async fn join(mut self) -> Result<(), tokio::task::JoinError> {
        (&mut self.0).await
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.0.abort();
    }
}
