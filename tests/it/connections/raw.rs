//! HTTP/2 written by hand, as a hostile client writes it: the preface, then HEADERS
//! frames opening streams that never send a body, as fast as the socket takes them,
//! ignoring the server's SETTINGS_MAX_CONCURRENT_STREAMS (a well-behaved client, the
//! `h2` crate's, would wait for room). A second thread reads what the server sends
//! back and counts the frames that matter: RST_STREAM and GOAWAY.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_HEADERS: u8 = 0x4;

/// What the server sent back on the flooded connection.
#[derive(Debug, Default)]
pub struct Answered {
    pub resets: usize,
    pub goaway: bool,
    /// The server closed the connection.
    pub closed: bool,
}

/// One connection's flood: streams opened, and the reader of the server's frames.
pub struct Flood {
    pub opened: usize,
    /// Streams the server reset so far (RST_STREAM frames).
    pub resets: Arc<AtomicUsize>,
    stream: TcpStream,
    reader: JoinHandle<Answered>,
}

impl Flood {
    /// Opens `streams` streams on a new connection to `port`, each a gRPC call of
    /// ShouldRateLimit whose body never comes; stops early when the server closes the
    /// connection.
    pub fn open(port: u16, streams: usize) -> Flood {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        let resets = Arc::new(AtomicUsize::new(0));
        let reader = {
            let (stream, resets) = (stream.try_clone().expect("clone"), resets.clone());
            std::thread::spawn(move || read_frames(stream, &resets))
        };
        stream.write_all(PREFACE).expect("preface");
        stream
            .write_all(&frame(SETTINGS, 0, 0, &[]))
            .expect("settings");
        let block = grpc_headers();
        let mut opened = 0;
        // In batches, so the socket sees large writes, as a flood does.
        for batch in (0..streams).collect::<Vec<_>>().chunks(1000) {
            let mut bytes = Vec::with_capacity(batch.len() * (block.len() + 9));
            for &i in batch {
                // Client streams are odd, increasing.
                let id = 1 + 2 * u32::try_from(i).expect("fits");
                bytes.extend(frame(HEADERS, END_HEADERS, id, &block));
            }
            if stream.write_all(&bytes).is_err() {
                break;
            }
            opened += batch.len();
        }
        Flood {
            opened,
            resets,
            stream,
            reader,
        }
    }

    /// Waits (bounded) for the server to close the connection; what it sent.
    pub fn answered_within(self, within: Duration) -> Answered {
        let deadline = std::time::Instant::now() + within;
        while !self.reader.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Still open: close it ourselves, so the reader ends.
        let _ = self.stream.shutdown(Shutdown::Both);
        self.reader.join().expect("the reader")
    }

    /// Closes the connection from this side.
    pub fn close(self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        let _ = self.reader.join();
    }
}

/// Reads frames until the connection ends. Nothing is written back (the server's
/// SETTINGS go unacknowledged: it processes HEADERS without), so the writer thread
/// owns the socket's writes alone.
fn read_frames(mut stream: TcpStream, resets: &AtomicUsize) -> Answered {
    let mut answered = Answered::default();
    let mut head = [0u8; 9];
    loop {
        if stream.read_exact(&mut head).is_err() {
            answered.closed = true;
            return answered;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0; len];
        if stream.read_exact(&mut payload).is_err() {
            answered.closed = true;
            return answered;
        }
        match head[3] {
            RST_STREAM => {
                resets.fetch_add(1, Ordering::Relaxed);
                answered.resets += 1;
            }
            GOAWAY => answered.goaway = true,
            _ => {}
        }
    }
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut bytes = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// The HPACK block of a gRPC call of ShouldRateLimit: literal fields without
/// indexing (no dynamic table, no Huffman), names from the static table where it
/// has them.
fn grpc_headers() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    let literal = |block: &mut Vec<u8>, name: Result<u8, &str>, value: &str| {
        match name {
            Ok(index) if index < 15 => block.push(index),
            Ok(index) => block.extend([0x0f, index - 15]),
            Err(name) => {
                block.push(0);
                block.push(u8::try_from(name.len()).expect("short"));
                block.extend(name.as_bytes());
            }
        }
        block.push(u8::try_from(value.len()).expect("short"));
        block.extend(value.as_bytes());
    };
    let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    literal(&mut block, Ok(4), path); // :path
    literal(&mut block, Ok(1), "localhost"); // :authority
    literal(&mut block, Ok(31), "application/grpc"); // content-type
    literal(&mut block, Err("te"), "trailers");
    block
}
