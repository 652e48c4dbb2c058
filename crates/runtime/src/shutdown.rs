//! Stopping the parts of one process together: each part gets a future
//! that resolves once a shared watch flag turns true.

/// Resolves once `stop` turns true: one part's shutdown signal.
pub fn stopped(stop: &tokio::sync::watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = stop.clone();
    async move {
        let _ = rx.wait_for(|stop| *stop).await;
    }
}
