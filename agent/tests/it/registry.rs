//! A real container registry for the tests (Debian's `docker-registry`, the CNCF
//! Distribution server), on a free loopback port with its storage in a temporary
//! directory. Docker treats registries on 127.0.0.0/8 as insecure by default, so it
//! pushes to and pulls from it over plain HTTP. Stopped when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    /// `127.0.0.1:PORT`, the registry part of image names.
    pub host: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let host = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the registry server is needed (apt-get install docker-registry)");
        let reg = Registry {
            host,
            child,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&reg.host).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {} within 30 s",
                reg.host
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        reg
    }

    /// Pushes local image `tag` (named `{host}/...`); answers the registry digest the
    /// push printed (`sha256:...`), which a pull by digest names.
    pub fn push(&self, tag: &str) -> String {
        let out = Command::new("docker").args(["push", tag]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "docker push {tag}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text.split_whitespace()
            .skip_while(|w| *w != "digest:")
            .nth(1)
            .unwrap_or_else(|| panic!("no digest in the push's output: {text}"))
            .to_string()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
