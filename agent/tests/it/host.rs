//! The host id against the real engine: an agent with a new identity on the same host
//! (its state dir was lost and enrolled again) stops and removes the containers of the
//! earlier identity, and touches nobody else's: not its own, not another host's on the
//! same engine.

use super::{new_agent_id, spec};
use commons_agent::host;
use commons_agent::runtime::{CheckpointMount, ContainerRuntime, ContainerStatus, DockerRuntime};
use std::path::Path;

fn new_host_id() -> String {
    format!("testhost{:016x}", rand::random::<u64>())
}

async fn runtime(host_id: &str) -> DockerRuntime {
    DockerRuntime::connect(new_agent_id())
        .await
        .expect("the Docker Engine must run")
        .with_host_id(host_id.to_string())
}

async fn sleeper(rt: &DockerRuntime, job: i64, dir: &Path) -> String {
    let mount = CheckpointMount {
        host_dir: dir.join(format!("checkpoint-{job}")),
        resumed: false,
        outputs_dir: dir.join(format!("outputs-{job}")),
        inputs_dir: None,
        datasets: Vec::new(),
        share: None,
    };
    std::fs::create_dir_all(&mount.host_dir).unwrap();
    std::fs::create_dir_all(&mount.outputs_dir).unwrap();
    rt.create_and_start(job, 1, &spec("sleep 300", 600), &[], &mount)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_identity_stops_the_containers_of_an_earlier_one_on_its_host_only() {
    let dir = tempfile::tempdir().unwrap();
    let this_host = new_host_id();
    let earlier = runtime(&this_host).await;
    let neighbour = runtime(&new_host_id()).await;
    let now = runtime(&this_host).await;
    let old = sleeper(&earlier, 31, dir.path()).await;
    let other = sleeper(&neighbour, 32, dir.path()).await;
    let mine = sleeper(&now, 33, dir.path()).await;

    let found = host::stop_earlier_identities(&now).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, old);
    assert_eq!(found[0].agent, earlier.agent_id());
    assert_eq!((found[0].job, found[0].attempt), (Some(31), Some(1)));
    assert!(found[0].running);
    assert_eq!(
        earlier.inspect(&old).await.unwrap(),
        ContainerStatus::Gone,
        "stopped and removed"
    );
    assert_eq!(
        neighbour.inspect(&other).await.unwrap(),
        ContainerStatus::Running,
        "another host's container on the same engine is not touched"
    );
    assert_eq!(
        now.inspect(&mine).await.unwrap(),
        ContainerStatus::Running,
        "its own container is not touched"
    );
    assert!(
        host::stop_earlier_identities(&now)
            .await
            .unwrap()
            .is_empty(),
        "nothing left the next time"
    );
    neighbour.remove(&other).await.unwrap();
    now.remove(&mine).await.unwrap();
}
