//! A response body made of buffers sent one after another (the JSON header, then each binary
//! output), so output tensors are never copied into one contiguous body.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Buffers sent in order, with an exact length (so the response has a `Content-Length`).
pub(crate) struct ChunkBody {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl ChunkBody {
    pub(crate) fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        let chunks: VecDeque<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Self { chunks, remaining }
    }
}

impl Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.chunks.pop_front();
        if let Some(c) = &next {
            self.remaining -= c.len() as u64;
        }
        Poll::Ready(next.map(|c| Ok(Frame::data(c))))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// A `/generate_stream` body: the first event, then one event per message of a response
/// stream, encoded as it arrives. Dropping the body (the client went away) drops the stream's
/// receiver, which the core sees as the request's cancellation.
pub(crate) struct EventBody {
    first: Option<Bytes>,
    rx: Option<tritium_server::ResponseStream>,
}

impl EventBody {
    /// `first` is sent at once; `rx` is read until its final message (`None` when `first` was
    /// the final one).
    pub(crate) fn new(first: Option<Bytes>, rx: Option<tritium_server::ResponseStream>) -> Self {
        Self { first, rx }
    }
}

impl Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        loop {
            let Some(rx) = self.rx.as_mut() else { return Poll::Ready(None) };
            match rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    self.rx = None;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(message)) => {
                    if message.is_last() {
                        self.rx = None;
                    }
                    if let Some(event) = crate::generate::event_of(message) {
                        return Poll::Ready(Some(Ok(Frame::data(event))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rx.is_none()
    }
}
