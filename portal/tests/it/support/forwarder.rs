//! A TCP forwarder for the cluster harness: the development login keeps the portal on
//! loopback, and agents on virtual hosts reach it through this.

/// Passes TCP connections made to any address of this machine on to the portal's
/// loopback listener, byte for byte both ways: agents on virtual hosts reach a portal
/// that keeps its development login on loopback (it refuses it anywhere else).
pub struct Forwarder {
    pub port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Forwarder {
    pub fn start(to: u16) -> Forwarder {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(outer) = conn else { continue };
                std::thread::spawn(move || {
                    if let Ok(inner) = std::net::TcpStream::connect(("127.0.0.1", to)) {
                        splice(outer, inner);
                    }
                });
            }
        });
        Forwarder { port, stop }
    }
}

/// Copies `a` to `b` and `b` to `a` until both ends have closed.
fn splice(a: std::net::TcpStream, b: std::net::TcpStream) {
    use std::net::Shutdown;
    let _ = (a.set_nodelay(true), b.set_nodelay(true));
    let (Ok(mut a2), Ok(mut b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let there = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a2, &mut b2);
        let _ = b2.shutdown(Shutdown::Write);
    });
    let (mut a, mut b) = (a, b);
    let _ = std::io::copy(&mut b, &mut a);
    let _ = a.shutdown(Shutdown::Write);
    let _ = there.join();
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}
