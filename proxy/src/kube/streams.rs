//! An answer that streams (a watch, `logs -f`) lasts as long as the person keeps it: like an exec, it is
//! tracked as a live connection of its user and ended when the user is locked.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::Response;
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::sync::oneshot;

use crate::state::{HangUp, ProxyState};

struct EndWatch(Mutex<Option<oneshot::Sender<()>>>);

impl HangUp for EndWatch {
    fn hang_up(&self, _why: String) {
        if let Some(tx) = self.0.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(());
        }
    }
}

/// The body of a watch, which ends when its user is locked (and is forgotten when dropped).
struct Watched {
    inner: Body,
    stop: oneshot::Receiver<()>,
    state: Arc<ProxyState>,
    id: u64,
}

impl hyper::body::Body for Watched {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(Ok(())) = Pin::new(&mut self.stop).poll(cx) {
            return Poll::Ready(None);
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.state.untrack(self.id);
    }
}

/// `resp`, ended at once if `user` is locked while it streams.
pub fn until_locked(state: &Arc<ProxyState>, user: &str, resp: Response<Body>) -> Response<Body> {
    let (tx, rx) = oneshot::channel();
    let id = crate::state::next_id();
    state.track(id, user, Arc::new(EndWatch(Mutex::new(Some(tx)))));
    let (parts, inner) = resp.into_parts();
    Response::from_parts(
        parts,
        Body::new(Watched {
            inner,
            stop: rx,
            state: state.clone(),
            id,
        }),
    )
}
