//! Launch geometry shared by the wrappers.
//!
//! Every 1-D kernel runs [`BLOCK`] threads per block with a grid-stride loop,
//! so the grid may be smaller than `n / BLOCK`; it is capped to keep very
//! large launches from creating millions of blocks for no gain.

use cudarc::driver::LaunchConfig;

/// Threads per block; must equal `SG_BLOCK` in `kernels/common.cuh` (a unit
/// test checks).
pub const BLOCK: u32 = 256;

/// Most blocks an elementwise launch uses: 132 SMs x 2048 threads / 256 x 16
/// waves is about 135k; 65536 keeps every wave full on an H200 and costs
/// nothing on smaller GPUs.
pub const MAX_ELEMENTWISE_BLOCKS: u32 = 65_536;

/// Blocks for `n` elements: enough to cover them, at least one, at most `cap`.
pub fn blocks(n: u32, cap: u32) -> u32 {
    n.div_ceil(BLOCK).clamp(1, cap.max(1))
}

/// A 1-D launch of `blocks` blocks of [`BLOCK`] threads.
pub fn grid(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_counts() {
        assert_eq!(blocks(0, 100), 1);
        assert_eq!(blocks(1, 100), 1);
        assert_eq!(blocks(256, 100), 1);
        assert_eq!(blocks(257, 100), 2);
        assert_eq!(blocks(u32::MAX, 1024), 1024);
        assert_eq!(blocks(10, 0), 1);
        let cfg = grid(3);
        assert_eq!((cfg.grid_dim, cfg.block_dim), ((3, 1, 1), (BLOCK, 1, 1)));
    }
}
