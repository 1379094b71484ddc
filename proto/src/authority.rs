//! Serving gRPC on the kubelet's plugin-registration socket despite an invalid `:authority`.
//!
//! The kubelet's plugin watcher dials a registration socket by its bare path
//! (`grpc.DialContext("/var/lib/kubelet/plugins_registry/x-reg.sock")`, kubernetes
//! `pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go`, still so in 1.36), so
//! grpc-go sends that path as the HTTP/2 `:authority`. `h2`, under tonic, rejects it as a
//! malformed authority and resets the stream (`PROTOCOL_ERROR`); registration then never
//! succeeds (hyperium/h2#487, kubernetes/kubernetes#108254). The DRA socket itself is dialed as
//! `unix:<path>` and is not affected.
//!
//! [`incoming`] puts a small relay in front of tonic for each accepted connection: frames from
//! the kubelet are passed through, except that header blocks are HPACK-decoded, an `:authority`
//! that is not a valid URI authority is replaced by `localhost` (what grpc-go itself sends for
//! `unix:` targets), and the block is re-encoded. Frames towards the kubelet are copied as they are.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Connected;

/// HTTP/2 client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADERS: u8 = 0x1;
const FRAME_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE default; h2 keeps it unless configured.
const MAX_FRAME: usize = 16_384;
/// Relay buffer between the socket and tonic.
const PIPE_BYTES: usize = 64 * 1024;

/// A connection as tonic sees it: the tonic end of the relay.
pub struct RelayedStream(DuplexStream);

impl Connected for RelayedStream {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for RelayedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for RelayedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Accepted connections of `listener`, each relayed with its `:authority` repaired; pass the
/// stream to `tonic::transport::Server::serve_with_incoming`.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<RelayedStream>> {
    tokio_stream::StreamExt::map(UnixListenerStream::new(listener), |conn| conn.map(relay))
}

/// Starts relaying `conn` and returns tonic's end.
fn relay(conn: UnixStream) -> RelayedStream {
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (conn_r, mut conn_w) = conn.into_split();
    let (mut theirs_r, theirs_w) = tokio::io::split(theirs);
    tokio::spawn(async move {
        // Errors end the connection; h2 on the other side sees EOF and cleans up.
        let _ = rewrite_client_frames(conn_r, theirs_w).await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut theirs_r, &mut conn_w).await;
        let _ = conn_w.shutdown().await;
    });
    RelayedStream(ours)
}

/// Copies client→server HTTP/2 frames from `r` to `w`, repairing `:authority` in header blocks.
pub async fn rewrite_client_frames<R, W>(mut r: R, mut w: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; PREFACE.len()];
    r.read_exact(&mut preface).await?;
    w.write_all(&preface).await?;
    if preface != PREFACE {
        // Not HTTP/2 with prior knowledge: let the server reject it.
        tokio::io::copy(&mut r, &mut w).await?;
        return Ok(());
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut encoder = loona_hpack::Encoder::new();
    // A header block in progress: (stream id, END_STREAM flag, fragments so far).
    let mut block: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match r.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload).await?;
        match kind {
            FRAME_HEADERS => {
                let fragment = header_fragment(flags, &payload)?;
                block = Some((stream, flags & FLAG_END_STREAM, fragment.to_vec()));
            }
            FRAME_CONTINUATION if block.is_some() => {
                block
                    .as_mut()
                    .expect("checked")
                    .2
                    .extend_from_slice(&payload);
            }
            _ => {
                w.write_all(&head).await?;
                w.write_all(&payload).await?;
                continue;
            }
        }
        if flags & FLAG_END_HEADERS != 0 {
            let (stream, end_stream, fragments) = block.take().expect("set above");
            let fixed = repair_block(&mut decoder, &mut encoder, &fragments)?;
            write_header_block(&mut w, stream, end_stream, &fixed).await?;
        }
        w.flush().await?;
    }
    w.shutdown().await
}

/// The header block fragment of a HEADERS frame payload (without padding and priority fields).
fn header_fragment(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP/2 HEADERS frame");
    let (mut start, mut end) = (0, payload.len());
    if flags & FLAG_PADDED != 0 {
        let pad = *payload.first().ok_or_else(bad)? as usize;
        start = 1;
        end = end.checked_sub(pad).ok_or_else(bad)?;
    }
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    payload.get(start..end).ok_or_else(bad)
}

/// Decodes a header block, replaces an invalid `:authority` by `localhost`, re-encodes it.
fn repair_block(
    decoder: &mut loona_hpack::Decoder<'_>,
    encoder: &mut loona_hpack::Encoder<'_>,
    block: &[u8],
) -> io::Result<Vec<u8>> {
    let mut headers = decoder
        .decode(block)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("HPACK: {e}")))?;
    for (name, value) in headers.iter_mut() {
        if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
            *value = b"localhost".to_vec();
        }
    }
    Ok(encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()))))
}

/// Writes `block` as one HEADERS frame, plus CONTINUATION frames if it exceeds the frame size.
async fn write_header_block<W: AsyncWrite + Unpin>(
    w: &mut W,
    stream: u32,
    end_stream: u8,
    block: &[u8],
) -> io::Result<()> {
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![block]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 {
            FRAME_HEADERS
        } else {
            FRAME_CONTINUATION
        };
        let mut flags = if i == 0 { end_stream } else { 0 };
        if i + 1 == chunks.len() {
            flags |= FLAG_END_HEADERS;
        }
        let len = (chunk.len() as u32).to_be_bytes();
        let id = stream.to_be_bytes();
        w.write_all(&[
            len[1], len[2], len[3], kind, flags, id[0], id[1], id[2], id[3],
        ])
        .await?;
        w.write_all(chunk).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = (payload.len() as u32).to_be_bytes();
        let id = stream.to_be_bytes();
        let mut f = vec![
            len[1], len[2], len[3], kind, flags, id[0], id[1], id[2], id[3],
        ];
        f.extend_from_slice(payload);
        f
    }

    /// Splits a client byte stream (after the preface) into header lists per HEADERS frame.
    fn decode_headers(mut bytes: &[u8]) -> Vec<Vec<(String, String)>> {
        let mut decoder = loona_hpack::Decoder::new();
        let mut out = vec![];
        bytes = &bytes[PREFACE.len()..];
        while bytes.len() >= 9 {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let (kind, payload) = (bytes[3], &bytes[9..9 + len]);
            if kind == FRAME_HEADERS {
                let h = decoder.decode(payload).unwrap();
                out.push(
                    h.into_iter()
                        .map(|(n, v)| {
                            (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap())
                        })
                        .collect(),
                );
            }
            bytes = &bytes[9 + len..];
        }
        out
    }

    async fn run(input: Vec<u8>) -> Vec<u8> {
        let mut out = Vec::new();
        rewrite_client_frames(input.as_slice(), &mut out)
            .await
            .unwrap();
        out
    }

    #[tokio::test]
    async fn socket_path_authority_becomes_localhost_and_the_rest_is_kept() {
        let mut enc = loona_hpack::Encoder::new();
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/mig.das.com-reg.sock",
            ),
            (b"content-type", b"application/grpc"),
        ];
        let block1 = enc.encode(headers.clone());
        // The second request reuses the dynamic table (indexed :authority), as grpc-go does.
        let block2 = enc.encode(headers);
        let mut input = PREFACE.to_vec();
        input.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block1));
        input.extend(frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0")); // DATA
        // Padded HEADERS split over a CONTINUATION frame.
        let mut padded = vec![3u8];
        padded.extend_from_slice(&block2[..4]);
        padded.extend_from_slice(&[0, 0, 0]);
        input.extend(frame(
            FRAME_HEADERS,
            FLAG_PADDED | FLAG_END_STREAM,
            3,
            &padded,
        ));
        input.extend(frame(FRAME_CONTINUATION, FLAG_END_HEADERS, 3, &block2[4..]));

        let out = run(input).await;
        let blocks = decode_headers(&out);
        assert_eq!(blocks.len(), 2);
        for h in &blocks {
            let auth: Vec<_> = h
                .iter()
                .filter(|(n, _)| n == ":authority")
                .map(|(_, v)| v.as_str())
                .collect();
            assert_eq!(auth, ["localhost"]);
            assert!(h.contains(&(
                ":path".into(),
                "/pluginregistration.Registration/GetInfo".into()
            )));
        }
        // Frames other than headers pass through byte for byte.
        assert!(
            out.windows(14)
                .any(|w| w == frame(0x0, FLAG_END_STREAM, 1, b"\0\0\0\0\0").as_slice())
        );
        // END_STREAM of the second request survives the rewrite.
        let second = out
            .windows(5)
            .position(|w| w[3] == FRAME_HEADERS && w[4] & FLAG_END_STREAM != 0);
        assert!(second.is_some());
    }

    #[tokio::test]
    async fn valid_authority_is_untouched() {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode(vec![(
            b":authority".as_slice(),
            b"localhost:50051".as_slice(),
        )]);
        let mut input = PREFACE.to_vec();
        input.extend(frame(FRAME_HEADERS, FLAG_END_HEADERS, 1, &block));
        let blocks = decode_headers(&run(input).await);
        assert_eq!(
            blocks,
            vec![vec![(
                ":authority".to_string(),
                "localhost:50051".to_string()
            )]]
        );
    }

    #[tokio::test]
    async fn non_http2_input_is_copied_verbatim() {
        let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\nhello world".to_vec();
        assert_eq!(run(input.clone()).await, input);
    }
}
