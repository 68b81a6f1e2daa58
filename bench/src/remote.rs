//! The benchmark between two processes: `--role server` runs the echo side
//! of a link (memif, or a port from devargs such as a NIC) and takes its
//! orders over a TCP control connection from the `--role client` process,
//! which runs the pinger and prints the tables. The server keeps its port and
//! serves clients one after another, each with an echo thread of its own,
//! until it is stopped (or only the first with `--once`).
//!
//! The control protocol is one JSON object per line, request then answer:
//! `Hello` (each side's MACs, the MTU and whether the channels share one
//! queue pair), `Command` (switch the echo thread;
//! answered once it runs the new command), `Stop` (end streams back),
//! `Counters` (what the echo side received, on its own clock) and `Bye`.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use dpdk_ffi::{Eal, HugepageMode, Mempool};
use serde::{Deserialize, Serialize};

use crate::link::{End, Link, SideSpec};
use crate::session::{await_switch, spawn_echo, start_eal, two_cores, Cmd, Counters};

/// A request from the client.
#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Hello {
        macs: Vec<[u8; 6]>,
        mtu: u16,
        shared: bool,
    },
    Command(Cmd),
    Stop,
    Counters,
    Bye,
}

/// The server's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Hello { macs: Vec<[u8; 6]> },
    Running(u64),
    Done,
    Counters(Counters),
    Failed(String),
}

/// The client's end of the control connection.
pub struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    /// Connects to the server at `addr`, retrying for a few seconds while it
    /// starts. It listens once its port is open.
    pub fn connect(addr: &str) -> Result<Client, String> {
        let t = Instant::now();
        let stream = loop {
            match TcpStream::connect(addr) {
                Ok(s) => break s,
                Err(e) if t.elapsed() < Duration::from_secs(10) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(format!(
                        "cannot reach the emx-bench server at {addr}: {e} (start `emx-bench --role server` with the same --link first, or give --server)"
                    ))
                }
            }
        };
        let _ = stream.set_nodelay(true);
        Ok(Client {
            stream,
            buf: Vec::new(),
        })
    }

    /// Trades MACs, ours per channel in, the server's out, and checks that
    /// both sides run the same link.
    pub fn hello(
        &mut self,
        macs: &[[u8; 6]],
        mtu: u16,
        shared: bool,
    ) -> Result<Vec<[u8; 6]>, String> {
        match self.call(
            &Request::Hello {
                macs: macs.to_vec(),
                mtu,
                shared,
            },
            &mut || {},
        )? {
            Answer::Hello { macs } if macs.len() == 3 => Ok(macs),
            a => Err(format!("unexpected answer to hello: {a:?}")),
        }
    }

    /// Sends `req` and waits for the answer, calling `idle` while it waits
    /// (the pinger's inline engines must keep answering).
    fn call(&mut self, req: &Request, idle: &mut dyn FnMut()) -> Result<Answer, String> {
        let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        self.stream
            .set_nonblocking(false)
            .and_then(|()| self.stream.write_all(&line))
            .map_err(|e| format!("control connection: {e}"))?;
        self.stream
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                let a: Answer = serde_json::from_slice(&line)
                    .map_err(|e| format!("bad answer from the server: {e}"))?;
                if let Answer::Failed(e) = a {
                    return Err(format!("server: {e}"));
                }
                return Ok(a);
            }
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("the server closed the control connection".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    idle();
                    if t.elapsed() > Duration::from_secs(60) {
                        return Err("the server does not answer".into());
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("control connection: {e}")),
            }
        }
    }

    /// Switches the echo side to `cmd`; returns its generation.
    pub(crate) fn command(&mut self, cmd: Cmd, idle: &mut dyn FnMut()) -> Result<u64, String> {
        match self.call(&Request::Command(cmd), idle)? {
            Answer::Running(g) => Ok(g),
            a => Err(format!("unexpected answer: {a:?}")),
        }
    }

    /// Ends the echo side's streams back.
    pub(crate) fn stop(&mut self) -> Result<(), String> {
        self.call(&Request::Stop, &mut || {}).map(|_| ())
    }

    /// What the echo side received.
    pub(crate) fn counters(&mut self) -> Result<Counters, String> {
        match self.call(&Request::Counters, &mut || {})? {
            Answer::Counters(c) => Ok(c),
            a => Err(format!("unexpected answer: {a:?}")),
        }
    }

    /// Tells the server we are done; it stops.
    pub(crate) fn bye(mut self) -> Result<(), String> {
        self.call(&Request::Bye, &mut || {}).map(|_| ())
    }
}

/// Runs the server side: its port (`side`) and the control connection on
/// `listen`, serving clients one after another (each with an echo thread of
/// its own on the same port) until the process is stopped, or only the first
/// one when `once`. A client that fails, or that asks for a link this server
/// does not run, is reported on stderr and the next one is served; with
/// `once`, its error is the result.
pub fn serve(
    hugepages: HugepageMode,
    mtu: u16,
    side: &SideSpec,
    listen: &str,
    once: bool,
) -> Result<(), String> {
    let (eal, pool) = start_eal(hugepages, mtu)?;
    let link = Link::side(&eal, &pool, mtu, side, true)?;
    let listener = TcpListener::bind(listen)
        .map_err(|e| format!("cannot listen on {listen}: {e} (choose another with --listen)"))?;
    eprintln!(
        "emx-bench: serving {}, control on {listen}{}",
        link.name,
        if once {
            ", for one client"
        } else {
            ", for clients one after another until stopped"
        }
    );
    let mut n = 0u64;
    loop {
        let (stream, peer) = listener
            .accept()
            .map_err(|e| format!("cannot take a client on {listen}: {e}"))?;
        n += 1;
        eprintln!("emx-bench: client {n} ({peer}) connected");
        let r = serve_client(&eal, &pool, &link, mtu, stream);
        if once {
            return r;
        }
        match r {
            Ok(()) => eprintln!("emx-bench: client {n} ({peer}) done"),
            Err(e) => eprintln!("emx-bench: client {n} ({peer}): {e}"),
        }
    }
}

/// Serves one client on `link`: checks its hello, starts an echo thread for
/// it, obeys its requests until it says goodbye or goes away, then stops the
/// thread.
fn serve_client(
    eal: &Eal,
    pool: &Mempool,
    link: &Link,
    mtu: u16,
    stream: TcpStream,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut writer = stream;
    let mut line = String::new();
    let read =
        |reader: &mut BufReader<TcpStream>, line: &mut String| -> Result<Option<Request>, String> {
            line.clear();
            match reader.read_line(line) {
                Ok(0) => Ok(None),
                Ok(_) => serde_json::from_str(line)
                    .map(Some)
                    .map_err(|e| format!("bad request: {e}")),
                Err(e) => Err(e.to_string()),
            }
        };
    let answer = |w: &mut TcpStream, a: &Answer| -> Result<(), String> {
        let mut v = serde_json::to_vec(a).map_err(|e| e.to_string())?;
        v.push(b'\n');
        w.write_all(&v).map_err(|e| e.to_string())
    };
    let (macs, theirs, shared) = match read(&mut reader, &mut line)? {
        Some(Request::Hello {
            macs,
            mtu: theirs,
            shared,
        }) => (macs, theirs, shared),
        Some(other) => return Err(format!("the client began with {other:?}, not a hello")),
        None => return Err("the client went away before its hello".into()),
    };
    if theirs != mtu || macs.len() != 3 || shared != link.shared {
        let queues = |s: bool| {
            if s {
                "one shared queue pair"
            } else {
                "a queue pair per channel"
            }
        };
        let why = format!(
            "the client runs MTU {theirs} with {} channels on {}; this server MTU {mtu} with 3 on {} (give both the same --link and --mtu)",
            macs.len(),
            queues(shared),
            queues(link.shared),
        );
        answer(&mut writer, &Answer::Failed(why.clone()))?;
        return Err(why);
    }
    for c in &link.channels {
        c.b.port
            .wait_link(Duration::from_secs(10))
            .map_err(|e| e.to_string())?;
    }
    let b: Vec<End> = link.channels.iter().map(|c| c.b.clone()).collect();
    let (_, echo_core) = two_cores();
    let (ctl, thread) = spawn_echo(eal, pool, link, &b, &macs, echo_core)?;
    let mut thread = Some(thread);
    let ours: Vec<[u8; 6]> = b.iter().map(|e| e.port.mac()).collect();
    answer(&mut writer, &Answer::Hello { macs: ours })?;
    let hz = dpdk_ffi::tsc_hz(eal) as f64;
    let result = loop {
        let req = match read(&mut reader, &mut line) {
            Ok(Some(r)) => r,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let a = match req {
            Request::Command(cmd) => {
                let gen = ctl.switch(cmd);
                match await_switch(&ctl, gen, &mut thread, &mut || {}) {
                    Ok(()) => Answer::Running(gen),
                    Err(e) => Answer::Failed(e),
                }
            }
            Request::Stop => {
                ctl.stop();
                Answer::Done
            }
            Request::Counters => Answer::Counters(ctl.counters(hz)),
            Request::Bye => {
                let _ = answer(&mut writer, &Answer::Done);
                break Ok(());
            }
            Request::Hello { .. } => Answer::Failed("hello twice".into()),
        };
        if let Err(e) = answer(&mut writer, &a) {
            break Err(e);
        }
    };
    ctl.switch(Cmd::Stop);
    let echo = match thread {
        Some(t) => t.join().map_err(|_| "the echo thread panicked")?,
        // Failed earlier, and said so to the client.
        None => Ok(()),
    };
    result.and(echo)
}
