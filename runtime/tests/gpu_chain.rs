//! Launch overhead: a chain of 1000 tiny kernels, eager vs one graph replay.

mod gpu_common;

use gpu_common::{gpu, median};
use stepgraph::graph::Backend;
use stepgraph::kernels;

const CHAIN: usize = 1000;
const REPS: usize = 7;

#[test]
#[ignore = "needs a CUDA GPU"]
fn chain_of_1000_kernels_eager_vs_graph() {
    let gpu = gpu();
    let mut x = gpu.to_device(&[0.0f32]).unwrap();
    let chain = |x: &mut _| -> Result<(), stepgraph::device::GpuError> {
        for _ in 0..CHAIN {
            kernels::add_one(&gpu, x)?;
        }
        Ok(())
    };

    chain(&mut x).unwrap(); // warm-up
    let mut eager = Vec::new();
    let mut eager_host = Vec::new();
    for _ in 0..REPS {
        let t = std::time::Instant::now();
        let ((), ms) = gpu.time_ms(|| chain(&mut x)).unwrap();
        eager_host.push(u16::try_from(t.elapsed().as_micros().min(60_000)).unwrap_or(u16::MAX));
        eager.push(ms);
    }

    gpu.begin_capture().unwrap();
    gpu.enter_op(Some("add_one_chain"));
    let body = chain(&mut x);
    gpu.enter_op(None);
    let exec = gpu.end_capture().unwrap();
    body.unwrap();
    assert_eq!(exec.node_count().unwrap(), CHAIN);
    gpu.upload(&exec).unwrap();
    gpu.launch(&exec).unwrap(); // warm-up
    let mut graph = Vec::new();
    for _ in 0..REPS {
        let ((), ms) = gpu.time_ms(|| gpu.launch(&exec)).unwrap();
        graph.push(ms);
    }

    let total = (1 + REPS + 1 + REPS) * CHAIN;
    let got = gpu.to_host(&x).unwrap()[0];
    assert_eq!(
        got,
        f32::from(u16::try_from(total).unwrap()),
        "every launch ran exactly once"
    );

    let (e, g) = (median(eager), median(graph));
    let per = |ms: f32| ms * 1000.0 / f32::from(u16::try_from(CHAIN).unwrap());
    let host_us = {
        let mut v = eager_host;
        v.sort_unstable();
        v[v.len() / 2]
    };
    println!(
        "{CHAIN} add_one kernels, median of {REPS}: eager {e:.3} ms ({:.2} us/kernel, host submit {host_us} us), graph replay {g:.3} ms ({:.2} us/kernel), speed-up {:.1}x",
        per(e),
        per(g),
        e / g
    );
}
