//! The AWS event-stream framing of SageMaker's and Bedrock's streamed answers: messages read
//! as the bytes arrive, each checked by the AWS SDK's reader (lengths and CRCs).

use super::http;
use super::link::UpstreamError;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;

/// The largest event-stream message taken (AWS sends at most 16 MiB and a prelude).
const MAX_MESSAGE: usize = 24 << 20;

/// One event-stream message: its `:message-type`, `:event-type` (or `:exception-type`) and
/// payload.
pub(super) struct Message {
    pub(super) kind: String,
    pub(super) event: String,
    pub(super) payload: Vec<u8>,
}

/// Reads event-stream messages from the bytes as they arrive.
#[derive(Default)]
pub(super) struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message (None: more bytes are needed), or why the framing is broken.
    pub(super) fn next(&mut self) -> Result<Option<Message>, String> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let total =
            u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if !(16..=MAX_MESSAGE).contains(&total) {
            return Err(format!("an event-stream message of {total} bytes"));
        }
        if self.buf.len() < total {
            return Ok(None);
        }
        let m = aws_smithy_eventstream::frame::read_message_from(&self.buf[..total])
            .map_err(|e| format!("an event-stream message does not read: {e}"))?;
        self.buf.drain(..total);
        let header = |name: &str| {
            m.headers()
                .iter()
                .find(|h| h.name().as_str() == name)
                .and_then(|h| h.value().as_string().ok())
                .map(|s| s.as_str().to_string())
        };
        let kind = header(":message-type").unwrap_or_else(|| "event".into());
        let event = header(":event-type")
            .or_else(|| header(":exception-type"))
            .unwrap_or_default();
        Ok(Some(Message {
            kind,
            event,
            payload: m.payload().to_vec(),
        }))
    }

    /// Bytes left over that make no whole message.
    pub(super) fn rest(&self) -> usize {
        self.buf.len()
    }
}

/// The event-stream messages of a response's body, as they arrive.
pub(super) struct Messages {
    bytes: BoxStream<'static, Result<Vec<u8>, UpstreamError>>,
    frames: Frames,
    name: String,
}

impl Messages {
    pub(super) fn new(
        bytes: BoxStream<'static, Result<Vec<u8>, UpstreamError>>,
        name: &str,
    ) -> Self {
        Messages {
            bytes,
            frames: Frames::default(),
            name: name.to_string(),
        }
    }

    /// The next message; None where the body ended between messages. A body that breaks off
    /// (or ends inside a message), or framing that does not read, is the error.
    pub(super) async fn next(&mut self) -> Option<Result<Message, UpstreamError>> {
        loop {
            match self.frames.next() {
                Ok(Some(m)) => return Some(Ok(m)),
                Ok(None) => {}
                Err(e) => return Some(Err(http::stream_error(&self.name, e))),
            }
            match self.bytes.next().await {
                Some(Ok(b)) => self.frames.push(&b),
                Some(Err(e)) => return Some(Err(e)),
                None if self.frames.rest() == 0 => return None,
                None => {
                    let e = "its event stream broke off inside a message".to_string();
                    return Some(Err(http::stream_error(&self.name, e)));
                }
            }
        }
    }
}

impl Message {
    /// An `exception` message as the client's error (its type and AWS's `message`).
    pub(super) fn error(&self, name: &str) -> UpstreamError {
        let said = serde_json::from_slice::<serde_json::Value>(&self.payload)
            .ok()
            .and_then(|v| {
                v["message"]
                    .as_str()
                    .or(v["Message"].as_str())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| http::quote(&String::from_utf8_lossy(&self.payload)));
        http::stream_error(name, format!("failed midway: {}: {said}", self.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_in_pieces() {
        use aws_smithy_types::event_stream::{Header, HeaderValue, Message as M};
        let m = M::new(&b"{\"x\":1}"[..])
            .add_header(Header::new(
                ":message-type",
                HeaderValue::String("event".into()),
            ))
            .add_header(Header::new(
                ":event-type",
                HeaderValue::String("PayloadPart".into()),
            ));
        let mut bytes = Vec::new();
        aws_smithy_eventstream::frame::write_message_to(&m, &mut bytes).unwrap();
        let mut f = Frames::default();
        f.push(&bytes[..7]);
        assert!(f.next().unwrap().is_none());
        f.push(&bytes[7..]);
        let got = f.next().unwrap().unwrap();
        assert_eq!(
            (got.kind.as_str(), got.event.as_str()),
            ("event", "PayloadPart")
        );
        assert_eq!(got.payload, b"{\"x\":1}");
        assert_eq!(f.rest(), 0);
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 1] ^= 1;
        let mut f = Frames::default();
        f.push(&bad);
        assert!(f.next().is_err(), "a bad CRC is refused");
    }
}
