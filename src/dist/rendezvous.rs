//! The rendezvous of a multi-process launch: rank 0 listens on `MASTER_ADDR:MASTER_PORT`, every
//! other rank connects and says who it is, and rank 0 hands each the same bytes (the NCCL
//! unique id, 128 bytes) once all `world_size - 1` have checked in. Plain TCP, no other
//! dependency; a file on a shared disk would do as well, this needs no shared disk.
//!
//! Protocol (little-endian): the rank sends `MAGIC`, its rank (u32) and the world size (u32);
//! rank 0 answers `0` then the payload length (u32) and the payload, or `1` then a message
//! length and a UTF-8 message saying why it refused (wrong world size, a rank twice).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Opens every hello, so a stray connection (a port scanner, another program) is refused.
const MAGIC: &[u8; 8] = b"FP8RDZV1";
/// The largest payload or message accepted (an NCCL unique id is 128 bytes).
const MAX_PAYLOAD: u32 = 1 << 16;

fn io_error(rank: usize, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Collective {
        op: "rendezvous",
        rank,
        reason: format!("{what}: {e}"),
    }
}

/// Rank 0's side: a bound listener, so the port is known (and taken) before the others dial.
pub struct RendezvousHost {
    listener: TcpListener,
}

impl RendezvousHost {
    /// Listens on `addr` (`host:port`; port 0 picks a free one, see [`Self::port`]).
    pub fn bind(addr: &str) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|e| io_error(0, &format!("cannot listen on {addr}"), e))?;
        Ok(RendezvousHost { listener })
    }

    /// The port listened on.
    pub fn port(&self) -> Result<u16> {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| io_error(0, "listener address", e))
    }

    /// Waits up to `timeout` for ranks `1..world_size`, each once, then sends every one `payload`.
    pub fn serve(&self, world_size: usize, payload: &[u8], timeout: Duration) -> Result<()> {
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(io_error(
                0,
                "payload",
                format!("{} bytes is over {MAX_PAYLOAD}", payload.len()),
            ));
        }
        let deadline = Instant::now() + timeout;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| io_error(0, "listener", e))?;
        let mut joined: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
        let mut waiting = world_size.saturating_sub(1);
        while waiting > 0 {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> = (1..world_size).filter(|&r| joined[r].is_none()).collect();
                        return Err(io_error(0, "timed out", format!("ranks {missing:?} never checked in")));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
                Err(e) => return Err(io_error(0, "accept", e)),
            };
            let mut stream = stream;
            stream.set_nonblocking(false).map_err(|e| io_error(0, "stream", e))?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            stream
                .set_read_timeout(Some(left))
                .map_err(|e| io_error(0, "stream", e))?;
            let Ok((rank, world)) = read_hello(&mut stream) else {
                continue; // not one of ours: ignore it, keep waiting
            };
            let refusal = if world != world_size {
                Some(format!(
                    "rank {rank} says the world has {world} ranks, rank 0 says {world_size}"
                ))
            } else if rank == 0 || rank >= world_size {
                Some(format!("rank {rank} is not one of 1..{world_size}"))
            } else if joined[rank].is_some() {
                Some(format!("rank {rank} checked in twice"))
            } else {
                None
            };
            match refusal {
                Some(message) => {
                    let _ = send(&mut stream, 1, message.as_bytes());
                }
                None => {
                    joined[rank] = Some(stream);
                    waiting -= 1;
                }
            }
        }
        for (rank, stream) in joined.iter_mut().enumerate() {
            if let Some(stream) = stream {
                send(stream, 0, payload).map_err(|e| io_error(0, &format!("sending to rank {rank}"), e))?;
            }
        }
        Ok(())
    }
}

fn read_hello(stream: &mut TcpStream) -> std::io::Result<(usize, usize)> {
    let mut hello = [0u8; 16];
    stream.read_exact(&mut hello)?;
    if &hello[..8] != MAGIC {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "no magic"));
    }
    let rank = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
    let world = u32::from_le_bytes([hello[12], hello[13], hello[14], hello[15]]) as usize;
    Ok((rank, world))
}

fn send(stream: &mut TcpStream, status: u8, bytes: &[u8]) -> std::io::Result<()> {
    let mut message = vec![status];
    message.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    message.extend_from_slice(bytes);
    stream.write_all(&message)?;
    stream.flush()
}

/// A non-zero rank's side: dials `master` (retrying until rank 0 listens, up to `timeout`),
/// checks in as `rank` of `world_size`, and returns rank 0's payload.
pub fn join(master: &str, rank: usize, world_size: usize, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let addrs: Vec<_> = master
        .to_socket_addrs()
        .map_err(|e| io_error(rank, &format!("cannot resolve {master}"), e))?
        .collect();
    let mut stream = loop {
        let attempt = addrs
            .iter()
            .find_map(|a| TcpStream::connect_timeout(a, Duration::from_millis(200)).ok());
        match attempt {
            Some(stream) => break stream,
            None if Instant::now() >= deadline => {
                return Err(io_error(rank, "timed out", format!("nobody listens on {master}")));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let fail = |what: &str, e: std::io::Error| io_error(rank, what, e);
    stream.set_read_timeout(Some(left)).map_err(|e| fail("stream", e))?;
    let to_u32 = |v: usize, what: &'static str| {
        u32::try_from(v).map_err(|_| io_error(rank, what, format!("{v} does not fit the protocol")))
    };
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&to_u32(rank, "rank")?.to_le_bytes());
    hello.extend_from_slice(&to_u32(world_size, "world size")?.to_le_bytes());
    stream.write_all(&hello).map_err(|e| fail("check in", e))?;
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).map_err(|e| fail("answer", e))?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_PAYLOAD {
        return Err(io_error(rank, "answer", format!("{len} bytes is over {MAX_PAYLOAD}")));
    }
    let mut body = vec![0u8; len as usize];
    stream.read_exact(&mut body).map_err(|e| fail("answer", e))?;
    match head[0] {
        0 => Ok(body),
        _ => Err(io_error(rank, "refused by rank 0", String::from_utf8_lossy(&body))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_gets_rank_zeros_bytes_over_loopback() {
        let host = RendezvousHost::bind("127.0.0.1:0").unwrap();
        let master = format!("127.0.0.1:{}", host.port().unwrap());
        let id: Vec<u8> = (0..128u8).collect();
        let timeout = Duration::from_secs(20);
        let got = std::thread::scope(|s| {
            let joins: Vec<_> = (1..4)
                .map(|r| {
                    s.spawn({
                        let master = master.clone();
                        move || join(&master, r, 4, timeout)
                    })
                })
                .collect();
            host.serve(4, &id, timeout).unwrap();
            joins.into_iter().map(|j| j.join().unwrap()).collect::<Vec<_>>()
        });
        for bytes in got {
            assert_eq!(bytes.unwrap(), id);
        }
    }

    #[test]
    fn wrong_world_sizes_are_refused_and_missing_ranks_time_out() {
        let host = RendezvousHost::bind("127.0.0.1:0").unwrap();
        let master = format!("127.0.0.1:{}", host.port().unwrap());
        let short = Duration::from_millis(600);
        let (served, joined) = std::thread::scope(|s| {
            let j = s.spawn(|| join(&master, 1, 3, Duration::from_secs(5)));
            (host.serve(2, b"id", short), j.join().unwrap())
        });
        assert!(matches!(joined, Err(Error::Collective { reason, .. }) if reason.contains("3 ranks")));
        assert!(matches!(served, Err(Error::Collective { reason, .. }) if reason.contains("[1]")));
        let nobody = join("127.0.0.1:1", 1, 2, Duration::from_millis(100));
        assert!(nobody.is_err());
    }
}
