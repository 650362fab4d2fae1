//! A future its caller polls in place, whose rest moves to a task of its own if the
//! caller drops it unfinished ([`Detachable`]): for work that must run to its end
//! (calls in flight and the refunds they may owe, the race's) without a task and a
//! cross-thread wake-up per request. (A task for every request cost a spawn and a
//! wake-up across threads each.)

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

/// See the module docs.
pub struct Detachable<F: Future + Send + 'static>(Option<Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: Future + Send + 'static> Detachable<F>
where
    F::Output: Send,
{
    pub fn new(work: F) -> Self {
        Self(Some(Box::pin(work)))
    }
}

impl<F: Future + Send + 'static> Future for Detachable<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let work = self
            .0
            .as_mut()
            .expect("a Detachable is not polled after it finished");
        let output = ready!(work.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(output)
    }
}

impl<F: Future + Send + 'static> Drop for Detachable<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        // Dropped while its own poll panics: the rest would only panic again.
        if std::thread::panicking() {
            return;
        }
        if let Some(rest) = self.0.take() {
            // A store only runs on a runtime; without one (shutting down) there is
            // nothing left to run the rest on, as there was for a spawned task.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(rest);
            }
        }
    }
}
