//! What a streamed model call spent, even when its client did not ask. OpenAI-style streams
//! report usage only with `stream_options.include_usage`; without it a tenant's model-token
//! quota could be streamed past. So the model route asks for it on the client's behalf and
//! takes the usage-only event back out of the stream, so the client sees what it asked for.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame};

/// Paths whose streams carry usage when asked (`chat/completions`, `completions`); others
/// (the Responses API) report it in their own final event, and refuse `stream_options`.
fn takes_stream_options(path: &str) -> bool {
    path.ends_with("/chat/completions") || path.ends_with("/completions")
}

/// The request to send instead of `body` when the route must ask for usage itself: a streamed
/// completion whose client did not set `stream_options.include_usage`. `None` leaves it as is.
pub fn ask_for_usage(path: &str, body: &[u8]) -> Option<Vec<u8>> {
    if !takes_stream_options(path) {
        return None;
    }
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    if obj.get("stream") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    let options = obj.entry("stream_options").or_insert_with(|| serde_json::json!({}));
    let options = options.as_object_mut()?;
    if options.contains_key("include_usage") {
        return None;
    }
    options.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&v).ok()
}

/// A server-sent event that only reports usage: `data: {…, "choices": [], "usage": {…}}`.
fn usage_only(event: &[u8]) -> bool {
    let text = String::from_utf8_lossy(event);
    let data: String = text.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
    serde_json::from_str::<serde_json::Value>(&data)
        .is_ok_and(|v| v["choices"].as_array().is_some_and(Vec::is_empty) && v["usage"].is_object())
}

/// The answer's body without its usage-only events. Whole events pass on as they complete;
/// a partial one waits for its end (events are small, and come whole in practice).
pub struct HideUsage<B> {
    inner: B,
    pending: Vec<u8>,
    ended: bool,
}

impl<B> HideUsage<B> {
    pub fn new(inner: B) -> Self {
        Self { inner, pending: Vec::new(), ended: false }
    }

    /// The complete events held, less usage-only ones; what follows the last stays held.
    fn complete_events(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let end = if self.pending[i..].starts_with(b"\n\n") {
                Some(i + 2)
            } else if self.pending[i..].starts_with(b"\r\n\r\n") {
                Some(i + 4)
            } else {
                None
            };
            match end {
                Some(end) => {
                    let event = &self.pending[start..end];
                    if !usage_only(event) {
                        out.extend_from_slice(event);
                    }
                    start = end;
                    i = end;
                }
                None => i += 1,
            }
        }
        self.pending.drain(..start);
        out
    }
}

impl<B> Body for HideUsage<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.pending.extend_from_slice(&data);
                        let out = self.complete_events();
                        // An empty frame could read as the end of a chunked body: never sent.
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
                },
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    self.ended = true;
                    let rest = std::mem::take(&mut self.pending);
                    if rest.is_empty() || usage_only(&rest) {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn usage_is_asked_for_only_where_the_client_did_not_and_the_api_takes_it() {
        let asked = ask_for_usage("/v1/chat/completions", br#"{"model":"m","stream":true}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&asked).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["model"], "m");
        let merged = ask_for_usage("/v1/completions", br#"{"stream":true,"stream_options":{"x":1}}"#).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&merged).unwrap();
        assert_eq!(
            (v["stream_options"]["x"].clone(), v["stream_options"]["include_usage"].clone()),
            (1.into(), true.into())
        );
        for (path, body) in [
            ("/v1/chat/completions", &br#"{"stream":true,"stream_options":{"include_usage":false}}"#[..]),
            ("/v1/chat/completions", br#"{"stream":false}"#),
            ("/v1/chat/completions", br#"{"model":"m"}"#),
            ("/v1/responses", br#"{"stream":true}"#),
            ("/v1/chat/completions", b"not json"),
        ] {
            assert_eq!(ask_for_usage(path, body), None, "{path} {}", String::from_utf8_lossy(body));
        }
    }

    #[tokio::test]
    async fn the_usage_only_event_is_taken_out_and_the_rest_passes_byte_exact() {
        let events = [
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":12}}\n\n",
            "data: [DONE]\n\n",
        ];
        let all: String = events.concat();
        // Split at every byte boundary pattern a network may give: three-byte frames.
        let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> =
            all.as_bytes().chunks(3).map(|c| Ok(Frame::data(Bytes::copy_from_slice(c)))).collect();
        let body = http_body_util::StreamBody::new(tokio_stream::iter(chunks));
        let out = HideUsage::new(body).collect().await.unwrap().to_bytes();
        assert_eq!(String::from_utf8_lossy(&out), [events[0], events[1], events[3]].concat());
    }
}
