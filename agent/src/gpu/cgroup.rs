//! Which container a process is in, from the text of its `/proc/PID/cgroup`.
//!
//! The agent tells its own GPU processes from the owner's by the container a process
//! sits in: the Docker Engine puts each container's processes in a control group named
//! after the container's full id, in every layout a lab server may have:
//!
//! - cgroup v1, cgroupfs driver: `12:memory:/docker/<id>` (one line per hierarchy);
//! - cgroup v2, cgroupfs driver: `0::/docker/<id>`;
//! - systemd driver (v1 or v2): `0::/system.slice/docker-<id>.scope`;
//! - other runtimes the same way: `libpod-<id>.scope` (Podman), `cri-containerd-<id>.scope`,
//!   `crio-<id>.scope`, and Kubernetes' `/kubepods/.../<id>`.
//!
//! A process in a systemd scope or service of its own (`session-3.scope` of an SSH login,
//! `run-r….scope` of `systemd-run`, `user@1000.service/...`) is in no container.
//!
//! Invariant: only a full 64-hex-digit id counts as a container, so a unit that merely
//! has a dash in its name is never mistaken for one.

/// The id of the (outermost) container the process is in, or `None` when it is in none.
pub fn container_id(cgroup_text: &str) -> Option<String> {
    cgroup_text.lines().find_map(|line| {
        // "hierarchy-ID:controller-list:path"; the path may itself hold colons.
        let path = line.splitn(3, ':').nth(2)?;
        path.split('/').find_map(segment_id)
    })
}

/// Runtimes whose scopes are named `<prefix>-<id>.scope`.
const SCOPE_PREFIXES: [&str; 4] = ["docker-", "libpod-", "cri-containerd-", "crio-"];

fn segment_id(segment: &str) -> Option<String> {
    let id = match segment.strip_suffix(".scope") {
        Some(unit) => SCOPE_PREFIXES.iter().find_map(|p| unit.strip_prefix(p))?,
        None => segment,
    };
    is_full_id(id).then(|| id.to_ascii_lowercase())
}

fn is_full_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e8c1d2b7a9e0f5c6d8a1b2c3d4e5f60718293a4b5c6d7e8f9012345678abc";

    #[test]
    fn every_layout_names_the_container_or_none() {
        let v1 = format!(
            "12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        let cases: Vec<(&str, String, Option<&str>)> = vec![
            ("cgroup v1, cgroupfs driver", v1, Some(ID)),
            (
                "cgroup v2, cgroupfs driver",
                format!("0::/docker/{ID}\n"),
                Some(ID),
            ),
            (
                "cgroup v2, systemd driver",
                format!("0::/system.slice/docker-{ID}.scope\n"),
                Some(ID),
            ),
            (
                "cgroup v1, systemd driver",
                format!(
                    "10:devices:/system.slice/docker-{ID}.scope\n1:name=systemd:/system.slice/docker-{ID}.scope\n"
                ),
                Some(ID),
            ),
            (
                "a nested cgroup inside the container",
                format!("0::/system.slice/docker-{ID}.scope/init.scope\n"),
                Some(ID),
            ),
            (
                "podman",
                format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
                Some(ID),
            ),
            (
                "kubernetes with containerd",
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b.slice/cri-containerd-{ID}.scope\n"
                ),
                Some(ID),
            ),
            (
                "an SSH login session",
                "0::/user.slice/user-1000.slice/session-3.scope\n".into(),
                None,
            ),
            (
                "systemd-run",
                "0::/system.slice/run-r6b1f0e6d3c2a4b5e9f8d7c6b5a4e3f2d.scope\n".into(),
                None,
            ),
            (
                "a user's service manager",
                "0::/user.slice/user-1000.slice/user@1000.service/app.slice/jupyter.service\n"
                    .into(),
                None,
            ),
            (
                "a system service",
                "0::/system.slice/slurmd.service\n".into(),
                None,
            ),
            (
                "a short id is no container",
                "0::/system.slice/docker-3f4e8c1d.scope\n".into(),
                None,
            ),
            ("empty (a kernel thread)", String::new(), None),
        ];
        for (what, text, want) in cases {
            assert_eq!(container_id(&text).as_deref(), want, "{what}");
        }
    }
}
