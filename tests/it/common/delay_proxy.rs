//! A TCP proxy that makes a loopback link look like a long one: every byte is
//! delivered a fixed delay after it arrived, each way, in order (a link's latency, not
//! a slow one's bandwidth). It can also partition the link: bytes are held, on
//! connections open and new, until it heals, as a network partition holds a TCP
//! stream (its retransmits deliver once the path is back); nothing is lost or
//! reordered, so the protocol on top stays in step.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub struct DelayProxy {
    pub addr: SocketAddr,
    partitioned: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl DelayProxy {
    /// Listens on a loopback port of its own and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (partitioned, watch) = watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let watch = watch.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pump(client_read, server_write, delay, watch.clone()),
                        pump(server_read, client_write, delay, watch),
                    );
                });
            }
        });
        DelayProxy {
            addr,
            partitioned,
            accept,
        }
    }

    /// `redis://` URL of the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds (true) or delivers again (false) every byte, both ways.
    pub fn partition(&self, on: bool) {
        let _ = self.partitioned.send(on);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One direction: read as bytes come, deliver each chunk `delay` after it came and
/// not while partitioned.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
    mut partitioned: watch::Receiver<bool>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            if partitioned.wait_for(|p| !*p).await.is_err() {
                return;
            }
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
