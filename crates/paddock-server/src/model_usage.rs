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

/// What to send for a streamed completion: always with `stream_options.include_usage` set
/// (whatever the client set, so a stream cannot hide what it spent), and whether the answer's
/// usage-only event is to be hidden (the client did not ask for it). `Ok(None)` leaves the
/// request as it is; `Err` is a completion body that is not JSON, which is refused rather
/// than relayed uncounted.
pub fn ask_for_usage(path: &str, body: &[u8]) -> Result<Option<(Vec<u8>, bool)>, String> {
    if !takes_stream_options(path) {
        return Ok(None);
    }
    let mut v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("the request is not JSON the model route can read: {e}"))?;
    let Some(obj) = v.as_object_mut() else { return Ok(None) };
    if obj.get("stream") != Some(&serde_json::Value::Bool(true)) {
        return Ok(None);
    }
    let asked = obj.get("stream_options").and_then(|o| o.get("include_usage")) == Some(&serde_json::Value::Bool(true));
    if asked {
        return Ok(None);
    }
    let options = obj.entry("stream_options").or_insert_with(|| serde_json::json!({}));
    if !options.is_object() {
        *options = serde_json::json!({});
    }
    if let Some(o) = options.as_object_mut() {
        o.insert("include_usage".into(), serde_json::Value::Bool(true));
    }
    Ok(serde_json::to_vec(&v).ok().map(|b| (b, true)))
}

/// The most of an unfinished event held back before it is passed on as it is.
const MAX_PENDING: usize = 1 << 20;

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
    held_trailers: Option<Frame<Bytes>>,
}

impl<B> HideUsage<B> {
    pub fn new(inner: B) -> Self {
        Self { inner, pending: Vec::new(), ended: false, held_trailers: None }
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
            if let Some(trailers) = self.held_trailers.take() {
                return Poll::Ready(Some(Ok(trailers)));
            }
            if self.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        self.pending.extend_from_slice(&data);
                        let mut out = self.complete_events();
                        // An event that never ends is not held without bound: past this it
                        // passes on unfiltered (a usage event is a few hundred bytes).
                        if self.pending.len() > MAX_PENDING {
                            out.append(&mut self.pending);
                        }
                        // An empty frame could read as the end of a chunked body: never sent.
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(out)))));
                        }
                    }
                    Err(trailers) => {
                        // Data held back goes before the trailers; the trailers come next time.
                        let rest = std::mem::take(&mut self.pending);
                        if !rest.is_empty() && !usage_only(&rest) {
                            self.held_trailers = Some(trailers);
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from(rest)))));
                        }
                        return Poll::Ready(Some(Ok(trailers)));
                    }
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
    fn every_streamed_completion_asks_for_usage_and_hides_it_unless_the_client_asked() {
        let sent = |path, body: &[u8]| {
            let (b, hide) = ask_for_usage(path, body).unwrap().unwrap();
            (serde_json::from_slice::<serde_json::Value>(&b).unwrap(), hide)
        };
        let (v, hide) = sent("/v1/chat/completions", br#"{"model":"m","stream":true}"#);
        assert_eq!(
            (v["stream_options"]["include_usage"].clone(), v["model"].clone(), hide),
            (true.into(), "m".into(), true)
        );
        let (v, _) = sent("/v1/completions", br#"{"stream":true,"stream_options":{"x":1}}"#);
        assert_eq!(
            (v["stream_options"]["x"].clone(), v["stream_options"]["include_usage"].clone()),
            (1.into(), true.into())
        );
        // A client that says no, or sends options that are not an object, is counted anyway.
        for body in [
            &br#"{"stream":true,"stream_options":{"include_usage":false}}"#[..],
            br#"{"stream":true,"stream_options":null}"#,
        ] {
            let (v, hide) = sent("/v1/chat/completions", body);
            assert_eq!((v["stream_options"]["include_usage"].clone(), hide), (true.into(), true));
        }
        for (path, body) in [
            ("/v1/chat/completions", &br#"{"stream":true,"stream_options":{"include_usage":true}}"#[..]),
            ("/v1/chat/completions", br#"{"stream":false}"#),
            ("/v1/chat/completions", br#"{"model":"m"}"#),
            ("/v1/responses", br#"{"stream":true}"#),
            ("/v1/responses", b"not json"),
        ] {
            assert_eq!(ask_for_usage(path, body), Ok(None), "{path} {}", String::from_utf8_lossy(body));
        }
        assert!(ask_for_usage("/v1/chat/completions", b"{\"stream\": tru").is_err());
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
