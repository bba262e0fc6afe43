//! When each sandbox was last used through the API, for the idle reaper (Dawn's: a sandbox
//! nobody used for `--idle-timeout` is given back). A use is any request to the sandbox's routes
//! (commands, files, code, its ports), counted from its start until its response body ended,
//! so a stream or download in progress keeps the sandbox busy however long it lasts.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;

use crate::store::now_ms;

#[derive(Default)]
pub struct Activity {
    /// Sandbox id → (last use ended or began, Unix ms; uses in progress).
    map: Mutex<HashMap<String, (i64, u32)>>,
}

/// A use in progress; its end is when it is dropped.
pub struct Use {
    activity: Arc<Activity>,
    id: String,
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (i64, u32)>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn begin(self: &Arc<Self>, id: &str) -> Use {
        let mut m = self.lock();
        let e = m.entry(id.to_owned()).or_insert((0, 0));
        e.0 = now_ms();
        e.1 += 1;
        Use { activity: self.clone(), id: id.to_owned() }
    }

    /// Notes a use that has no duration (an acquire, a create).
    pub fn touch(&self, id: &str) {
        self.lock().entry(id.to_owned()).or_insert((0, 0)).0 = now_ms();
    }

    /// The last use, and whether one is in progress now.
    pub fn of(&self, id: &str) -> Option<(i64, bool)> {
        self.lock().get(id).map(|(t, n)| (*t, *n > 0))
    }

    pub fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}

impl Drop for Use {
    fn drop(&mut self) {
        let mut m = self.activity.lock();
        if let Some(e) = m.get_mut(&self.id) {
            e.0 = now_ms();
            e.1 = e.1.saturating_sub(1);
        }
    }
}

/// A response body that holds a guard (its request's [`Use`], or its connection's request in
/// flight) until it has been sent or dropped.
pub struct Held<G> {
    inner: Body,
    _guard: G,
}

impl<G: Unpin + Send + 'static> Held<G> {
    pub fn wrap(inner: Body, guard: G) -> Body {
        Body::new(Held { inner, _guard: guard })
    }
}

impl<G: Unpin> http_body::Body for Held<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
