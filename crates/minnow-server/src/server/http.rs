//! Response bodies and small response builders. A body is either a complete buffer or a channel
//! of chunks (SSE); when hyper drops a channel body because the client went away, the sender
//! notices (`Sender::closed`) and the generation behind it is cancelled.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Frame;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::Value;
use tokio::sync::mpsc;

use super::errors::ApiError;

pub type Body = BoxBody<Bytes, Infallible>;

/// `body` with `guard` kept alive until the body has been sent in full (or dropped, when the
/// client leaves): how a request stays counted (in flight, admitted) while its response streams.
pub fn hold_until_sent<G: Send + Sync + Unpin + 'static>(body: Body, guard: G) -> Body {
    GuardedBody {
        inner: body,
        _guard: guard,
    }
    .boxed()
}

struct GuardedBody<G> {
    inner: Body,
    _guard: G,
}

impl<G: Unpin> hyper::body::Body for GuardedBody<G> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = Response::new(full(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub fn text_response(
    status: StatusCode,
    content_type: &'static str,
    text: String,
) -> Response<Body> {
    let mut response = Response::new(full(text));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.status, &error.to_json())
}

/// A streamed body fed by a bounded channel.
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// The body and the sender that feeds it. The channel is small: a slow client makes the
    /// producer wait instead of buffering a whole response in memory.
    pub fn channel() -> (mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = mpsc::channel(16);
        (tx, ChannelBody { rx }.boxed())
    }
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}
