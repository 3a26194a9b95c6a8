//! A moto S3 server for the checkpoint tests: the S3-compatible store, for real.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A moto S3 server on a free loopback port, stopped on drop.
pub(crate) struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    pub async fn start() -> Moto {
        let bin = std::env::var("COMMONS_TEST_MOTO").unwrap_or_else(|_| {
            format!(
                "{}/../target/test-venv/bin/moto_server",
                env!("CARGO_MANIFEST_DIR")
            )
        });
        assert!(
            std::path::Path::new(&bin).exists(),
            "the S3 tests need moto's server at {bin}: install it with\n  \
             python3 -m venv target/test-venv && target/test-venv/bin/pip install \"moto[server]\"\n\
             (or set COMMONS_TEST_MOTO to a moto_server)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not start on {port}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // moto takes unsigned requests: make the bucket.
        let r = reqwest::Client::new()
            .put(format!("{}/checkpoints", moto.endpoint))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "create bucket: {}", r.status());
        moto
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
