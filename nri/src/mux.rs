//! NRI's connection multiplexer: one unix-socket connection to the engine (the trunk) carries
//! two ttRPC connections, the engine calling the plugin's `Plugin` service on connection 1 and
//! the plugin calling the engine's `Runtime` service on connection 2. A frame on the trunk is
//! an 8-byte header (connection id, payload length; both big-endian u32) and the payload
//! (containerd/nri `pkg/net/multiplex`).
//!
//! Written here because no maintained Rust crate speaks this framing: the `ttrpc` crate serves
//! and calls over plain file descriptors, so each logical connection is a local socket whose far
//! end this module pumps to and from the trunk.
//!
//! Each ttRPC message is sent as two frames, its 10-byte header then its payload: the engine's
//! ttRPC reads through a 4 KiB buffer and a frame it cannot take whole is an error there, while
//! a header frame always fits and a payload frame is read straight into a buffer of its size.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// The engine calls the plugin on this connection.
pub const PLUGIN_SERVICE_CONN: u32 = 1;
/// The plugin calls the engine on this connection.
pub const RUNTIME_SERVICE_CONN: u32 = 2;

/// ttRPC's message header: payload length (big-endian u32), stream id, type, flags.
const TTRPC_HEADER_LEN: usize = 10;
/// ttRPC's largest message payload (4 MiB); a longer one is a broken stream.
const TTRPC_MAX_PAYLOAD: usize = 4 << 20;

/// The trunk and its pumps. Dropping it does not stop them; [`Mux::wait`] returns when the
/// engine closes the trunk (or a pump fails), after which the local ends are shut down.
pub struct Mux {
    reader: JoinHandle<io::Result<()>>,
}

/// Starts pumping: frames for `conns[i].0` go to `conns[i].1`, and messages read from
/// `conns[i].1` go to the engine as frames for `conns[i].0`.
pub fn start(trunk: UnixStream, conns: Vec<(u32, UnixStream)>) -> io::Result<Mux> {
    let writer = Arc::new(Mutex::new(trunk.try_clone()?));
    let mut routes = Vec::new();
    for (id, local) in conns {
        let from_local = local.try_clone()?;
        let writer = Arc::clone(&writer);
        std::thread::Builder::new()
            .name(format!("nri-mux-out-{id}"))
            .spawn(move || {
                let result = pump_out(id, from_local, &writer);
                // The engine sees the plugin go: the reader then ends on EOF.
                if let Ok(w) = writer.lock() {
                    let _ = w.shutdown(std::net::Shutdown::Both);
                }
                result
            })?;
        routes.push((id, local));
    }
    let reader = std::thread::Builder::new()
        .name("nri-mux-in".into())
        .spawn(move || {
            let result = pump_in(trunk, &routes);
            for (_, local) in &routes {
                let _ = local.shutdown(std::net::Shutdown::Both);
            }
            result
        })?;
    Ok(Mux { reader })
}

impl Mux {
    /// Blocks until the trunk is gone; `Ok` when the engine closed it.
    pub fn wait(self) -> io::Result<()> {
        self.reader
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the NRI multiplexer's reader panicked")))
    }
}

/// Trunk to local ends. Frames for a connection nobody opened are dropped, as the engine's
/// multiplexer does.
fn pump_in(mut trunk: UnixStream, routes: &[(u32, UnixStream)]) -> io::Result<()> {
    let mut header = [0u8; 8];
    let mut payload = Vec::new();
    loop {
        match trunk.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let id = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > TTRPC_HEADER_LEN + TTRPC_MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "NRI frame of {len} bytes for connection {id}: larger than any ttRPC message"
                ),
            ));
        }
        payload.resize(len, 0);
        trunk.read_exact(&mut payload)?;
        if let Some((_, local)) = routes.iter().find(|(c, _)| *c == id) {
            (&*local).write_all(&payload)?;
        }
    }
}

/// A local end to the trunk, one ttRPC message (two frames) at a time.
fn pump_out(id: u32, mut local: UnixStream, trunk: &Mutex<UnixStream>) -> io::Result<()> {
    let mut header = [0u8; TTRPC_HEADER_LEN];
    let mut payload = Vec::new();
    loop {
        match local.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > TTRPC_MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ttRPC message of {len} bytes on NRI connection {id}"),
            ));
        }
        payload.resize(len, 0);
        local.read_exact(&mut payload)?;
        let mut out = Vec::with_capacity(16 + TTRPC_HEADER_LEN + len);
        frame(&mut out, id, &header);
        if len > 0 {
            frame(&mut out, id, &payload);
        }
        let mut w = trunk
            .lock()
            .map_err(|_| io::Error::other("the NRI trunk's lock is poisoned"))?;
        w.write_all(&out)?;
    }
}

fn frame(out: &mut Vec<u8>, id: u32, data: &[u8]) {
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two logical connections over one trunk: each message arrives on its own connection,
    /// whole, and what a local end writes reaches the trunk as header and payload frames.
    #[test]
    fn frames_are_routed_and_split() {
        let (engine, trunk) = UnixStream::pair().unwrap();
        let (one_far, one_near) = UnixStream::pair().unwrap();
        let (two_far, two_near) = UnixStream::pair().unwrap();
        let mux = start(trunk, vec![(1, one_near), (2, two_near)]).unwrap();
        let mut engine_w = engine.try_clone().unwrap();
        let mut msg = Vec::new();
        frame(&mut msg, 2, b"to-two");
        frame(&mut msg, 9, b"nobody");
        frame(&mut msg, 1, b"to-one");
        engine_w.write_all(&msg).unwrap();
        let mut buf = [0u8; 6];
        (&one_far).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"to-one");
        (&two_far).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"to-two");
        // A ttRPC message of 3 payload bytes written by the plugin's side of connection 2.
        let mut ttrpc = vec![0, 0, 0, 3, 0, 0, 0, 1, 1, 0];
        ttrpc.extend_from_slice(b"abc");
        (&two_far).write_all(&ttrpc).unwrap();
        let mut got = vec![0u8; 8 + 10 + 8 + 3];
        (&engine).read_exact(&mut got).unwrap();
        let mut want = Vec::new();
        frame(&mut want, 2, &ttrpc[..10]);
        frame(&mut want, 2, b"abc");
        assert_eq!(got, want);
        drop(engine_w);
        engine.shutdown(std::net::Shutdown::Both).unwrap();
        mux.wait().unwrap();
        // The local ends see the engine go.
        assert_eq!((&one_far).read(&mut buf).unwrap(), 0);
    }
}
