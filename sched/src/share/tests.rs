//! Tests of the share model and its placement rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use super::*;

const GIB: u64 = 1024;

mod wide;

fn node(name: &str, gpus: usize, memory_gib: u64) -> ShareNode {
    ShareNode {
        name: name.into(),
        free_cpu_milli: 64_000,
        free_memory_mib: 256 * GIB,
        gpus: (0..gpus)
            .map(|_| ShareGpu::new("A100", memory_gib * GIB))
            .collect(),
    }
}

fn share(milli: u32) -> ShareRequest {
    ShareRequest {
        cpu_milli: 1000,
        memory_mib: GIB,
        gpu: GpuAsk::Share {
            milli,
            memory_mb: 0,
        },
        models: Vec::new(),
    }
}

fn whole(count: u32) -> ShareRequest {
    ShareRequest {
        gpu: GpuAsk::Whole { count },
        ..share(0)
    }
}

fn book(
    nodes: &mut [ShareNode],
    req: &ShareRequest,
    policy: SharePolicy,
    mix: &ShapeMix,
) -> Option<Placement> {
    let p = place(nodes, req, policy, mix, &ShareTuning::default())?;
    nodes[p.node].take(req, &p.gpus).expect("a placement fits");
    Some(p)
}

/// Books `req` on GPU `g` of `n` with the amounts the model gives it there.
fn take_on(n: &mut ShareNode, req: &ShareRequest, g: usize) {
    let (milli, memory) = n.gpus[g].fits(&req.gpu).expect("fits");
    n.take(req, &[(g, milli, memory)]).expect("takes");
}

#[test]
fn fields_validate_fraction_steps_and_memory() {
    assert_eq!(
        GpuAsk::from_fields(Some(0.25), Some(10.0)).unwrap(),
        GpuAsk::Share {
            milli: 250,
            memory_mb: 10 * GIB
        }
    );
    assert_eq!(
        GpuAsk::from_fields(Some(1.0), None).unwrap(),
        GpuAsk::Whole { count: 1 }
    );
    assert_eq!(GpuAsk::from_fields(None, None).unwrap(), GpuAsk::None);
    assert_eq!(
        GpuAsk::from_fields(None, Some(20.0)).unwrap(),
        GpuAsk::Share {
            milli: 0,
            memory_mb: 20 * GIB
        }
    );
    assert_eq!(
        GpuAsk::from_fields(Some(0.3), None).unwrap(),
        GpuAsk::Share {
            milli: 300,
            memory_mb: 0
        }
    );
    assert!(matches!(
        GpuAsk::from_fields(Some(0.33), None),
        Err(ShareError::FractionStep(_))
    ));
    assert!(matches!(
        GpuAsk::from_fields(Some(0.0), None),
        Err(ShareError::FractionRange(_))
    ));
    assert!(matches!(
        GpuAsk::from_fields(Some(1.05), None),
        Err(ShareError::FractionRange(_))
    ));
    assert!(matches!(
        GpuAsk::from_fields(None, Some(-1.0)),
        Err(ShareError::Memory(_))
    ));
}

#[test]
fn a_memory_only_share_takes_the_compute_its_memory_is_of_the_gpu() {
    let gpu = ShareGpu::new("A100", 80 * GIB);
    let ask = GpuAsk::from_fields(None, Some(20.0)).unwrap();
    assert_eq!(gpu.fits(&ask), Some((250, 20 * GIB)));
    let ask = GpuAsk::from_fields(Some(0.5), None).unwrap();
    assert_eq!(gpu.fits(&ask), Some((500, 40 * GIB)));
    let too_big = GpuAsk::from_fields(Some(0.1), Some(90.0)).unwrap();
    assert_eq!(gpu.fits(&too_big), None);
}

#[test]
fn two_halves_share_one_gpu_and_a_third_waits() {
    let mut nodes = vec![node("n0", 1, 40)];
    let mix = ShapeMix::new(10);
    for policy in SharePolicy::ALL {
        let mut nodes = nodes.clone();
        let a = book(&mut nodes, &share(500), policy, &mix).unwrap();
        let b = book(&mut nodes, &share(500), policy, &mix).unwrap();
        assert_eq!((a.gpus[0].0, b.gpus[0].0), (0, 0), "{policy:?}");
        assert_eq!(
            book(&mut nodes, &share(500), policy, &mix),
            None,
            "{policy:?}"
        );
        assert_eq!(nodes[0].gpus[0].free_milli, 0);
    }
    book(&mut nodes, &share(500), SharePolicy::Commons, &mix).unwrap();
    assert_eq!(
        book(&mut nodes, &whole(1), SharePolicy::Commons, &mix),
        None
    );
}

#[test]
fn take_refuses_what_does_not_fit_and_changes_nothing() {
    let mut n = node("n0", 2, 16);
    take_on(&mut n, &share(800), 0);
    let before = n.clone();
    assert!(
        n.take(&share(300), &[(0, 300, 4 * GIB)]).is_err(),
        "over the share"
    );
    assert!(
        n.take(&share(100), &[(1, 100, 1)]).is_err(),
        "other amounts than the model's"
    );
    assert!(
        n.take(&whole(1), &[(0, FULL_MILLI, 16 * GIB)]).is_err(),
        "a whole GPU on a shared one"
    );
    assert!(
        n.take(&whole(2), &[(1, FULL_MILLI, 16 * GIB)]).is_err(),
        "too few GPUs"
    );
    assert!(
        n.take(&share(300), &[(5, 300, 4 * GIB)]).is_err(),
        "no such GPU"
    );
    assert_eq!(n, before);
}

#[test]
fn best_fit_packs_onto_the_fullest_gpu() {
    let mut nodes = vec![node("n0", 2, 16), node("n1", 2, 16)];
    let mix = ShapeMix::new(10);
    book(&mut nodes, &share(600), SharePolicy::BestFit, &mix).unwrap();
    let p = book(&mut nodes, &share(300), SharePolicy::BestFit, &mix).unwrap();
    assert_eq!((p.node, p.gpus[0].0), (0, 0));
}

#[test]
fn fgd_keeps_room_for_the_shapes_that_come() {
    // Half-GPU tasks are the mix. One GPU has 0.6 free, the other 0.3 free: a 0.3 task
    // on the 0.6 GPU leaves 0.3, which no half task can use; best-fit does just that
    // when the 0.3 GPU sits on a node with more free share.
    let mut mix = ShapeMix::new(100);
    for _ in 0..10 {
        mix.observe(&share(500));
    }
    mix.observe(&share(300));
    let mut a = node("a", 1, 16);
    take_on(&mut a, &share(400), 0);
    let mut b = node("b", 2, 16);
    take_on(&mut b, &share(700), 0);
    take_on(&mut b, &share(500), 1);
    let nodes = vec![a, b];
    let t = ShareTuning::default();
    let fgd = place(&nodes, &share(300), SharePolicy::Fgd, &mix, &t).unwrap();
    assert_eq!((fgd.node, fgd.gpus[0].0), (1, 0), "fgd fills the 0.3 hole");
    let bf = place(&nodes, &share(300), SharePolicy::BestFit, &mix, &t).unwrap();
    assert_eq!(
        bf.node, 0,
        "best-fit takes the node with least free share left"
    );
}

#[test]
fn models_and_cpu_limit_where_a_request_goes() {
    let mut nodes = vec![node("n0", 1, 16), node("n1", 1, 16)];
    nodes[1].gpus[0].model = "T4".into();
    nodes[0].free_cpu_milli = 500;
    let mut req = share(500);
    req.models = vec!["T4".into()];
    let p = place(
        &nodes,
        &req,
        SharePolicy::Commons,
        &ShapeMix::new(4),
        &ShareTuning::default(),
    );
    assert_eq!(p.map(|p| p.node), Some(1));
    req.models = vec!["A100".into()];
    let p = place(
        &nodes,
        &req,
        SharePolicy::Commons,
        &ShapeMix::new(4),
        &ShareTuning::default(),
    );
    assert_eq!(p, None, "the A100 node has too little CPU");
    let cpu_only = ShareRequest {
        gpu: GpuAsk::None,
        ..share(0)
    };
    let p = place(
        &nodes,
        &cpu_only,
        SharePolicy::Fgd,
        &ShapeMix::new(4),
        &ShareTuning::default(),
    );
    assert_eq!(
        p,
        Some(Placement {
            node: 1,
            gpus: Vec::new()
        })
    );
}

#[test]
fn the_mix_forgets_beyond_its_window() {
    let mut mix = ShapeMix::new(3);
    mix.observe(&whole(1));
    for _ in 0..3 {
        mix.observe(&share(500));
    }
    mix.observe(&ShareRequest {
        gpu: GpuAsk::None,
        ..share(0)
    });
    assert_eq!(mix.len(), 3);
    assert_eq!(mix.classes(8), vec![(share(500), 1.0)]);
}

#[test]
fn the_blended_mix_remembers_rare_shapes_beyond_its_window() {
    let mut mix = ShapeMix::new(3);
    mix.observe(&whole(8));
    for _ in 0..3 {
        mix.observe(&share(500));
    }
    assert_eq!(mix.blended(8, 0.0), mix.classes(8));
    let blended = mix.blended(8, 0.5);
    assert_eq!(blended.len(), 2, "{blended:?}");
    assert_eq!(blended[0].0, share(500));
    assert!((blended[0].1 - 0.875).abs() < 1e-9, "{blended:?}");
    assert_eq!(blended[1].0, whole(8));
    assert!((blended[1].1 - 0.125).abs() < 1e-9, "{blended:?}");
}

#[test]
fn waiting_reasons_read_as_sentences() {
    let ask = GpuAsk::from_fields(Some(0.5), Some(20.0)).unwrap();
    assert_eq!(
        waiting_reason(&ask),
        "waiting for 0.5 of a GPU with 20 GB free"
    );
    let ask = GpuAsk::from_fields(Some(0.25), None).unwrap();
    assert_eq!(waiting_reason(&ask), "waiting for 0.25 of a GPU");
    let ask = GpuAsk::from_fields(None, Some(10.0)).unwrap();
    assert_eq!(
        waiting_reason(&ask),
        "waiting for a share of a GPU with 10 GB free"
    );
    assert_eq!(
        waiting_reason(&GpuAsk::Whole { count: 2 }),
        "waiting for 2 whole free GPUs on one server"
    );
}

fn arb_request() -> impl Strategy<Value = ShareRequest> {
    let gpu = prop_oneof![
        Just(GpuAsk::None),
        (1u32..20, 0u64..3).prop_map(|(s, m)| GpuAsk::Share {
            milli: s * STEP_MILLI,
            memory_mb: m * 6 * GIB
        }),
        (0u64..3).prop_map(|m| GpuAsk::Share {
            milli: 0,
            memory_mb: (m + 1) * 5 * GIB
        }),
        (1u32..5).prop_map(|count| GpuAsk::Whole { count }),
    ];
    (0u64..20_000, 0u64..64, gpu, any::<bool>()).prop_map(|(cpu, mem, gpu, t4)| ShareRequest {
        cpu_milli: cpu,
        memory_mib: mem * GIB,
        gpu,
        models: if t4 { vec!["T4".into()] } else { Vec::new() },
    })
}

fn arb_cluster() -> impl Strategy<Value = Vec<ShareNode>> {
    prop::collection::vec((1usize..9, any::<bool>(), 1u64..5), 1..5).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (gpus, t4, m))| {
                let mut n = node(&format!("n{i}"), gpus, m * 8);
                for g in &mut n.gpus {
                    g.model = if t4 { "T4" } else { "A100" }.into();
                }
                n
            })
            .collect()
    })
}

proptest! {
    /// Whatever arrives, under every rule: no GPU's share or memory and no node's CPU
    /// or memory is ever over-allocated, whole GPUs only land on empty GPUs, and what
    /// every GPU gave out adds up to what the placed requests took.
    #[test]
    fn placement_never_over_allocates(
        cluster in arb_cluster(),
        reqs in prop::collection::vec(arb_request(), 1..60),
        policy in prop::sample::select(SharePolicy::ALL.to_vec()),
    ) {
        let mut nodes = cluster.clone();
        let mut mix = ShapeMix::new(16);
        let mut taken = vec![vec![(0u32, 0u64); 8]; nodes.len()];
        for req in &reqs {
            mix.observe(req);
            let Some(p) = place(&nodes, req, policy, &mix, &ShareTuning::default()) else { continue };
            prop_assert_eq!(p.gpus.len() as u32, req.gpu.gpu_count());
            if matches!(req.gpu, GpuAsk::Whole { .. }) {
                for &(g, _, _) in &p.gpus {
                    prop_assert!(nodes[p.node].gpus[g].is_empty(), "whole GPU on a used GPU");
                }
            }
            nodes[p.node].take(req, &p.gpus).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for &(g, milli, memory) in &p.gpus {
                taken[p.node][g].0 += milli;
                taken[p.node][g].1 += memory;
            }
        }
        for (n, node) in nodes.iter().enumerate() {
            prop_assert!(node.free_cpu_milli <= cluster[n].free_cpu_milli);
            for (g, gpu) in node.gpus.iter().enumerate() {
                prop_assert_eq!(taken[n][g].0 + gpu.free_milli, FULL_MILLI);
                prop_assert_eq!(taken[n][g].1 + gpu.free_memory_mb, gpu.memory_mb);
            }
        }
    }

    /// A request placed and then released leaves the node as it was, and a request that
    /// `place` refuses fits on no node by hand either.
    #[test]
    fn release_undoes_take_and_refusals_are_true(
        cluster in arb_cluster(),
        reqs in prop::collection::vec(arb_request(), 1..30),
    ) {
        let mut nodes = cluster;
        let mix = ShapeMix::new(4);
        for req in &reqs {
            match place(&nodes, req, SharePolicy::BestFit, &mix, &ShareTuning::default()) {
                Some(p) => {
                    let before = nodes[p.node].clone();
                    nodes[p.node].take(req, &p.gpus).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let mut undone = nodes[p.node].clone();
                    undone.release(req, &p.gpus);
                    prop_assert_eq!(undone, before);
                }
                None => {
                    for n in &nodes {
                        let fits = n.hosts(req) && match req.gpu {
                            GpuAsk::None => true,
                            GpuAsk::Share { .. } => n.gpus.iter().any(|g| req.model_ok(g) && g.fits(&req.gpu).is_some()),
                            GpuAsk::Whole { count } => n.gpus.iter().filter(|g| req.model_ok(g) && g.is_empty()).count() >= count as usize,
                        };
                        prop_assert!(!fits, "refused but fits on {}", n.name);
                    }
                }
            }
        }
    }
}
